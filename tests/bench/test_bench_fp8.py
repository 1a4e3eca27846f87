"""bench/bench_fp8.py on the CPU with the tiny refiner: the figures are there and ordered as they must be."""
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_tiny_run_reports_fp8_against_the_bf16_floor(tmp_path, monkeypatch):
    from camrender.model.fp8 import Fp8Linear

    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setattr(Fp8Linear, "backend", Fp8Linear.backend)  # the bench sets it: restored after
    import bench_fp8

    out = tmp_path / "fp8.json"
    assert bench_fp8.main(["--tiny", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    floor, row, tensor = result["bf16_one_ulp"], result["fp8_row"], result["fp8_tensor"]
    assert row["quantized_linears"] == tensor["quantized_linears"] > 0
    for name in ("end_to_end", "block_first", "block_last"):
        assert 0 < floor[name]["rel"] < row[name]["rel"] < 0.2 and row[name]["cos"] > 0.99
    assert 0 < row["per_layer"]["rel_median"] < 0.1 and row["per_layer"]["layers"] == row["quantized_linears"]
    assert result["weight_bytes"]["fp8"] < result["weight_bytes"]["bf16"]
    stage1 = result["stage1"]
    assert stage1["fp8_row"]["quantized_linears"] > 0
    assert 0 < stage1["one_ulp"]["end_to_end"]["rel"] < stage1["fp8_row"]["end_to_end"]["rel"] < 0.2
    assert stage1["fp8_row"]["end_to_end"]["cos"] > 0.99
    sys.modules.pop("bench_fp8", None)
    sys.modules.pop("bench_refiner", None)


def test_official_stage2_tiny_rows(tmp_path, monkeypatch):
    from camrender.model.fp8 import Fp8Linear

    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setattr(Fp8Linear, "backend", Fp8Linear.backend)
    import bench_official_stage2

    out = tmp_path / "official.json"
    assert bench_official_stage2.main(["--tiny", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["errors"] == {}
    for row in ("camrender_fused_bf16", "diffusers_stock_eager", "camrender_fused_fp8"):
        assert result[row]["s_per_block"] > 0
    sys.modules.pop("bench_official_stage2", None)
