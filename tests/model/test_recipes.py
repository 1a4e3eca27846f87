"""Checkpoint recipes (camrender.model.stage1.recipes): detection from the weights file, --recipe checks, CLI errors,
the README table and the help written from the recipes."""
import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from camrender.errors import CamrenderError
from camrender.model.stage1 import recipes
from camrender.model.stage1.recipes import (RECIPE_NOTES, RECIPES, detect_recipe, get_recipe, guidance_words, per_recipe,
                                            recent_words, recipe_table, resolve_recipe, steps_words)
from test_render_cli import run_cli, small_trajectory


def streaming_pt(path):
    """The distillation trainer's layout: {"generator": state dict, "step", "denoising_step_list"}."""
    torch.save({"generator": {"x_embedder.proj.weight": torch.ones(2)}, "step": 3,
                "denoising_step_list": [1000, 960, 889, 727, 0]}, path)
    return path


def test_recipes_hold_the_official_defaults():
    streaming = get_recipe("streaming")
    assert (streaming.mode, streaming.chunk_frames, streaming.cached_chunks, streaming.recent_chunks) == ("segments", 3, 2, 1)
    assert streaming.timesteps == (1000.0, 960.0, 889.0, 727.0) and streaming.guidance <= 1
    assert streaming.frame_stride == 24 and streaming.softmax_scale == "head" and not streaming.gdn_camera_downscale
    assert not streaming.softmax_camera_downscale
    teacher = get_recipe("chunk-causal")
    assert (teacher.sampler, teacher.steps, teacher.guidance, teacher.recent_chunks) == ("chunk-flow-euler", 60, 5.0, None)
    assert get_recipe("bidirectional").mode == "full"
    with pytest.raises(CamrenderError, match="unknown recipe 'fast'; recipes: bidirectional, bidirectional-nvlabs-latest, bidirectional-diffusers, streaming, chunk-causal"):
        get_recipe("fast")


def test_bidirectional_recipes_name_what_they_reproduce():
    """40151c8 (the release of the weights): softmax-block rescale and 1/sqrt(128), no GDN-block
    rescale; NVlabs today: neither rescale, 1/sqrt(D); diffusers 0.42.1: both rescales, 1/sqrt(128)."""
    from camrender.model.stage1.state import FULL_MODE, SegmentOptions

    rules = {name: (RECIPES[name].softmax_scale, RECIPES[name].gdn_camera_downscale,
                    RECIPES[name].softmax_camera_downscale, RECIPES[name].flow_shift)
             for name in ("bidirectional", "bidirectional-nvlabs-latest", "bidirectional-diffusers")}
    assert rules == {"bidirectional": ("padded", False, True, 9.8),
                     "bidirectional-nvlabs-latest": ("head", False, False, 9.8),
                     "bidirectional-diffusers": ("padded", True, True, None)}
    assert all(RECIPES[name].checkpoint == "bidirectional" and RECIPES[name].mode == "full" for name in rules)
    assert FULL_MODE == SegmentOptions.full_mode(get_recipe("bidirectional"))  # the unset default is the default recipe
    assert SegmentOptions.full_mode(get_recipe("bidirectional")).cached_segments is None


def test_a_recipe_of_another_checkpoint_lists_the_ones_that_fit(tmp_path):
    streaming = streaming_pt(tmp_path / "model.pt")
    with pytest.raises(CamrenderError, match="does not fit this streaming checkpoint; recipes that fit: streaming$"):
        resolve_recipe("bidirectional-nvlabs-latest", streaming)
    tagged = tmp_path / "bidi.safetensors"
    save_file({"a": torch.ones(1)}, str(tagged), metadata={"recipe": "bidirectional"})
    assert resolve_recipe("bidirectional-diffusers", tagged).name == "bidirectional-diffusers"
    with pytest.raises(CamrenderError, match="recipes that fit: bidirectional, bidirectional-nvlabs-latest, "
                                             "bidirectional-diffusers$"):
        resolve_recipe("chunk-causal", tagged)
    for name in ("bidirectional-nvlabs-latest", "bidirectional-diffusers"):  # the pipeline's own transformer
        assert resolve_recipe(name, None, "Efficient-Large-Model/x").name == name


def test_detection_from_the_file(tmp_path):
    assert detect_recipe(streaming_pt(tmp_path / "model.pt")) == "streaming"
    tagged = tmp_path / "weights.safetensors"
    save_file({"a": torch.ones(1)}, str(tagged), metadata={"recipe": "chunk-causal"})
    assert detect_recipe(tagged) == "chunk-causal"
    named = tmp_path / "sana_wm_chunk_causal_1600m_720p.safetensors"
    save_file({"a": torch.ones(1)}, str(named))
    assert detect_recipe(named) == "chunk-causal"  # the file name, as a last resort
    plain = tmp_path / "dit.pt"
    torch.save({"a": torch.ones(1)}, plain)
    assert detect_recipe(plain) is None


def test_resolve_checks_recipe_against_the_checkpoint(tmp_path):
    streaming = streaming_pt(tmp_path / "model.pt")
    assert resolve_recipe(None, streaming).name == "streaming"
    assert resolve_recipe("streaming", streaming).name == "streaming"
    with pytest.raises(CamrenderError, match="--recipe chunk-causal does not fit this streaming checkpoint"):
        resolve_recipe("chunk-causal", streaming)
    plain = tmp_path / "dit.pt"
    torch.save({"a": torch.ones(1)}, plain)
    with pytest.raises(CamrenderError, match=r"cannot tell which recipe.*--recipe \(bidirectional, bidirectional-nvlabs-latest, bidirectional-diffusers, streaming, chunk-causal\)"):
        resolve_recipe(None, plain)
    assert resolve_recipe("chunk-causal", plain).name == "chunk-causal"
    assert resolve_recipe(None, None, "Efficient-Large-Model/x").name == "bidirectional"
    with pytest.raises(CamrenderError, match="needs its original-format DiT"):
        resolve_recipe("streaming", None, "Efficient-Large-Model/x")
    assert resolve_recipe("streaming", None, "tiny").name == "streaming"  # the test model takes any recipe
    assert set(RECIPES) == {"bidirectional", "bidirectional-nvlabs-latest", "bidirectional-diffusers", "streaming",
                            "chunk-causal"}


