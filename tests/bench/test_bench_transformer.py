"""bench/bench_transformer.py on the CPU with the tiny model: the step's breakdown times every part."""
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_tiny_breakdown_times_the_kernels_where_the_patched_blocks_call_them(tmp_path, monkeypatch):
    """The patched blocks call `main_branch`, `camera_branch` and `ffn_parts` by the names they imported:
    the breakdown must time those calls (it read 0 ms for them when it wrapped the defining modules)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_transformer
    from camrender.model.stage1 import block, gdn_attention

    calls = (gdn_attention.main_branch, gdn_attention.camera_branch, block.ffn_parts)
    out = tmp_path / "step.json"
    bench_transformer.main(["--tiny", "--out", str(out)])
    parts = json.loads(out.read_text())["patched"]["breakdown_ms"]
    for name in ("gdn_main", "gdn_camera", "gdn_other", "softmax_blocks", "ffn", "cross_attn"):
        assert parts[name] > 0, (name, parts)
    assert abs(sum(v for k, v in parts.items() if k != "total") - parts["total"]) < 0.05
    assert (gdn_attention.main_branch, gdn_attention.camera_branch, block.ffn_parts) == calls  # unwrapped after
    sys.modules.pop("bench_transformer", None)
