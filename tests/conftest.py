"""Test-wide setup: Triton kernels run through the interpreter on CPU, or compiled on a GPU.

Two modes, decided once in `pytest_configure` (before any test module imports triton):

- CPU suite (`python3 -m pytest`): TRITON_INTERPRET=1, every kernel runs through the Triton
  interpreter; tests marked `gpu` are skipped.
- GPU suite (`python3 -m pytest -m gpu`, or CAMRENDER_TEST_GPU=1): when CUDA is present the kernels
  are compiled for it (TRITON_INTERPRET=0) and only the `gpu` tests run; without CUDA the `gpu`
  tests are skipped with the reason. See docs/testing.md.

TRITON_INTERPRET must be set before triton is first imported, so nothing here imports it at module
level (`import torch` does not import triton).
"""
import importlib
import os
import pkgutil

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# CLI renders keep encoded prompts (camrender.render.prompt_cache): in a folder of this run, never the
# user's, removed when the run ends
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

os.environ["CAMRENDER_CACHE"] = tempfile.mkdtemp(prefix="camrender-test-cache-")
atexit.register(shutil.rmtree, os.environ["CAMRENDER_CACHE"], ignore_errors=True)

# Test modules import helpers from each other's folders (`from test_render_cli import ...`): every
# test folder is importable, whichever file pytest collects first (or alone).
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

for _folder in sorted(p for p in Path(__file__).resolve().parent.iterdir() if p.is_dir() and p.name != "golden"):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

# Property tests run the same examples every time, so a red CI run is reproducible.
from hypothesis import settings  # noqa: E402

settings.register_profile("camrender", derandomize=True, deadline=None)
settings.load_profile("camrender")

GPU_ENV = "CAMRENDER_TEST_GPU"
_compiled = False  # True: kernels compiled for CUDA, the gpu tests run, the CPU tests are skipped


def gpu_requested(markexpr: str) -> bool:
    """The run asks for the GPU suite: CAMRENDER_TEST_GPU=1, or `-m gpu` (the whole expression)."""
    return os.environ.get(GPU_ENV, "") == "1" or markexpr.strip() == "gpu"


def pytest_configure(config):
    global _compiled
    import torch

    _compiled = gpu_requested(config.getoption("markexpr", "") or "") and torch.cuda.is_available()
    if _compiled:
        os.environ["TRITON_INTERPRET"] = "0"
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        # Tiny tensors run several times faster on one thread than on two shared cores.
        torch.set_num_threads(1)
    # Decorate every Triton kernel now, in the chosen mode: tests that set TRITON_INTERPRET=0 (the
    # CPU render path as a user runs it) must not be the first to import a kernel module, or its
    # kernels would be compiled for a GPU that is not there, whatever the test order.
    import camrender.kernels

    for module in pkgutil.iter_modules(camrender.kernels.__path__):
        importlib.import_module(f"camrender.kernels.{module.name}")


# Test folders above the model (the CLI, the Python API, play, the render loop, ...): their renders run on the
# PyTorch references, as on a user's CPU (no TRITON_INTERPRET), about 60x faster than the interpreter on
# the tiny model. The kernels' own tests, the model's parity tests and the golden replays (tests/kernels,
# tests/model) keep the interpreter; a test up here that needs it is marked `interpreter`.
REFERENCE_PATH_FOLDERS = frozenset({"api", "bench", "cli", "eval", "output", "parallel", "play", "render", "serve",
                                    "trajectory", "views"})


def runs_on_references(item) -> bool:
    """Whether the CPU suite runs `item` with TRITON_INTERPRET=0 (see REFERENCE_PATH_FOLDERS)."""
    folder = Path(str(item.fspath)).parent.name
    return folder in REFERENCE_PATH_FOLDERS and item.get_closest_marker("interpreter") is None


@pytest.fixture(autouse=True)
def _kernel_path(request, monkeypatch):
    """TRITON_INTERPRET=0 for the tests of `runs_on_references` (subprocesses they start inherit it)."""
    if not _compiled and runs_on_references(request.node):
        monkeypatch.setenv("TRITON_INTERPRET", "0")


def pytest_collection_modifyitems(config, items):
    if _compiled:
        cpu_only = pytest.mark.skip(reason="CPU test: run the CPU suite (Triton interpreter) without -m gpu")
        for item in items:
            if item.get_closest_marker("gpu") is None:
                item.add_marker(cpu_only)
        return
    import torch

    why = ("needs CUDA and compiled Triton kernels: run `python3 -m pytest -m gpu` on a GPU machine"
           if torch.cuda.is_available() else "needs a CUDA GPU (none here)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.skip(reason=why))
