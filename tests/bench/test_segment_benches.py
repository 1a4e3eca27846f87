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


def test_stage1_alone_lists_the_warm_up_passes(monkeypatch):
    """Its `warmup_passes`: one row per model pass of the first segments, in order, with what the graph path did
    (off CUDA the replay path runs on static copies: no capture to count) and the host's and GPU's milliseconds;
    `Denoiser.predict` is itself again afterwards."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_segments
    from camrender.model.stage1.recipes import get_recipe
    from camrender.model.stage1.segments import SegmentOptions
    from camrender.render.denoise import Denoiser

    predict = Denoiser.predict
    monkeypatch.setattr(bench_segments, "SPATIAL", 8)
    args = argparse.Namespace(cpu_smoke=True, quick=False, kernels="torch", stage1_precision="bf16")
    transformer, _ = bench_segments.build_models(args, torch.device("cpu"), torch.float32)
    options = SegmentOptions.for_recipe(get_recipe("streaming"))
    cpu = torch.device("cpu")
    for graphs, kinds in ((True, ["eager", "replay", "replay", "replay", "eager"]), (False, ["plain"] * 5)):
        rows = bench_segments.run_stage1_alone(transformer, 7, 32, 32, options, cpu, torch.float32,
                                               cuda_graphs=graphs)["warmup_passes"]
        assert [row["segment"] for row in rows] == [0] * 5 + [1] * 5
        assert [row["write"] for row in rows] == ([False] * 4 + [True]) * 2
        assert [row["kind"] for row in rows[:5]] == kinds
        assert all(row["host_ms"] > 0 and row["gpu_ms"] > 0 for row in rows)
        assert Denoiser.predict is predict
    profiled = bench_segments.run_stage1_alone(transformer, 7, 32, 32, options, cpu, torch.float32, cuda_graphs=True,
                                               host_profile=True)["host_profile"]
    assert profiled and all(len(row) == 4 for row in profiled)
    names = [row[0] for row in profiled]
    assert any("linear" in name for name in names)  # the model's own calls, most time of their own first
    assert [row[2] for row in profiled] == sorted((row[2] for row in profiled), reverse=True)
    sys.modules.pop("bench_segments", None)


def test_union_gaps_are_the_idle_time_between_overlapping_spans(monkeypatch):
    """profile_step.union_gaps, which both profiles' idle figures use: spans that overlap or touch leave no gap;
    a span inside a longer one does not end the longer one."""
    monkeypatch.syspath_prepend(str(BENCH))
    import profile_step

    spans = [(0, 1000), (200, 400), (1000, 1500), (2500, 3000), (2600, 2700), (3500, 4000)]
    assert profile_step.union_gaps(spans) == [(1.0, 3), (0.5, 5)]
    assert profile_step.union_gaps([]) == []
    sys.modules.pop("profile_step", None)


def test_official_rows_run_the_kit_script_in_its_own_process(monkeypatch, tmp_path):
    """bench_segments --official KIT: the kit's `bench_official_stage1.py` runs in its own process on the paths'
    latent frames (1 + 3 per segment), without TRITON_INTERPRET, and its result lines come back keyed by segments;
    a script that gives no result comes back as its last error line, one that runs out of time as the lines it wrote
    (where the time went). A stand-in kit script records its call."""
    monkeypatch.syspath_prepend(str(BENCH))
    import json

    import bench_segments

    script = tmp_path / "bench_official_stage1.py"
    script.write_text(
        "import json, os, sys\n"
        "args = sys.argv[1:]\n"
        "frames = [int(f) for f in args[args.index('--latent-frames') + 1].split(',')]\n"
        "if 'TRITON_INTERPRET' in os.environ or (31 not in frames and 7 not in frames):\n"
        "    sys.exit('bad call: ' + ' '.join(args))\n"
        "with open(args[args.index('--out') + 1], 'w') as out:\n"
        "    out.write(json.dumps({'kind': 'setup', 'kit': args[args.index('--kit') + 1]}) + '\\n')\n"
        "    if 7 in frames:  # a warm-up that outlasts the caller's limit\n"
        "        out.write(json.dumps({'kind': 'warmup', 'latent_frames': 7, 'seconds': 12.5, 'probe': {}}) + '\\n')\n"
        "        out.flush()\n"
        "        import time; time.sleep(60)\n"
        "    for f in frames:\n"
        "        out.write(json.dumps({'kind': 'result', 'latent_frames': f, 'stage1_fps': 20.0 + f}) + '\\n')\n")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rows = bench_segments.official_rows(str(tmp_path), [10, 30], timeout_s=60)
    assert rows == {"10": {"kind": "result", "latent_frames": 31, "stage1_fps": 51.0},
                    "30": {"kind": "result", "latent_frames": 91, "stage1_fps": 111.0}}
    failed = bench_segments.official_rows(str(tmp_path), [3], timeout_s=60)
    assert failed["error"].startswith("bad call: --kit") and failed["lines"] == []
    assert json.dumps(failed)  # a JSON document's row
    late = bench_segments.official_rows(str(tmp_path), [2], timeout_s=5)
    assert late == {"error": "timed out after 5 s",
                    "lines": [{"kind": "setup"}, {"kind": "warmup", "latent_frames": 7, "seconds": 12.5}]}
    sys.modules.pop("bench_segments", None)


def test_host_syncs_count_the_sync_warnings_by_the_line_that_made_them(monkeypatch):
    """bench/common.HostSyncs counts PyTorch's sync debug warnings (raised by hand here: no GPU), not other
    warnings, and names the lines; bench_segments' per-segment row has one count per segment (none on the CPU)."""
    import warnings

    monkeypatch.syspath_prepend(str(BENCH))
    import bench_segments
    from camrender.model.stage1.recipes import get_recipe
    from camrender.model.stage1.segments import SegmentOptions
    from common import HostSyncs

    with HostSyncs(torch.device("cpu")) as syncs:
        for _ in range(2):
            warnings.warn("called a synchronizing CUDA operation")  # the same line twice
        warnings.warn("something else")
    line = f"{Path(__file__).name}:"
    assert syncs.count == 2 and list(syncs.sites().values()) == [2] and next(iter(syncs.sites())).startswith(line)

    monkeypatch.setattr(bench_segments, "SPATIAL", 8)
    args = argparse.Namespace(cpu_smoke=True, quick=False, kernels="torch", stage1_precision="bf16")
    transformer, _ = bench_segments.build_models(args, torch.device("cpu"), torch.float32)
    options = SegmentOptions.for_recipe(get_recipe("streaming"))
    row = bench_segments.count_host_syncs(transformer, 7, 32, 32, options, torch.device("cpu"), torch.float32)
    assert row == {"segments": 2, "syncs_per_segment": [0, 0], "sites": {}}
    sys.modules.pop("bench_segments", None)
