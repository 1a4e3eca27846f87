"""bench/score_recipes.py plans the benchmark runs it would make: the scenes as camrender paths, one batch per
method with the benchmark's settings, method_info.json, then camrender eval (--dry-run: no model, no render)."""
import json
import sys
from pathlib import Path

import numpy as np

from camrender.trajectory import load
from eval_paths import dolly, handheld, write_bench

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_every_method_renders_every_scene_with_the_benchmarks_settings(tmp_path, monkeypatch, capsys):
    write_bench(tmp_path / "bench", {"indoor_001": dolly(9), "outdoor_002": handheld(9)})
    results = tmp_path / "results"
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setattr(sys, "argv", ["score_recipes.py", str(tmp_path / "bench"), "--results", str(results),
                                      "--streaming", "/w/SANA-WM_streaming", "--refiner", "/w/refiner", "--dry-run"])
    import score_recipes

    score_recipes.main()
    sys.modules.pop("score_recipes", None)
    commands = [line[2:].split() for line in capsys.readouterr().out.splitlines() if line.startswith("+ ")]
    batches = [c for c in commands if "batch" in c]
    evals = [c for c in commands if "eval" in c]
    assert len(batches) == len(evals) == 4
    for command in batches:
        method = Path(command[command.index("batch") + 1]).parent.name
        assert command[command.index("--seed") + 1] == "42" and command[command.index("--refiner") + 1] == "/w/refiner"
        if method == "streaming":
            assert "--steps" not in command and "--flow-shift" not in command
            assert command[command.index("--transformer-weights") + 1] == "/w/SANA-WM_streaming/sana_dit/model.pt"
        else:
            assert command[command.index("--recipe") + 1] == method
            settings = [command[command.index(option) + 1] for option in ("--steps", "--guidance", "--flow-shift")]
            assert settings == ["60", "5", "8.0"]
        info = json.loads((results / method / "method_info.json").read_text())
        assert info["refiner"] == "/w/refiner" and info["variant"] == method
    jobs = [json.loads(line) for line in (results / "streaming" / "simple_60s.jobs.jsonl").read_text().splitlines()]
    assert [Path(job["output"]).name for job in jobs] == ["indoor_001_generated.mp4", "outdoor_002_generated.mp4"]
    path = load(jobs[1]["trajectory"])
    assert np.allclose(path.c2w, handheld(9), atol=1e-6) and path.prompt == "a walk through outdoor_002"
    assert path.image == str(tmp_path / "bench" / "images" / "outdoor_002.png")
    manifest = evals[0][evals[0].index("--manifest") + 1]
    assert manifest.endswith("benchmark_v2_smooth_60s/sanawm_export_v2/run_manifest.jsonl")
