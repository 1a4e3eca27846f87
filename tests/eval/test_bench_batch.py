"""The benchmark as input: `camrender batch` on a SANA-WM-Bench split renders every scene's camera `.npz` from its
image and prompt into <scene_id>_generated.mp4 with the benchmark's settings one option away (--preset), and a
scene's camera file renders alone with `camrender render --traj SCENE.npz --image SCENE.png`."""
import json

from eval_paths import SPLIT_DIR, dolly, write_bench
from helpers import run_cli

SMALL = ["--model", "tiny", "--device", "cpu", "--height", "32", "--width", "32", "--steps", "1", "--frames", "17",
         "--prompt-cache", "off"]


def test_a_split_renders_every_scene_with_the_benchmarks_settings(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    manifest = write_bench(tmp_path / "bench", {"indoor_001": dolly(25), "game_style_002": dolly(21)})
    results = tmp_path / "results" / "tiny" / SPLIT_DIR
    code, _, err = run_cli(["batch", tmp_path / "bench" / SPLIT_DIR, "--out-dir", results, "--preset",
                            "sana-wm-bench", *SMALL], capsys)
    assert code == 0, err[-2000:]
    assert sorted(path.name for path in results.glob("*.mp4")) == ["game_style_002_generated.mp4",
                                                                     "indoor_001_generated.mp4"]
    settings = json.loads((results / "indoor_001_generated.render.json").read_text())["settings"]
    # the preset's settings where the command line said nothing (its frames and steps here are the command's)
    assert (settings["guidance"], settings["flow_shift"], settings["seed"], settings["fps"]) == (5.0, 8.0, 42, 16.0)
    assert (settings["num_frames"], settings["steps"], settings["prompt"]) == (17, 1, "a walk through indoor_001")
    alone = tmp_path / "alone.mp4"
    scene = manifest.parent / "indoor_001.npz"
    code, _, err = run_cli(["--traj", scene, "--image", tmp_path / "bench" / "images" / "indoor_001.png", "--prompt",
                            "a walk through indoor_001", "--out", alone, "--preset", "sana-wm-bench", *SMALL], capsys)
    assert code == 0, err[-2000:]
    assert alone.read_bytes() == (results / "indoor_001_generated.mp4").read_bytes()


def test_a_split_needs_a_results_folder(tmp_path, capsys):
    write_bench(tmp_path / "bench", {"indoor_001": dolly(25)})
    code, _, err = run_cli(["batch", tmp_path / "bench" / SPLIT_DIR, *SMALL], capsys)
    assert code == 2 and err.count("\n") == 1 and "out-dir" in err and "Traceback" not in err
