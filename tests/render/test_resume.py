"""Interrupted renders: SIGKILL mid segment-mode render, --resume, the same video; checkpoints of the
render state; SIGINT / SIGTERM cleanup; --from-render reproduces a video."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch

import helpers
from camrender.cli.main import main

REPO = Path(__file__).resolve().parents[2]
ORBIT = REPO / "trajectories" / "orbit.json"
# 13 segments of a 32x32 tiny-model render on the PyTorch path (seconds on a CPU)
SEGMENT_ARGS = ["--traj", str(ORBIT), "--model", "tiny", "--mode", "segments", "--frames", "105", "--height", "32",
                "--width", "32", "--steps", "8", "--segment-frames", "1", "--kernels", "torch",
                "--checkpoint-every", "0"]


def run_cli(argv, capsys):
    code, _, err = helpers.run_cli(argv, capsys)
    return code, err


def error_lines(err):
    return [line for line in err.splitlines() if line.strip() and not line.startswith("camrender: loading")]


def frames_of(path):
    return np.stack(list(iio.imiter(path)))


def _default_sigint():
    # a child started from a shell job (`&`) inherits SIGINT ignored; Python then installs no handler
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_cli(args, **kwargs):
    env = dict(os.environ, TRITON_INTERPRET="0", OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "camrender.cli.main", *map(str, args)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigint, **kwargs)


def wait_for(condition, process, seconds=120):
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted segment-mode render of SEGMENT_ARGS."""
    out = tmp_path_factory.mktemp("whole") / "whole.mp4"
    with pytest.raises(SystemExit) as done:
        main(SEGMENT_ARGS + ["--out", str(out)])
    assert done.value.code == 0
    return out


def test_sigkill_then_resume_equals_the_uninterrupted_render(tmp_path, capsys, whole):
    from camrender.render.resume import read_checkpoint_info

    work = tmp_path / "work"
    work.mkdir()
    out = work / "v.mp4"
    partial = work / ".v.mp4.partial"
    checkpoint = partial / "checkpoint.safetensors"
    process = start_cli(SEGMENT_ARGS + ["--out", out])
    try:
        wait_for(lambda: checkpoint.exists() and read_checkpoint_info(checkpoint)["next_segment"] >= 3, process)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert not out.exists() and partial.is_dir()
    stopped_at = read_checkpoint_info(checkpoint)["next_segment"]
    assert 3 <= stopped_at < 13

    # a plain run lists the partial folder with both commands and deletes nothing
    code, err = run_cli(SEGMENT_ARGS + ["--out", out], capsys)
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and "--resume" in lines[0] and "rm -r --" in lines[0], err
    assert checkpoint.exists()
    # other settings: refused before loading, with the difference named
    code, err = run_cli(SEGMENT_ARGS + ["--out", out, "--resume", "--seed", "5"], capsys)
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and "seed: 0 in the checkpoint, 5 now" in lines[0], err
    assert "loading" not in err

    code, err = run_cli(SEGMENT_ARGS + ["--out", out, "--resume"], capsys)
    assert code == 0, err
    assert np.array_equal(frames_of(out), frames_of(whole))  # every decoded frame, bit for bit
    assert not partial.exists()  # checkpoints removed on completion
    assert sorted(p.name for p in work.iterdir()) == ["v.mp4", "v.path.png", "v.render.json", "v.traj.json"]


def test_interrupt_keeps_the_checkpoint_and_resume_finishes(tmp_path, capsys, monkeypatch, whole):
    """Ctrl-C (here raised in place of the third segment's write) after checkpoints: the folder stays,
    the message gives the command, and --resume completes the same video."""
    from camrender.output.segment_video import SegmentVideoWriter

    real_append = SegmentVideoWriter.append

    def interrupted(self, frames):
        if self.next_segment == 2:
            raise KeyboardInterrupt
        real_append(self, frames)

    monkeypatch.setattr(SegmentVideoWriter, "append", interrupted)
    out = tmp_path / "v.mp4"
    code, err = run_cli(SEGMENT_ARGS + ["--out", out], capsys)
    assert code == 130 and "--resume" in err and "Traceback" not in err, err
    partial = tmp_path / ".v.mp4.partial"
    assert sorted(p.name for p in partial.iterdir()) == ["checkpoint.safetensors", "segment-00000.mp4",
                                                         "segment-00001.mp4"]
    monkeypatch.setattr(SegmentVideoWriter, "append", real_append)
    code, err = run_cli(SEGMENT_ARGS + ["--out", out, "--resume"], capsys)
    assert code == 0, err
    assert np.array_equal(frames_of(out), frames_of(whole)) and not partial.exists()


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_signals_leave_no_partial_video(tmp_path, sig, code, word):
    work = tmp_path / "work"
    work.mkdir()
    process = start_cli(["--traj", ORBIT, "--out", work / "v.mp4", "--model", "tiny", "--steps", "400",
                         "--kernels", "torch", "--frames", "17", "--height", "32", "--width", "32"])
    try:
        wait_for(lambda: any(p.name.endswith(".part.mp4") for p in work.iterdir()), process)
        process.send_signal(sig)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == code, err
    assert word in err and "Traceback" not in err
    assert list(work.iterdir()) == []


