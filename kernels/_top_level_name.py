"""The name `kernels` at the top level belongs to Hugging Face's package on PyPI (transformers imports it).

This folder is `camrender.kernels`. It is also reachable as a bare `kernels` when the checkout's root is on
`sys.path` (`python3 -m pytest` or `python3 -m camrender` run from it, `PYTHONPATH=.`); an import under that
name goes to the installed package where there is one.
"""
import importlib.machinery
import importlib.util
import os
import sys

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def handed_over(name: str) -> bool:
    """Whether the import of this folder as `name` was handed to the installed `kernels` package: only for the
    bare name, and only where one is installed (else the folder serves it, as it always did). The installed
    package is loaded from `sys.path` without the checkout, as `sys.modules["kernels"]` (the import system
    returns what that entry holds once the folder's `__init__` has run)."""
    if name != "kernels":
        return False
    elsewhere = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != _CHECKOUT]
    spec = importlib.machinery.PathFinder.find_spec("kernels", elsewhere)
    if spec is None:
        return False
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = module
    sys.modules.pop(__name__, None)  # this helper is no submodule of that package
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["kernels"]
        raise
    return True
