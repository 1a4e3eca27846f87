"""What a render killed by a lost worker left is cleared before its job renders again: the temporary files of
its video and side files (never another video's), its lock file, and its partial folder unless that holds a
checkpoint the job can resume from; a render still writing is left alone. The progress lines of a batch name the
worker, the jobs left and the ETA."""
from pathlib import Path

import pytest

from helpers import render_request

TOKEN = "0123456789ab"


def leftovers(folder: Path) -> dict:
    """The files a killed render of a.mp4 leaves beside it, and those of b.mp4's render still running."""
    files = {
        "mine": [f".a.mp4.{TOKEN}.part.mp4", f".a.mp4.{TOKEN}.list.txt", f".tmp-{TOKEN}a.render.json",
                 f".tmp-{TOKEN}a.path.png"],
        "others": [f".b.mp4.{TOKEN}.part.mp4", f".tmp-{TOKEN}ba.render.json", "a.mp4.notes", ".a.mp4.partial.bak"],
    }
    for name in files["mine"] + files["others"]:
        (folder / name).write_text("x")
    return files


def killed_render(folder: Path, checkpoint: bool) -> Path:
    """The partial folder and unlocked lock file of a.mp4's segment-mode render whose process was killed."""
    partial = folder / ".a.mp4.partial"
    partial.mkdir()
    (partial / "owner.json").write_text('{"pid": 1, "host": "gone"}')
    (partial / "segment-00000.mp4").write_text("x")
    if checkpoint:
        (partial / "checkpoint.safetensors").write_text("x")
    (folder / ".a.mp4.lock").write_text("1\n")
    return partial


@pytest.mark.parametrize("keep, checkpoint", [(True, True), (True, False), (False, True)])
def test_a_killed_render_is_cleared_and_its_checkpoint_kept_where_it_can_resume(tmp_path, keep, checkpoint):
    from camrender.output.targets import clear_killed_render

    files = leftovers(tmp_path)
    partial = killed_render(tmp_path, checkpoint)
    kept = keep and checkpoint
    assert clear_killed_render(tmp_path / "a.mp4", keep) is kept
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left == sorted(files["others"] + ([".a.mp4.partial"] if kept else []))  # the lock file gone too
    if kept:
        assert sorted(path.name for path in partial.iterdir()) == ["checkpoint.safetensors", "segment-00000.mp4"]


def test_a_render_still_writing_is_left_alone(tmp_path):
    """Another process holding the output's claim (a render that runs on): nothing of it is touched."""
    import subprocess
    import sys

    from camrender.errors import CamrenderError
    from camrender.output.targets import clear_killed_render

    files = leftovers(tmp_path)
    killed_render(tmp_path, checkpoint=False)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom camrender.output.targets import "
                               "claim_output\nclaim = claim_output(sys.argv[1])\nprint('held', flush=True)\n"
                               "time.sleep(60)", str(tmp_path / "a.mp4")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CamrenderError, match="another camrender"):
            clear_killed_render(tmp_path / "a.mp4", keep_checkpoint=False)
    finally:
        holder.kill()
        holder.wait()
    assert set(files["mine"]) <= {path.name for path in tmp_path.iterdir()}
    assert (tmp_path / ".a.mp4.partial" / "segment-00000.mp4").exists()


@pytest.mark.parametrize("mode, refiner, head_split, refused", [
    ("segments", None, 1, None),
    ("segments", "tiny", 1, "--refiner"),
    ("segments", None, 2, "several GPUs per video"),
    ("full", None, 2, None),
])
def test_what_cannot_resume_is_said_in_one_place(mode, refiner, head_split, refused):
    from camrender.api.requests import resume_refusal

    request = render_request(traj=None, mode=mode, model="tiny", refiner=refiner, head_split=head_split)
    refusal = resume_refusal(request)
    assert refusal is None if refused is None else refused in refusal


def test_temporaries_of_a_long_name_leave_look_alikes_alone(tmp_path):
    from camrender.files import temporaries_of

    long = "scene_000_a_very_long_trajectory_name.render.json"  # over 32 characters: atomic_output keeps its tail
    (tmp_path / f".tmp-{TOKEN}{long[-32:]}").write_text("x")
    (tmp_path / f".{long}.{TOKEN}.part.mp4").write_text("x")
    assert [path.name for path in temporaries_of(tmp_path / long)] == [f".{long}.{TOKEN}.part.mp4"]
    assert temporaries_of(tmp_path / "missing" / "a.mp4") == []


def test_progress_lines_name_the_worker_the_jobs_left_and_the_eta():
    from camrender.batch.progress import JobLines

    now, said = [100.0], []
    lines = JobLines(3, said.append, clock=lambda: now[0])
    now[0] = 110.0
    lines({"out": "a.mp4", "status": "done", "frames": 17, "seconds": 3.25, "worker": "w2"})
    now[0] = 4000.0
    lines({"out": "b.mp4", "status": "failed", "reason": "jobs.jsonl line 2: out of memory"})
    lines({"out": "c.mp4", "status": "done", "frames": 1, "seconds": 0.5})
    assert said == ["job 1/3 a.mp4 on w2: done in 3.2 s (17 frames); 2 left, ETA 0:00:20",
                    "job 2/3 b.mp4: failed: out of memory; 1 left, ETA 0:32:30",
                    "job 3/3 c.mp4: done in 0.5 s (1 frame)"]
