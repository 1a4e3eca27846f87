"""A batch keeps its pipeline only while consecutive jobs ask for the same `LoadSettings`: jobs that differ in any
load-time field each render exactly the video the same render alone gives, byte for byte."""
import json

import pytest
from safetensors.torch import save_file

from helpers import run_cli

BASE = {"model": "tiny", "device": "cpu", "steps": 1, "height": 32, "width": 32, "prompt_cache": "off", "seed": 5}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """Files a job can load: other transformer weights (one with a weight missing), another VAE, a refiner of 5
    blocks, each saved as a user has them."""
    from camrender.model.refiner.tiny import build_tiny_refiner
    from camrender.model.stage1.tiny import build_tiny_transformer, build_tiny_vae

    folder = tmp_path_factory.mktemp("assets")
    weights = build_tiny_transformer(seed=7).state_dict()
    save_file({name: tensor.contiguous() for name, tensor in weights.items()}, folder / "dit.safetensors")
    partial = dict(list(weights.items())[1:])
    save_file({name: tensor.contiguous() for name, tensor in partial.items()}, folder / "partial.safetensors")
    build_tiny_vae(seed=4).save_pretrained(folder / "vae")
    build_tiny_refiner(seed=3, num_layers=5).save_pretrained(folder / "refiner")
    return folder


def jobs_of(assets):
    """(name, the job's own options): each differs from the job before it in load-time fields only."""
    refiner = str(assets / "refiner")
    long = {"frames": 33, "mode": "segments"}  # a clip whose refiner window 2 differs from 11
    return [
        ("base", {"frames": 9}),
        ("kernels", {"frames": 9, "kernels": "torch"}),
        ("recipe", {"frames": 9, "recipe": "bidirectional-diffusers"}),
        ("weights", {"frames": 9, "transformer_weights": str(assets / "dit.safetensors"), "recipe": "bidirectional"}),
        ("missing", {"frames": 9, "transformer_weights": str(assets / "partial.safetensors"),
                     "recipe": "bidirectional", "allow_missing_weights": True}),
        ("vae", {"frames": 9, "vae": str(assets / "vae")}),
        ("graphs", {"frames": 9, "cuda_graphs": False}),
        ("dtype", {"frames": 9, "dtype": "float32", "cuda_graphs": False}),
        ("refiner", {**long, "refiner": refiner}),
        ("window", {**long, "refiner": refiner, "refiner_window": 2}),
        ("offload", {**long, "refiner": refiner, "refiner_window": 2, "refiner_offload": "3"}),
        ("precision", {**long, "refiner": refiner, "refiner_window": 2, "refiner_precision": "bf16"}),
    ]


def argv_of(options: dict) -> list:
    args = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + name.replace("_", "-"))
        else:
            args += [flag, str(value)]
    return args


def test_jobs_that_differ_in_load_settings_render_as_they_would_alone(tmp_path, capsys, monkeypatch, assets):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the PyTorch references: the same arithmetic, faster on a CPU
    jobs = jobs_of(assets)
    lines = [json.dumps({"trajectory": "w-16,dw-16", "output": str(tmp_path / "batch" / f"{name}.mp4"),
                         "options": options}) for name, options in jobs]
    (tmp_path / "jobs.jsonl").write_text("\n".join(lines) + "\n")
    code, _, err = run_cli(["batch", tmp_path / "jobs.jsonl", *argv_of(BASE), "--summary", tmp_path / "s.json"],
                           capsys)
    assert code == 0, err[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["done"] == len(jobs) and summary["model_loads_per_rank"] == [len(jobs)]
    (tmp_path / "alone").mkdir()
    videos = {}
    for name, options in jobs:
        code, _, err = run_cli(["--traj", "w-16,dw-16", "--out", tmp_path / "alone" / f"{name}.mp4",
                                *argv_of({**BASE, **options})], capsys)
        assert code == 0, err[-3000:]
        videos[name] = (tmp_path / "batch" / f"{name}.mp4").read_bytes()
        assert videos[name] == (tmp_path / "alone" / f"{name}.mp4").read_bytes(), name
        ran = json.loads((tmp_path / "batch" / f"{name}.render.json").read_text())["settings"]
        assert all(ran[key] == value for key, value in options.items() if key in ran and key != "frames"), name
    # the fields that change the arithmetic change the video: a pipeline kept from the job before would not
    for before, after in [("base", "recipe"), ("recipe", "weights"), ("weights", "missing"), ("missing", "vae"),
                          ("refiner", "window")]:
        assert videos[before] != videos[after], (before, after)
