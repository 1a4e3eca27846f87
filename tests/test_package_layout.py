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


def test_every_package_folder_is_listed_in_pyproject():
    """A subpackage missing from `[tool.setuptools] packages` is left out of a wheel (non-editable install)."""
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(init.parent.relative_to(repo).parts) for init in (repo / "camrender").rglob("__init__.py")}
    assert folders - listed == set(), "add these to pyproject.toml's packages"
    assert "camrender.kernels" in listed