def test_killed_render_leftovers_are_listed_not_deleted(tmp_path, capsys):
    stale = tmp_path / ".v.mp4.abc123.part.mp4"
    stale.write_bytes(b"partial")
    other = tmp_path / ".old.mp4.partial"
    other.mkdir()
    (other / "segment-00000.mp4").write_bytes(b"segment")
    code, err = run_cli(["--traj", ORBIT, "--out", tmp_path / "v.mp4", "--model", "tiny", "--frames", "9",
                         "--height", "32", "--width", "32", "--steps", "1", "--kernels", "torch"], capsys)
    assert code == 0, err
    assert stale.exists() and f"rm -- {stale}" in err
    assert (other / "segment-00000.mp4").exists() and f"rm -r -- {other}" in err and "--resume" in err


def test_resume_of_nothing_renders_from_the_start_and_full_mode_refuses(tmp_path, capsys):
    code, err = run_cli(["--traj", ORBIT, "--out", tmp_path / "v.mp4", "--model", "tiny", "--resume"], capsys)
    assert code == 2 and "--mode segments" in err and list(tmp_path.iterdir()) == []


def test_resume_without_a_checkpoint_starts_over_with_a_note(tmp_path, capsys):
    """Killed before its first checkpoint: the partial folder holds segments only; --resume renders from the
    start (nothing would be lost) and says so in one line."""
    out = tmp_path / "v.mp4"
    folder = tmp_path / ".v.mp4.partial"
    folder.mkdir()
    (folder / "segment-00000.mp4").write_bytes(b"half a segment")
    args = ["--traj", ORBIT, "--out", out, "--model", "tiny", "--mode", "segments", "--frames", "9", "--height", "32",
            "--width", "32", "--steps", "1", "--kernels", "torch", "--progress", "none"]
    code, err = run_cli(args, capsys)  # without --resume: refused, the folder kept
    assert code == 2 and "--resume" not in err.split("remove it")[0] and folder.exists()
    code, err = run_cli(args + ["--resume"], capsys)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "nothing to resume" in line]
    assert len(notes) == 1 and "no checkpoint" in notes[0] and "from the start" in notes[0]
    assert len(frames_of(out)) == 9 and not folder.exists()


def test_a_folder_without_a_checkpoint_is_told_alike_by_every_run(tmp_path):
    """A render killed before its first checkpoint: a plain re-run, --resume and a render of another video in
    the same folder describe its folder in the same words and give the same advice (nothing to resume)."""
    from types import SimpleNamespace

    from camrender.errors import CamrenderError
    from camrender.render.resume import NO_CHECKPOINT, check_partials

    folder = tmp_path / ".v.mp4.partial"
    folder.mkdir()
    (folder / "segment-00000.mp4").write_bytes(b"half a segment")
    said = []
    assert check_partials(SimpleNamespace(out=tmp_path / "w.mp4", mode="segments"), False, said.append) is None
    with pytest.raises(CamrenderError) as plain:
        check_partials(SimpleNamespace(out=tmp_path / "v.mp4", mode="segments"), False, said.append)
    assert check_partials(SimpleNamespace(out=tmp_path / "v.mp4", mode="segments"), True, said.append) is None
    other, resumed = said
    for text in (other, str(plain.value), resumed):
        assert str(folder) in text and f"({NO_CHECKPOINT})" in text, text
    for text in (other, str(plain.value)):
        assert f"remove it: rm -r -- {folder} (or " in text and "--resume, which starts over)" in text
    assert "removed it, rendering from the start" in resumed and not folder.exists()


