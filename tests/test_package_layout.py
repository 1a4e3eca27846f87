"""The Triton kernels import as `camrender.kernels` (folder `kernels/` of the repository), so the PyPI
package `kernels` (Hugging Face's hub kernels, used by diffusers) installs beside camrender."""
import os
import subprocess
import sys

import pytest


def pypi_kernels_site(tmp_path) -> str:
    """A folder holding the PyPI `kernels` package (.ci/run installs one; else pip installs it here)."""
    folder = os.environ.get("CAMRENDER_PYPI_KERNELS")
    if folder:
        return folder
    target = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                             "kernels"], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"the PyPI package `kernels` could not be installed here: {result.stderr.strip()[-200:]}")
    return str(target)


def test_camrender_kernels_and_the_pypi_kernels_package_import_side_by_side(tmp_path):
    site = pypi_kernels_site(tmp_path)
    code = ("import kernels, camrender.kernels as ours\n"
            "print(kernels.__file__); print(ours.__file__)\n"
            "assert callable(kernels.get_kernel) and callable(ours.delta_scan)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=site))
    assert result.returncode == 0, result.stderr
    theirs, ours = result.stdout.split()
    assert theirs.startswith(site)
    assert not ours.startswith(site) and ours.endswith(os.path.join("kernels", "__init__.py"))



def test_a_bare_import_of_kernels_from_the_checkout_gets_the_pypi_package(tmp_path):
    """`python3 -m pytest` (or `-m camrender`) run in the checkout puts its root on sys.path, where the folder
    `kernels/` is: a bare `import kernels` (transformers makes one) still gets Hugging Face's package; without
    it installed the folder answers, as before (transformers then finds no version there and leaves it alone).
    `camrender.kernels` is the folder either way."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    site = pypi_kernels_site(tmp_path)
    code = ("import kernels, camrender.kernels as ours\n"
            "from kernels import get_kernel\n"
            "print(kernels.__file__); print(ours.__file__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo,
                            env=dict(env, PYTHONPATH=site))
    assert result.returncode == 0, result.stderr
    theirs, ours = result.stdout.split()
    assert theirs.startswith(site) and ours == os.path.join(repo, "kernels", "__init__.py")

    # no such package installed: the search that hands the import over finds none
    bare = ("import importlib.machinery as machinery\n"
            "search = machinery.PathFinder.find_spec\n"
            "machinery.PathFinder.find_spec = lambda name, path=None, target=None: (\n"
            "    None if name == 'kernels' and path is not None else search(name, path, target))\n"
            "import kernels; print(kernels.__file__, hasattr(kernels, '__version__'))\n")
    result = subprocess.run([sys.executable, "-c", bare], capture_output=True, text=True, cwd=repo, env=env)
    assert result.stdout.split() == [os.path.join(repo, "kernels", "__init__.py"), "False"], result.stderr


def test_every_package_folder_is_listed_in_pyproject():
    """A subpackage missing from `[tool.setuptools] packages` is left out of a wheel (non-editable install)."""
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(init.parent.relative_to(repo).parts) for init in (repo / "camrender").rglob("__init__.py")}
    assert folders - listed == set(), "add these to pyproject.toml's packages"
    assert "camrender.kernels" in listed
