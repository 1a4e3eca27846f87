"""--resume verifies every piece of an interrupted render before the model loads: segment files (whole, their
frame counts and size), the checkpoint (whole, its metadata, every tensor's name, shape and dtype against its
tree and fingerprint, its position). What does not verify is rendered again from the start with one note, and
the video equals an uninterrupted render's; a partial folder that is a file or a link is one error line."""
import json
import os
import shutil

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from camrender.output.segment_video import SegmentVideoWriter
from helpers import run_cli
from test_resume import ORBIT

# 6 segments of a 16x16 tiny-model render (frames 1, 8, 8, 8, 8, 8), a checkpoint after every segment
ARGS = ["--traj", str(ORBIT), "--model", "tiny", "--mode", "segments", "--frames", "41", "--height", "16", "--width",
        "16", "--steps", "1", "--segment-frames", "1", "--kernels", "torch", "--checkpoint-every", "0",
        "--prompt-cache", "off"]
STOP_AT = 3  # the interrupted render's checkpoint is at segment 3 (17 frames in segments 0-2)


@pytest.fixture(scope="module")
def renders(tmp_path_factory):
    """(the uninterrupted video, the partial folder an interrupt at segment STOP_AT leaves)."""
    folder = tmp_path_factory.mktemp("renders")
    whole = folder / "whole.mp4"
    with pytest.raises(SystemExit) as done:
        from camrender.cli.main import main
        main(ARGS + ["--out", str(whole), "-q"])
    assert done.value.code == 0
    real_append = SegmentVideoWriter.append

    def interrupted(self, frames):
        if self.next_segment == STOP_AT:
            raise KeyboardInterrupt
        real_append(self, frames)

    SegmentVideoWriter.append = interrupted
    try:
        with pytest.raises(SystemExit) as done:
            main(ARGS + ["--out", str(folder / "v.mp4"), "-q"])
    finally:
        SegmentVideoWriter.append = real_append
    assert done.value.code == 130
    return whole, folder / ".v.mp4.partial"


def frames_of(path):
    return np.stack(list(iio.imiter(path)))


