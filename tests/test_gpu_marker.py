"""The `gpu` marker and the two suites (tests/conftest.py, docs/testing.md)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
GPU_FILES = ["tests/kernels/test_kernel_cases.py", "tests/kernels/test_kernels_gpu.py",
             "tests/render/test_graphs_gpu.py", "tests/model/test_lse_attention.py"]


def test_gpu_marker_is_registered(pytestconfig):
    assert any(line.startswith("gpu:") for line in pytestconfig.getini("markers"))


def test_cpu_suite_runs_kernels_in_the_interpreter():
    assert os.environ["TRITON_INTERPRET"] == "1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine `-m gpu` runs the compiled suite")
def test_dash_m_gpu_collects_every_gpu_test_and_skips_it_without_cuda():
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)
    env = dict(os.environ, PYTHONPATH=path, CAMRENDER_TEST_GPU="")
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
                           *GPU_FILES], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    summary = [line for line in report.splitlines() if re.search(r"\d+ skipped", line)][-1]  # warnings may follow
    assert "passed" not in summary and "failed" not in summary and "error" not in summary, summary
    skipped = int(re.search(r"(\d+) skipped", summary).group(1))
    assert skipped >= 30, summary  # every gpu test collected (imports are clean on a CPU)
    assert "needs a CUDA GPU" in report
