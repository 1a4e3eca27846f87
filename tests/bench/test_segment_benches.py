"""bench/profile_segment.py's copy sites and bench_segments.py's stage-1 precision, on the CPU."""
import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_copy_sites_name_the_camrender_line_that_launched_a_copy(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import profile_segment
    from camrender.model.fp8 import quantize

    x = torch.randn(64, 32, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as profiler:
        quantize(x)  # its fp32 copy of x is an aten::copy_
    rows = profile_segment.copy_sites(profiler)
    copies = [frames for op, frames, calls, ms in rows if op == "aten::copy_" and frames]
    assert copies and copies[0][0].startswith("model/fp8.py(") and copies[0][0].endswith("quantize")
    sys.modules.pop("profile_segment", None)


def test_bench_segments_builds_stage_one_in_fp8_when_asked(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_segments
    from camrender.model.fp8 import is_quantized

    for precision, quantized in (("bf16", False), ("fp8", True)):
        args = argparse.Namespace(cpu_smoke=True, quick=False, kernels="torch", stage1_precision=precision)
        transformer, _ = bench_segments.build_models(args, torch.device("cpu"), torch.float32)
        assert all(is_quantized(block) == quantized for block in transformer.blocks)
    sys.modules.pop("bench_segments", None)
