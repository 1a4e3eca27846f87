"""Encoded prompts on disk (camrender.render.prompt_cache): a cached render equals an uncached one bit for bit
and builds no text encoder; bad entries are noted and recomputed; the cache folder's convention;
`camrender encode-prompt`."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import camrender.model.stage1.tiny as tiny
import camrender.model.refiner.tiny as tiny_refiner
from camrender.render.loop import render_frames
from camrender.render.pipeline import load_patched_pipeline
from camrender.render.prompt_cache import PromptCache, refiner_key, resolve_cache_dir, stage_one_key
from helpers import render_request
from camrender.trajectory import Trajectory
from helpers import run_cli

FRAMES, SIZE = 17, 32


def request_for(cache, **changes):
    c2w = np.tile(np.eye(4), (FRAMES, 1, 1))
    c2w[:, 0, 3] = np.linspace(0.0, 1.0, FRAMES)
    traj = Trajectory(c2w=c2w, intrinsics=np.tile([28.0, 28.0, 16.0, 16.0], (FRAMES, 1)), width=SIZE, height=SIZE,
                      fps=16)
    fields = dict(traj=traj, prompt="a quiet street", steps=None, guidance=1.0, num_frames=FRAMES, height=SIZE,
                  width=SIZE, model="tiny", dtype="float32", kernels="torch", mode="segments", seed=3,
                  refiner="tiny", prompt_cache=None if cache is None else str(cache), device="cpu")
    fields.update(changes)
    return render_request(**fields)


def frames_of(request, prepared: bool = False):
    """The render's frames and its pipeline; `prepared`: loaded for this one request (cached prompts load no
    text encoder), as the command line loads it."""
    pipe = load_patched_pipeline(request.settings, prepare=request if prepared else None)
    return np.concatenate([np.asarray(chunk) for chunk in render_frames(pipe, request)]), pipe


def forbid_text_encoders(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a text encoder was built")

    monkeypatch.setattr(tiny, "build_tiny_text_encoder", refuse)
    monkeypatch.setattr(tiny_refiner, "build_tiny_gemma3", refuse)


def test_cached_render_equals_uncached_and_builds_no_encoder(tmp_path, monkeypatch):
    request = request_for(tmp_path / "cache")
    uncached, _ = frames_of(request_for(None))
    first, _ = frames_of(request)  # encodes and stores both stages' prompts
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()) == ["refiner", "stage1"]
    forbid_text_encoders(monkeypatch)
    cached, pipe = frames_of(request, prepared=True)
    assert pipe.text_encoder is None and pipe._camrender_refiner.text_encoder is None
    assert np.array_equal(cached, uncached) and np.array_equal(first, uncached)


def test_text_encoder_leaves_the_render_device(tmp_path):
    request = request_for(None)
    pipe = load_patched_pipeline(request.settings, prepare=request)
    assert next(pipe.text_encoder.parameters()).device.type == "cpu"
    assert next(pipe._camrender_refiner.text_encoder.parameters()).device.type == "cpu"


@pytest.mark.parametrize("damage", ["corrupt", "foreign"])
def test_bad_entries_are_noted_and_recomputed(tmp_path, capsys, damage):
    cache = tmp_path / "cache"
    request = request_for(cache)
    reference, _ = frames_of(request)
    store = PromptCache(cache)
    path = store.path(stage_one_key(request, False))
    if damage == "corrupt":
        path.write_bytes(path.read_bytes()[:40])
    else:  # another encoder's entry under this name
        other = dict(stage_one_key(request, False), encoder={"tiny": ["text_encoder"], "build": "another"})
        store.put(other, {"embeds": torch.zeros(1, 1, 2, 32)})
        store.path(other).replace(path)
    capsys.readouterr()
    again, _ = frames_of(request, prepared=True)
    notes = [line for line in capsys.readouterr().err.splitlines() if "prompt cache entry" in line]
    assert len(notes) == 1 and str(path) in notes[0]
    assert ("unreadable" if damage == "corrupt" else "another prompt or encoder") in notes[0]
    assert np.array_equal(again, reference)
    assert PromptCache(cache).get(stage_one_key(request, False)) is not None  # rewritten


def test_an_entry_of_another_dtype_is_noted_and_encoded_again(tmp_path):
    """encode-prompt's default bfloat16 entry does not serve a float32 (CPU) render: one line says so."""
    notes, computed = [], []
    store = PromptCache(tmp_path, log=notes.append)
    bf16 = stage_one_key(request_for(tmp_path, dtype="bfloat16"), False)
    fp32 = stage_one_key(request_for(tmp_path, dtype="float32"), False)
    assert bf16["dtype"] == "bfloat16" and fp32["dtype"] == "float32"
    store.put(bf16, {"embeds": torch.zeros(1, 2, 4, dtype=torch.bfloat16)})
    found = store.fetch(fp32, lambda: computed.append(1) or {"embeds": torch.ones(1, 2, 4)})
    assert computed == [1] and torch.equal(found["embeds"], torch.ones(1, 2, 4))
    assert notes == ["the prompt cache holds stage 1's prompt in bfloat16, but this render runs in float32: encoding "
                     "again (`camrender encode-prompt --dtype float32` caches it for such renders)"]
    store.fetch(fp32, lambda: computed.append(2))  # now cached in float32 too: found, nothing said
    assert computed == [1] and len(notes) == 1 and store.other_dtypes(fp32) == []


