"""bench/bench_refiner.py's logic on the CPU at a tiny shape (the lead runs it once on the H200)."""
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def no_allocator_setting(monkeypatch):
    """Neither allocator variable set while the test runs (both restored after)."""
    from camrender.allocator import USER_NAMES

    for name in USER_NAMES:
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)


def test_tiny_run_writes_every_figure(tmp_path, monkeypatch):
    from camrender.model.refiner import window as refiner_window

    monkeypatch.setattr(refiner_window, "BLOCK_SLOT", refiner_window.BLOCK_SLOT)  # the bench sets it: restored after
    monkeypatch.syspath_prepend(str(BENCH))
    no_allocator_setting(monkeypatch)
    import bench_refiner

    out = tmp_path / "bench.json"
    assert bench_refiner.main(["--tiny", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["errors"] == {}
    assert result["allocator"] == "expandable_segments:True"  # as camrender's processes run
    assert result["refiner_window_layout"] == "slot"  # renders' default
    rows = ("without_refiner", "with_refiner", "with_refiner_equal_priorities", "with_refiner_decode_on_refiner_stream",
            "with_refiner_no_overlap", "with_refiner_breakdown")
    for name in rows:
        assert result[name]["video_frames"] == 97 and result[name]["video_fps"] > 0  # 4 segments, 1 + 96 frames
    for name in rows[:-1]:  # the steady rate: the median time between two segments' frames
        steady_s = result[name]["s_per_segment_steady"]
        # the same gap twice: s_per_segment_steady is rounded to 1 ms (0.5 ms off at most; a relative bar
        # would fail on a machine where a segment takes under 50 ms), video_fps_steady to 0.01
        assert steady_s > 0 and steady_s == pytest.approx(24 / result[name]["video_fps_steady"], abs=6e-4)
    assert result["with_refiner"]["video_fps_after_first_frames"] > 0
    steady = result["refiner_steady_state_eager"]
    assert steady["window_frames"] == 14  # sink + 10 recent + the block: the window is full when timed
    assert steady["host_syncs_per_block"] == 0
    assert steady["gemm_flop_per_block"] > 0 and steady["flop_per_block"] > steady["gemm_flop_per_block"]
    assert result["roofline"]["refiner_only_fps_at_peak"] > result["roofline"]["segment_mode_fps_ceiling_with_refiner"]
    # the fused refiner blocks against diffusers' stock ones, side by side (fp32 here: the same block)
    assert result["with_refiner_stock_kernels"]["video_frames"] == 97
    assert result["refiner_steady_state_eager"]["kernels"] == "fused"
    assert result["refiner_steady_state_eager_stock_kernels"]["kernels"] == "torch"  # diffusers' own blocks
    comparison = result["refiner_kernels_fused_vs_stock"]
    assert comparison["speedup"] > 0 and comparison["block_max_abs_diff_over_max_abs"] <= 1e-5
    # the agreement bar: the stock blocks against themselves with the clip moved one ulp (a real change)
    assert result["refiner_steady_state_eager_stock_kernels_one_ulp"]["kernels"] == "torch"
    assert 0 < comparison["stock_one_ulp_floor"] < 1e-3 and "within_floor" in comparison
    assert set(result["peak_gib_by_setting"]) == {"none", "layers"}
    assert set(result["setting_for_gpu"]) == {"24GB", "48GB", "80GB", "141GB"}
    sys.modules.pop("bench_refiner", None)


def test_tiny_setting_reports_the_phases(tmp_path, monkeypatch):
    from camrender.model.refiner import window as refiner_window
    from camrender.model.fp8 import Fp8Linear

    monkeypatch.setattr(Fp8Linear, "backend", Fp8Linear.backend)  # the bench sets it: restored after
    monkeypatch.setattr(refiner_window, "BLOCK_SLOT", refiner_window.BLOCK_SLOT)  # likewise
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_refiner

    no_allocator_setting(monkeypatch)
    out = tmp_path / "fp8.json"
    assert bench_refiner.main(["--tiny", "--setting", "fp8-22gib-window2", "--allocator", "default",
                               "--refiner-window-layout", "split", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["allocator"] == "default"  # PyTorch's own: nothing set
    assert result["refiner_window_layout"] == "split"
    assert result["precision"] == "fp8" and result["window"] == 2 and result["refiner_fp8_linears"] > 0
    timed = result["render"]["timed"]
    assert timed["video_frames"] == 97 and timed["video_fps_steady"] > 0
    for phase in ("first_segment", "steady_state"):
        assert set(timed[phase]["weights"]) == {"stage1_dit", "vae", "refiner_dit"}
    assert set(result["render"]["decode_workspace"]) == {"block_per_call", "one_frame_per_call"}
    sys.modules.pop("bench_refiner", None)


def test_the_steady_rate_leaves_out_the_warm_up_segments(monkeypatch):
    """`video_fps_steady` is the median gap from `STEADY_FROM` on (stage 1's graph captures and the refiner's
    filling window are earlier); the median of every gap, as before, is reported beside it, and bench_segments'
    former figure (the frames from the second segment's on over their time)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import common
    import refiner_targets

    assert refiner_targets.steady_rates is common.steady_rates  # the one definition, bench_segments' too
    gaps = [1.3, 1.2, 1.0, 1.1, 0.9] + [0.75, 0.8, 0.74, 0.76] + [0.1]  # warm-up, steady, the clip's last block
    arrivals, now = [(0.0, 25)], 0.0
    for gap in gaps:
        now += gap
        arrivals.append((now, arrivals[-1][1] + 24))
    assert refiner_targets.STEADY_FROM == 5
    rates = refiner_targets.steady_rates(arrivals)
    assert rates["segment_gaps_s"] == pytest.approx(gaps[:-1])
    assert rates["video_fps_steady"] == round(24 / 0.76, 2) and rates["steady_gaps"] == 4
    assert rates["s_per_segment_steady"] == 0.76
    assert rates["video_fps_median_all_gaps"] == round(24 / 0.9, 2)
    assert rates["video_fps_from_second_segment"] == round(24 * 9 / (sum(gaps) - 1.3), 2)
    short = refiner_targets.steady_rates(arrivals[:6])  # too few steady gaps: every gap
    assert short["video_fps_steady"] == short["video_fps_median_all_gaps"] and short["steady_gaps"] == 4


def test_the_pipeline_trace_adds_up_busy_and_idle_time_per_stream(monkeypatch):
    """`pipeline_trace.Trace.summary` on a Chrome trace: the union of the streams' kernels, the idle gaps and the
    host call in flight during the largest, per-stream busy time and launches, host time per thread and call."""
    monkeypatch.syspath_prepend(str(BENCH))
    import pipeline_trace

    trace = pipeline_trace.Trace()
    trace.events = [
        dict(cat="kernel", name="a", ts=0, dur=1000, args=dict(stream=7)),
        dict(cat="kernel", name="b", ts=500, dur=1000, args=dict(stream=13)),  # overlaps a: 1.5 ms busy together
        dict(cat="gpu_memcpy", name="copy", ts=3500, dur=500, args=dict(stream=7)),  # after a 2 ms gap
        dict(cat="cuda_runtime", name="cudaStreamSynchronize", ts=1400, dur=2000, tid=1),
        dict(cat="cuda_runtime", name="cudaLaunchKernel", ts=100, dur=10, tid=2),
        dict(cat="cpu_op", name="aten::mm", ts=0, dur=4000),  # not GPU activity
    ]
    summary = trace.summary()
    assert summary["span_ms"] == 4.0 and summary["busy_ms"] == 2.0 and summary["idle_ms"] == 2.0
    assert summary["gaps"]["count"] == 1 and summary["gaps"]["ms"] == 2.0
    assert summary["gaps"]["largest"][0]["host"][0] == dict(call="cudaStreamSynchronize", thread=1, ms=1.9)
    assert summary["streams"] == {"7": dict(busy_ms=1.5, launches=2), "13": dict(busy_ms=1.0, launches=1)}
    assert summary["host"] == {"1": {"cudaStreamSynchronize": 2.0}, "2": {"cudaLaunchKernel": 0.01}}


def test_the_decode_probe_records_running_out_of_memory(monkeypatch):
    """Under a card's cap the probe's whole-block VAE call may not fit (a render decodes a frame per call): the
    probe records it for that row and still measures the other, so the setting's render figures are kept."""
    import torch

    monkeypatch.syspath_prepend(str(BENCH))
    import refiner_targets
    from camrender.render.decode import CausalStreamDecoder

    calls = []

    def decode(self, latents):
        calls.append((self.max_frames, latents.shape[2]))
        if self.max_frames is None and latents.shape[2] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 330.00 MiB.\nmore")

    monkeypatch.setattr(CausalStreamDecoder, "decode", decode)
    vae = torch.nn.Module()  # only what the probe reads: the latent channels and the decoder's device
    vae.config = type("Config", (), {"latent_channels": 4})()
    vae.decoder = torch.nn.Linear(1, 1)
    result = refiner_targets.decode_workspace(vae, (64, 64), torch.device("cpu"), torch.float32)
    assert result["block_per_call"] == {"out_of_memory": "CUDA out of memory. Tried to allocate 330.00 MiB."}
    assert set(result["one_frame_per_call"]) == {"s"} and result["one_frame_per_call"]["s"] >= 0
    assert calls == [(None, 1), (None, 3), (1, 1), (1, 3)]
