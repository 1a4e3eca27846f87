"""What a render killed by a lost worker left is cleared before its job renders again: the temporary files of
its video and side files (never another video's), and its partial folder unless that holds a checkpoint the job
can resume from. The progress lines of a batch name the worker, the jobs left and the ETA."""
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


@pytest.mark.parametrize("mode, refiner, checkpoint, kept", [
    ("segments", None, True, True),  # resumes from its checkpoint
    ("segments", None, False, False),  # killed before its first checkpoint: starts over
    ("segments", "tiny", True, False),  # the refiner's state is not checkpointed: starts over
    ("full", None, False, False),
])
def test_a_killed_render_is_cleared_and_its_checkpoint_kept_where_it_can_resume(tmp_path, mode, refiner,
                                                                               checkpoint, kept):
    from camrender.api.output import clear_killed_render

    files = leftovers(tmp_path)
    partial = tmp_path / ".a.mp4.partial"
    partial.mkdir()
    (partial / "owner.json").write_text('{"pid": 1, "host": "gone"}')
    (partial / "segment-00000.mp4").write_text("x")
    if checkpoint:
        (partial / "checkpoint.safetensors").write_text("x")
    request = render_request(traj=None, out=tmp_path / "a.mp4", mode=mode, model="tiny", refiner=refiner)
    assert clear_killed_render(request) is kept
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left == sorted(files["others"] + ([".a.mp4.partial"] if kept else []))
    if kept:
        assert sorted(path.name for path in partial.iterdir()) == ["checkpoint.safetensors", "segment-00000.mp4"]


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
