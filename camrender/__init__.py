"""camrender: render videos along camera paths with SANA-WM and fused Triton kernels."""
import importlib.abc
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"

_CHECKOUT_KERNELS = Path(__file__).resolve().parent.parent / "kernels"


class _CheckoutKernelsFinder(importlib.abc.MetaPathFinder):
    """`camrender.kernels` is the repository's top-level `kernels/` folder (pyproject.toml maps it so
    when installed). This finder, last on `sys.meta_path`, gives the same mapping to a source
    checkout that runs uninstalled (`PYTHONPATH=.`, bench scripts on a bare GPU machine)."""

    def find_spec(self, name, path=None, target=None):
        if name != "camrender.kernels":
            return None
        return importlib.util.spec_from_file_location(name, _CHECKOUT_KERNELS / "__init__.py",
                                                      submodule_search_locations=[str(_CHECKOUT_KERNELS)])


if (_CHECKOUT_KERNELS / "__init__.py").is_file():
    # A source checkout (its pyproject.toml beside the package) maps to its own kernels first, ahead of an
    # editable install of another checkout; an installed camrender (site-packages, where a `kernels`
    # folder is Hugging Face's package) keeps the installed mapping.
    if (_CHECKOUT_KERNELS.parent / "pyproject.toml").is_file():
        sys.meta_path.insert(0, _CheckoutKernelsFinder())
    else:
        sys.meta_path.append(_CheckoutKernelsFinder())


def patch_transformer(transformer, kernels: str = "fused", **kwargs):
    """Patch every block in place with one `KernelSettings` (full and segment mode); see
    `camrender.model.stage1.patch`."""
    # lazy: keeps `import camrender` (and `camrender --help`) free of torch, diffusers
    from camrender.model.stage1.patch import patch_transformer as _patch

    return _patch(transformer, kernels=kernels, **kwargs)


def __getattr__(name):
    """`camrender.CamrenderPipeline` (and `LoadSettings`, `RenderResult`): the Python API, imported on first use so
    that `import camrender` (and `camrender --help`) stays light."""
    if name in ("CamrenderPipeline", "LoadSettings", "RenderResult"):
        from camrender import api  # lazy: see the docstring

        return getattr(api, name)
    raise AttributeError(f"module 'camrender' has no attribute {name!r}")