def test_cache_folder_convention(monkeypatch, tmp_path):
    monkeypatch.delenv("CAMRENDER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_cache_dir(None) == str(tmp_path / "xdg" / "camrender")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_cache_dir(None) == str(tmp_path / "home" / ".cache" / "camrender")
    monkeypatch.setenv("CAMRENDER_CACHE", str(tmp_path / "env"))
    assert resolve_cache_dir(None) == str(tmp_path / "env")
    assert resolve_cache_dir(str(tmp_path / "option")) == str(tmp_path / "option")
    assert resolve_cache_dir("off") is None
    monkeypatch.delenv("CAMRENDER_CACHE")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert resolve_cache_dir(None) == str(tmp_path / "home" / "Library" / "Caches" / "camrender")
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert resolve_cache_dir(None) == str(tmp_path / "local" / "camrender" / "Cache")


def test_keys_follow_prompt_and_encoder(tmp_path):
    a, b = request_for(tmp_path), request_for(tmp_path, prompt="another")
    store = PromptCache(tmp_path)
    assert store.path(stage_one_key(a, False)) != store.path(stage_one_key(b, False))
    assert store.path(refiner_key(a)) != store.path(stage_one_key(a, False))
    folder = tmp_path / "model" / "text_encoder"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"1")
    before = stage_one_key(request_for(tmp_path, model=str(tmp_path / "model")), False)
    (folder / "model.safetensors").write_bytes(b"22")  # new weights: another key
    assert stage_one_key(request_for(tmp_path, model=str(tmp_path / "model")), False) != before


def test_encode_prompt_command_fills_the_cache_for_a_render(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    code, out, err = run_cli(["encode-prompt", "--model", "tiny", "--refiner", "tiny", "--prompt", "a quiet street",
                              "--dtype", "float32", "--device", "cpu", "--prompt-cache", cache],
                             capsys)
    assert code == 0, err
    request = request_for(cache)
    store = PromptCache(cache)
    assert store.get(stage_one_key(request, False)) is not None and store.get(refiner_key(request)) is not None
    forbid_text_encoders(monkeypatch)
    cached, _ = frames_of(request, prepared=True)
    monkeypatch.undo()
    uncached, _ = frames_of(request_for(None))
    assert np.array_equal(cached, uncached)


def test_a_render_that_encoded_its_prompt_resumes_from_the_cache_bit_for_bit(tmp_path):
    """A first run encodes the prompt (and caches it), is stopped after a checkpoint; the resumed run reads the
    prompt from the cache: its checkpoints and video are those of a run that read it from the cache throughout."""
    from safetensors import safe_open

    from camrender.api.pipeline import CamrenderPipeline
    from camrender.render.resume import CHECKPOINT_NAME, partial_folder

    pipe = CamrenderPipeline.from_pretrained("tiny", kernels="torch", device="cpu")
    options = dict(steps=2, width=SIZE, height=SIZE, frames=41, mode="segments", segment_frames=1, seed=3,
                   checkpoint_every=0, prompt_cache=str(tmp_path / "cache"))

    class Stop(Exception):
        pass

    def stop_after_three(done, total, info="", stage="", unit=""):
        if done == 3:
            raise Stop

    states = []
    for name in ("encoded", "cached"):  # the first run encodes the prompt, the second finds it cached
        with pytest.raises(Stop):
            pipe.write(tmp_path / f"{name}.mp4", "w-40", progress=stop_after_three, **options)
        with safe_open(str(partial_folder(tmp_path / f"{name}.mp4") / CHECKPOINT_NAME), "pt") as handle:
            states.append({key: handle.get_tensor(key) for key in handle.keys()})
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][key], states[1][key]) for key in states[0])
    pipe.write(tmp_path / "encoded.mp4", "w-40", resume=True, **options)
    pipe.write(tmp_path / "whole.mp4", "w-40", **options)
    assert (tmp_path / "encoded.mp4").read_bytes() == (tmp_path / "whole.mp4").read_bytes()
