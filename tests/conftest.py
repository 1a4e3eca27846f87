"""Test-wide setup: run Triton kernels through the interpreter on CPU.

TRITON_INTERPRET must be set before triton is first imported, so it is set here,
at the top of the first module pytest loads.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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

# Tiny tensors run several times faster on one thread than on two shared cores.
import torch  # noqa: E402

torch.set_num_threads(1)

# Decorate every Triton kernel now, in interpreter mode: tests that set TRITON_INTERPRET=0 (the CPU
# render path as a user runs it) must not be the first to import a kernel module, or its kernels
# would be compiled for a GPU that is not there, whatever the test order.
import importlib  # noqa: E402
import pkgutil  # noqa: E402

import camrender.kernels  # noqa: E402

for _module in pkgutil.iter_modules(camrender.kernels.__path__):
    importlib.import_module(f"camrender.kernels.{_module.name}")