def test_from_render_reproduces_the_video(tmp_path, capsys):
    first = tmp_path / "a.mp4"
    code, err = run_cli(["--traj", ORBIT, "--out", first, "--model", "tiny", "--frames", "17", "--height", "32",
                         "--width", "48", "--steps", "2", "--seed", "4", "--prompt", "a hall", "--kernels", "torch"],
                        capsys)
    assert code == 0, err
    record = json.loads((tmp_path / "a.render.json").read_text())
    assert record["settings"]["seed"] == 4 and record["settings"]["steps"] == 2
    assert record["settings"]["prompt"] == "a hall" and record["settings"]["kernels"] == "torch"
    again = tmp_path / "b.mp4"
    code, err = run_cli(["render", "--from-render", tmp_path / "a.render.json", "--out", again], capsys)
    assert code == 0, err
    assert np.array_equal(frames_of(again), frames_of(first))
    # options given on the command line win over the file
    code, err = run_cli(["render", "--from-render", tmp_path / "a.render.json", "--out", tmp_path / "c.mp4",
                         "--seed", "5"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "c.render.json").read_text())["settings"]["seed"] == 5


def test_checkpoint_tree_round_trip_covers_new_fields(tmp_path):
    """The cache is saved by walking its fields: a field added later (here a subclass's) is kept."""
    from camrender.model.stage1.segments import BlockCache, SegmentCache, SoftmaxKV
    from camrender.render.state_io import load_tree, save_tree

    base = torch.arange(40.0).view(2, 20)
    cache = SegmentCache(blocks=[
        BlockCache(kv_state=torch.randn(1, 2, 4, 4), key_tail=base[:, 5:9]),  # a view of a larger tensor
        BlockCache(sink=SoftmaxKV(torch.randn(1, 2, 3, 4).bfloat16(), torch.randn(1, 2, 3, 4), None, None),
                   recent=[SoftmaxKV(*(torch.randn(2) for _ in range(4)))]),
        ExtendedBlockCache(conv_tail=torch.randn(3, 2)),
    ], next_frame=7)
    tree = {"cache": cache, "decoder": {"latent_frames": 3, "tails": [None, torch.ones(2)]}, "next_segment": 2}
    size = save_tree(tmp_path / "c.safetensors", tree)
    assert size < 4000  # the view's 8 values were saved, not its 40-value base
    loaded, _ = load_tree(tmp_path / "c.safetensors")
    assert loaded["next_segment"] == 2 and loaded["decoder"]["tails"][0] is None
    got = loaded["cache"]
    assert got.next_frame == 7 and isinstance(got.blocks[2], ExtendedBlockCache)
    for want_block, got_block in zip(cache.blocks, got.blocks):
        for field in dataclasses.fields(want_block):
            want, have = getattr(want_block, field.name), getattr(got_block, field.name)
            if isinstance(want, torch.Tensor):
                assert have.dtype == want.dtype and torch.equal(have, want)
    assert torch.equal(got.blocks[1].sink.key, cache.blocks[1].sink.key)
    assert torch.equal(got.blocks[1].recent[0].cam_value, cache.blocks[1].recent[0].cam_value)


@dataclasses.dataclass
class ExtendedBlockCache:
    """Stands for a cache class another change adds fields to (defined in a test module, so it is
    only rebuilt because the test allows it below)."""

    conv_tail: torch.Tensor = None


@pytest.fixture(autouse=True)
def _allow_test_classes(monkeypatch):
    import camrender.render.state_io

    monkeypatch.setattr(camrender.render.state_io, "ALLOWED_MODULE_PREFIX", ("camrender.", __name__))


def test_checkpoint_refuses_classes_outside_camrender(tmp_path):
    from camrender.render.state_io import _dataclass

    with pytest.raises(ValueError, match="not a camrender class"):
        _dataclass("subprocess:Popen")


def test_checkpoint_naming_a_class_this_version_lacks_is_refused_in_one_line(tmp_path):
    """A checkpoint written before a cache class moved (camrender.model.state, now model/stage1/state) names
    a module this version lacks: --resume stops with one line saying how to remove it, not a traceback."""
    from safetensors.torch import save_file

    from camrender.errors import CamrenderError
    from camrender.render.resume import Checkpointer
    from camrender.render.state_io import _SKELETON_KEY

    skeleton = {"dict": {"cache": {"dataclass": "camrender.model.state:SegmentCache", "fields": {}}}}
    folder = tmp_path / ".v.mp4.partial"
    folder.mkdir()
    save_file({"x": torch.zeros(1)}, folder / "checkpoint.safetensors", metadata={_SKELETON_KEY: json.dumps(skeleton)})
    checkpointer = Checkpointer(folder, settings={}, resume_info={"next_segment": 1, "frames_written": 9})
    with pytest.raises(CamrenderError) as refused:
        checkpointer.restore(cache=None, decoder=None, device="cpu")
    message = str(refused.value)
    assert "camrender.model.state:SegmentCache" in message and "another camrender version" in message
    assert "rm -r --" in message and "\n" not in message
