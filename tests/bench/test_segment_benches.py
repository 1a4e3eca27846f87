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


def test_ops_within_lists_the_ops_of_one_range_only(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import profile_segment
    from torch.autograd.profiler import record_function

    x = torch.randn(8, 8)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        x.sum()  # outside the range
        with record_function("pass.conditioning"):
            torch.mm(x, x)
            x.exp()
    names = {row[0] for row in profile_segment.ops_within(profiler, "pass.conditioning")}
    assert names == {"aten::mm", "aten::exp"}
    assert profile_segment.ops_within(profiler, "pass.other") == []
    sys.modules.pop("profile_segment", None)


def test_stage1_alone_samples_every_segment_without_decoding(monkeypatch):
    """bench_segments' stage-1 row without a wait per segment: the frames of the whole path, one GPU lap (here
    a host lap) per segment, the same frame count as the row that decodes."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_segments
    from camrender.model.stage1.recipes import get_recipe
    from camrender.model.stage1.segments import SegmentOptions

    monkeypatch.setattr(bench_segments, "SPATIAL", 8)
    args = argparse.Namespace(cpu_smoke=True, quick=False, kernels="torch", stage1_precision="bf16")
    transformer, vae = bench_segments.build_models(args, torch.device("cpu"), torch.float32)
    options = SegmentOptions.for_recipe(get_recipe("streaming"))
    cpu = torch.device("cpu")
    alone = bench_segments.run_stage1_alone(transformer, 7, 32, 32, options, cpu, torch.float32, cuda_graphs=False)
    decoded = bench_segments.run_segment_path(transformer, vae, 7, 32, 32, options, cpu, torch.float32, False)
    assert alone["segments"] == 2 and len(alone["stage1_ms_per_segment"]) == 2
    assert alone["video_frames"] == decoded["video_frames"] == 49
    assert alone["stage1_fps"] > 0
    sys.modules.pop("bench_segments", None)
