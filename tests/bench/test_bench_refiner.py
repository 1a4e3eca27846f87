"""bench/bench_refiner.py's logic on the CPU at a tiny shape (the lead runs it once on the H200)."""
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_tiny_run_writes_every_figure(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_refiner

    out = tmp_path / "bench.json"
    assert bench_refiner.main(["--tiny", "--refiner-graphs", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["errors"] == {}
    for name in ("without_refiner", "with_refiner", "with_refiner_breakdown"):
        assert result[name]["video_frames"] == 73 and result[name]["video_fps"] > 0  # 3 segments, 1 + 72 frames
    assert result["with_refiner_graphed"]["video_frames"] == 73
    assert result["with_refiner"]["video_fps_after_first_frames"] > 0
    for name in ("refiner_steady_state_eager", "refiner_steady_state_graphed"):
        steady = result[name]
        assert steady["window_frames"] == 14  # sink + 10 recent + the block: the window is full when timed
        assert steady["host_syncs_per_block"] == 0
        assert steady["gemm_flop_per_block"] > 0 and steady["flop_per_block"] > steady["gemm_flop_per_block"]
    # the graphed row really replays (on the CPU: GraphedForward's static copies): its 3 timed blocks
    # and the sync-check block, 3 denoising passes and 1 cache pass each, after the captures
    stats = result["refiner_steady_state_graphed"]["graph_stats"]
    assert stats["inject"]["replays"] >= 12 and stats["inject_and_capture_post_rope"]["replays"] >= 4
    assert result["refiner_steady_state_eager"]["graph_stats"] is None
    assert result["roofline"]["refiner_only_fps_measured_graphed"] > 0
    assert "graphed_vs_eager_block_max_abs_diff" not in result  # a check: tests/render/test_graphs_gpu.py
    assert result["roofline"]["refiner_only_fps_at_peak"] > result["roofline"]["segment_mode_fps_ceiling_with_refiner"]
    # the fused refiner blocks against diffusers' stock ones, side by side (fp32 here: the same block)
    assert result["with_refiner_stock_kernels"]["video_frames"] == 73
    assert result["refiner_steady_state_eager"]["kernels"] == "fused"
    assert result["refiner_steady_state_eager_stock_kernels"]["kernels"] == "stock"
    comparison = result["refiner_kernels_fused_vs_stock"]
    assert comparison["speedup"] > 0 and comparison["block_max_abs_diff_over_max_abs"] <= 1e-5
    # the agreement bar: the stock blocks against themselves with the clip moved one ulp (a real change)
    assert result["refiner_steady_state_eager_stock_kernels_one_ulp"]["kernels"] == "stock"
    assert 0 < comparison["stock_one_ulp_floor"] < 1e-3 and "within_floor" in comparison
    assert set(result["peak_gib_by_setting"]) == {"none", "layers"}
    assert set(result["setting_for_gpu"]) == {"24GB", "48GB", "80GB", "141GB"}
    sys.modules.pop("bench_refiner", None)