def rewrite_checkpoint(path, tensors=None, metadata=None, drop_metadata=False):
    """Save the checkpoint again with some tensors or metadata changed (tensors: name -> tensor or None)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        meta = dict(handle.metadata() or {})
    stored = load_file(str(path))
    for name, value in (tensors or {}).items():
        if value is None:
            del stored[name]
        else:
            stored[name] = value(stored[name]) if callable(value) else value
    meta.update(metadata or {})
    save_file(stored, str(path), metadata=None if drop_metadata else meta)


def some_tensor(path):
    return sorted(name for name in load_file(str(path)) if name.startswith("root.cache"))[0]


def _truncate(folder, name, keep=0.5):
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[:int(len(data) * keep)])


def _edit_info(folder, **changes):
    from camrender.render.resume import read_checkpoint_info

    info = read_checkpoint_info(folder / "checkpoint.safetensors")
    rewrite_checkpoint(folder / "checkpoint.safetensors", metadata={"camrender.checkpoint": json.dumps({**info,
                                                                                                      **changes})})


DAMAGE = {
    "a segment cut short": (lambda f: _truncate(f, "segment-00001.mp4"), "segment file 1"),
    "a segment of garbage": (lambda f: (f / "segment-00002.mp4").write_bytes(os.urandom(3000)), "segment file 2"),
    "a whole segment of another length": (
        lambda f: shutil.copy(f / "segment-00000.mp4", f / "segment-00001.mp4"), "1 frames, its segment has 8"),
    "a segment missing": (lambda f: (f / "segment-00001.mp4").unlink(), "segment file 1: missing"),
    "a segment that is a folder": (
        lambda f: ((f / "segment-00001.mp4").unlink(), (f / "segment-00001.mp4").mkdir()), "segment file 1"),
    "a segment that is a link": (lambda f: (os.replace(f / "segment-00001.mp4", f / "elsewhere.mp4"),
                                            (f / "segment-00001.mp4").symlink_to(f / "elsewhere.mp4")),
                                 "not a regular file"),
    "a checkpoint without metadata": (
        lambda f: rewrite_checkpoint(f / "checkpoint.safetensors", drop_metadata=True), "unreadable checkpoint"),
    "a checkpoint missing a tensor": (lambda f: rewrite_checkpoint(
        f / "checkpoint.safetensors", {some_tensor(f / "checkpoint.safetensors"): None}), "is missing"),
    "a tensor of another shape": (lambda f: rewrite_checkpoint(
        f / "checkpoint.safetensors", {some_tensor(f / "checkpoint.safetensors"): lambda t: torch.cat([t, t])}),
        "the tree recorded"),
    "a tensor of another dtype": (lambda f: rewrite_checkpoint(
        f / "checkpoint.safetensors", {some_tensor(f / "checkpoint.safetensors"): lambda t: t.double()}),
        "float64"),
    "a checkpoint of another fingerprint": (lambda f: rewrite_checkpoint(
        f / "checkpoint.safetensors", metadata={"camrender.layout_sha256": "0" * 64}), "fingerprint"),
    "a checkpoint that is a FIFO": (lambda f: ((f / "checkpoint.safetensors").unlink(),
                                               os.mkfifo(f / "checkpoint.safetensors")), "not a regular file"),
    "a segment that is a FIFO": (lambda f: ((f / "segment-00001.mp4").unlink(), os.mkfifo(f / "segment-00001.mp4")),
                                 "not a regular file"),
    "a checkpoint cut short": (lambda f: _truncate(f, "checkpoint.safetensors", 0.9), "unreadable checkpoint"),
    "a checkpoint of garbage": (
        lambda f: (f / "checkpoint.safetensors").write_bytes(os.urandom(5000)), "unreadable checkpoint"),
    "metadata that miscounts the frames": (lambda f: _edit_info(f, frames_written=99), "metadata says 99"),
    "metadata at another position": (lambda f: _edit_info(f, next_segment=2), "disagree on the position"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_what_does_not_verify_is_rendered_again_with_a_note(tmp_path, capsys, renders, damage):
    whole, partial = renders
    folder = tmp_path / ".v.mp4.partial"
    shutil.copytree(partial, folder)
    spoil, reason = DAMAGE[damage]
    spoil(folder)
    code, _, err = run_cli(ARGS + ["--out", tmp_path / "v.mp4", "--resume"], capsys)
    assert code == 0 and "Traceback" not in err, err
    notes = [line for line in err.splitlines() if "cannot resume" in line]
    assert len(notes) == 1 and reason in notes[0] and "rendering from the start" in notes[0], err
    assert err.index("cannot resume") < err.index("loading")  # decided before the model loads
    assert np.array_equal(frames_of(tmp_path / "v.mp4"), frames_of(whole))
    assert not folder.exists()


def test_an_intact_folder_still_resumes(tmp_path, capsys, renders):
    """(its owner.json naming a live process, as a pid reused after a kill does: the output's lock says no
    render holds it)"""
    import socket

    whole, partial = renders
    shutil.copytree(partial, tmp_path / ".v.mp4.partial")
    (tmp_path / ".v.mp4.partial" / "owner.json").write_text(json.dumps({"pid": 1, "host": socket.gethostname()}))
    code, _, err = run_cli(ARGS + ["--out", tmp_path / "v.mp4", "--resume"], capsys)
    assert code == 0 and "cannot resume" not in err, err
    assert np.array_equal(frames_of(tmp_path / "v.mp4"), frames_of(whole))


def test_a_damaged_checkpoint_without_resume_is_one_line(tmp_path, capsys, renders):
    shutil.copytree(renders[1], tmp_path / ".v.mp4.partial")
    _truncate(tmp_path / ".v.mp4.partial", "checkpoint.safetensors")
    code, _, err = run_cli(ARGS + ["--out", tmp_path / "v.mp4"], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "--resume" in lines[0] and "Traceback" not in err, err


@pytest.mark.parametrize("kind", ["file", "link to a folder", "dangling link"])
@pytest.mark.parametrize("resume", [False, True])
def test_a_partial_folder_that_is_not_a_folder_is_one_line(tmp_path, capsys, kind, resume):
    partial = tmp_path / ".v.mp4.partial"
    if kind == "file":
        partial.write_text("not a folder")
    elif kind == "link to a folder":
        (tmp_path / "elsewhere").mkdir()
        partial.symlink_to(tmp_path / "elsewhere")
    else:
        partial.symlink_to(tmp_path / "missing")
    before = sorted(os.listdir(tmp_path))
    code, _, err = run_cli(ARGS + ["--out", tmp_path / "v.mp4"] + (["--resume"] if resume else []), capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and ".v.mp4.partial" in lines[0] and "Traceback" not in err, err
    assert "loading" not in err and sorted(os.listdir(tmp_path)) == before