@pytest.mark.parametrize("extra, message", [
    (["--recipe", "fast"], "recipe: unknown recipe 'fast'; recipes: bidirectional, bidirectional-nvlabs-latest, bidirectional-diffusers, streaming, chunk-causal"),
    (["--recipe", "chunk-causal", "--transformer-weights", "{streaming}"], "does not fit this streaming checkpoint"),
    (["--recipe", "bidirectional-diffusers", "--transformer-weights", "{streaming}"],
     "recipe: --recipe bidirectional-diffusers does not fit this streaming checkpoint; recipes that fit: streaming"),
    (["--transformer-weights", "{plain}"], "cannot tell which recipe this checkpoint uses"),
])
def test_cli_recipe_errors_write_nothing(tmp_path, capsys, extra, message):
    streaming_pt(tmp_path / "model.pt")
    torch.save({"a": torch.ones(1)}, tmp_path / "dit.pt")
    extra = [a.format(streaming=tmp_path / "model.pt", plain=tmp_path / "dit.pt") for a in extra]
    out = tmp_path / "out" / "x.mp4"
    out.parent.mkdir()
    code, _, err = run_cli(["--traj", small_trajectory(tmp_path), "--out", out, "--model", "tiny", *extra], capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert not list(out.parent.iterdir())


def test_streaming_recipe_snaps_frames_to_24k_plus_1(tmp_path, capsys):
    code, _, err = run_cli(["--traj", small_trajectory(tmp_path), "--out", tmp_path / "x.mp4", "--model", "tiny",
                            "--recipe", "streaming", "--frames", "33"], capsys)
    assert code == 2 and "33 frames is not 24k+1" in err and "e.g. 25" in err


def test_chunk_causal_recipe_renders_through_the_cli(tmp_path, capsys, monkeypatch):
    """--recipe chunk-causal runs the teacher's ChunkFlowEuler sampler in segment mode and writes the video."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the CPU render path, as a user runs it
    out = tmp_path / "x.mp4"
    code, _, err = run_cli(["--traj", small_trajectory(tmp_path), "--out", out, "--model", "tiny",
                            "--recipe", "chunk-causal", "--frames", "41", "--height", "32", "--width", "32",
                            "--steps", "2"], capsys)
    assert code == 0, err
    assert out.is_file() and not list(tmp_path.glob(".x.mp4.*"))


README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_recipe_table_is_the_generated_one():
    """The README's table is `recipe_table()` verbatim: editing `RECIPES` without regenerating fails here."""
    text = README.read_text()
    start = text.index("| recipe | checkpoint | mode | defaults |")
    assert text[start:].startswith(recipe_table()), "README.md's recipe table is stale: paste recipe_table()"


def test_recipe_table_is_made_from_the_fields(monkeypatch):
    """A changed recipe shows in its row and in the grouped help words; recipes sharing a value are grouped."""
    table = dict(RECIPES)  # a copy in the module's place, so the real table's order stays as it is
    monkeypatch.setattr(recipes, "RECIPES", table)
    table["chunk-causal"] = dataclasses.replace(RECIPES["chunk-causal"], steps=12, guidance=3.5, cached_chunks=4,
                                                frame_stride=16)
    monkeypatch.setitem(RECIPE_NOTES, "chunk-causal", "note")
    row = next(line for line in recipe_table().splitlines() if line.startswith("| `chunk-causal` |"))
    assert "12 steps, guidance 3.5" in row and "the first segment + 3 recent" in row and "16k+1 frames" in row
    assert row.endswith("| note |") and "| `segments` |" in row
    assert per_recipe(steps_words) == ("60 steps (bidirectional*); the 4-step list 1000, 960, 889, 727 (streaming); "
                                       "12 steps (chunk-causal)")
    assert per_recipe(recent_words) == "1 (bidirectional*, streaming); 3 (chunk-causal)"
    del table["bidirectional-diffusers"]
    assert per_recipe(guidance_words).startswith("guidance 5 (bidirectional*)")
    table["bidirectional-diffusers"] = dataclasses.replace(RECIPES["bidirectional"], name="bidirectional-diffusers",
                                                           guidance=1.0)  # a family not all in a group is spelled out
    assert per_recipe(guidance_words) == ("guidance 5 (bidirectional, bidirectional-nvlabs-latest); no guidance "
                                          "(streaming, bidirectional-diffusers); guidance 3.5 (chunk-causal)")


def test_render_help_states_the_recipe_defaults():
    """The click help of the recipe-dependent options is written from `RECIPES`."""
    from camrender.cli.render import render

    helps = {param.name: " ".join(param.help.split()) for param in render.params}
    assert per_recipe(steps_words) in helps["steps"] and per_recipe(guidance_words) in helps["guidance"]
    assert per_recipe(recent_words) in helps["cached_segments"]
    assert "full (bidirectional*); segments (streaming, chunk-causal)" in helps["mode"]
    assert "3 (bidirectional*, streaming, chunk-causal)" in helps["segment_frames"]
    assert "8k+1 (bidirectional*, chunk-causal); 24k+1 (streaming)" in helps["frames"]
    assert ", ".join(RECIPES) in helps["recipe"]
