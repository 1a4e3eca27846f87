"""The dispatcher of `camrender serve` (`camrender.serve.worker.Dispatcher`) on a store, with renderers the tests
write (no pipeline): a job that cannot be planned fails once and the slot goes on, a stop leaves no job in
progress, a failed or cancelled job leaves nothing its render made, a video written whole before a kill is not
rendered again."""
import threading
import time

import numpy as np
import pytest

from camrender.errors import CamrenderError
from camrender.output.targets import companion_path
from camrender.output.video import VideoWriter
from camrender.render.load_settings import LoadSettings
from camrender.render.resume import CHECKPOINT_NAME, partial_folder
from camrender.render.settings_file import write_render_json
from camrender.serve import worker
from camrender.serve.jobs import VIDEO, JobRules, accept, new_id, plan_job
from camrender.serve.store import JobStore
from camrender.serve.worker import Dispatcher

RULES = JobRules(LoadSettings.create("tiny"), None, 1 << 20)
BODY = {"trajectory": "w-8", "size": "32x32", "num_frames": 9}


@pytest.fixture
def store(tmp_path):
    opened = JobStore(tmp_path / "store")
    yield opened
    opened.close()


def queue(store, body=BODY) -> str:
    """A job accepted as the server accepts one (its inputs in its folder) and queued: its id."""
    job_id = new_id()
    accepted = accept(body, store.folder_of(job_id), RULES)
    store.add(job_id, accepted.spec, accepted.summary, time.time(), 100)
    return job_id


class Renderer:
    """One slot rendering with `render(job, progress)` (the test's)."""

    slots = 1

    def __init__(self, render):
        self.render = render

    def close(self):
        pass


def dispatcher(store, render, log=None) -> Dispatcher:
    return Dispatcher(store, Renderer(render), RULES, checkpoint_every=0.0,
                      log=(lambda line: None) if log is None else log.append)


def recording(rendered: list):
    """A render that only notes the job's id."""
    return lambda job, progress: rendered.append(job.id) or 0


def wait_until(condition, timeout=20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.02)


@pytest.mark.parametrize("where, error", [("plan_job", KeyError("spec")),
                                          ("rerun_state", OSError(5, "Input/output error"))])
def test_a_job_that_cannot_be_planned_fails_once_and_the_next_job_runs(store, monkeypatch, where, error):
    broken, good = queue(store), queue(store)
    real = getattr(worker, where)

    def failing(first, *args):
        if broken in str(getattr(first, "out", args[0] if args else "")):
            raise error
        return real(first, *args)

    monkeypatch.setattr(worker, where, failing)
    rendered, log = [], []
    running = dispatcher(store, recording(rendered), log)
    running.start()
    try:
        wait_until(lambda: store.get(good).status == "completed")
    finally:
        running.stop(5.0)
    failed = store.get(broken)
    assert failed.status == "failed" and failed.error["message"].startswith(type(error).__name__), failed.error
    assert rendered == [good]
    assert sum("Traceback" in line for line in log) == 1


@pytest.mark.parametrize("then", ["check", "finish", "raise"])
def test_a_render_still_running_after_the_grace_goes_back_to_the_queue_uncounted(store, then):
    job_id = queue(store)
    started, release = threading.Event(), threading.Event()
    checkpoint = partial_folder(store.folder_of(job_id) / VIDEO) / CHECKPOINT_NAME

    def render(job, progress):
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_bytes(b"a segment-mode checkpoint")
        started.set()
        release.wait(30)
        if then == "check":
            progress.check()  # the stop lands: JobStopped
        if then == "raise":
            raise RuntimeError("CUDA error: the process is shutting down")  # neither fails the job nor clears
        return 0  # else the render ends as if it wrote its video

    running = dispatcher(store, render)
    running.start()
    assert started.wait(30)
    running.stop(0.1)  # the render does not reach its next check in time
    job = store.get(job_id)
    assert (job.status, job.attempts) == ("queued", 0)
    release.set()
    wait_until(lambda: not running.busy())
    job = store.get(job_id)
    assert (job.status, job.attempts) == ("queued", 0)
    assert (store.folder_of(job_id) / job.spec["trajectory"]).is_file()  # its inputs stay for the next start
    assert checkpoint.is_file()  # and what the next start resumes from


def test_a_failed_job_keeps_its_inputs_and_nothing_its_render_left(store):
    job_id = queue(store, {**BODY, "mode": "segments"})

    def render(job, progress):
        work = partial_folder(job.request.out)
        work.mkdir()
        (work / CHECKPOINT_NAME).write_bytes(b"state")
        (work / "segment-00000.mp4").write_bytes(b"segment")
        (job.request.out.parent / f".{VIDEO}.{'0' * 12}.part.mp4").write_bytes(b"half a video")
        raise CamrenderError("out of memory")

    running = dispatcher(store, render)
    running.start()
    try:
        wait_until(lambda: store.get(job_id).status == "failed")
    finally:
        running.stop(5.0)
    assert store.get(job_id).error["message"] == "out of memory"
    assert sorted(path.name for path in store.folder_of(job_id).iterdir()) == ["input"]


def test_a_job_cancelled_before_its_render_starts_leaves_no_files(store, monkeypatch):
    job_id = queue(store)
    real = worker.rerun_state

    def cancelled_meanwhile(request, checkpoint_every):
        store.cancel(job_id)  # a DELETE now: the slot has the job, so its handler leaves the files to the slot
        return real(request, checkpoint_every)

    monkeypatch.setattr(worker, "rerun_state", cancelled_meanwhile)
    rendered = []
    running = dispatcher(store, recording(rendered))
    running.start()
    try:
        wait_until(lambda: not store.folder_of(job_id).exists())
    finally:
        running.stop(5.0)
    assert store.get(job_id).status == "cancelled" and rendered == []


def test_a_video_written_whole_before_a_kill_completes_without_a_render(store):
    whole, cut = queue(store), queue(store)
    for job_id in (whole, cut):
        request = plan_job(store.get(job_id).spec, store.folder_of(job_id), RULES)
        with VideoWriter(request.out, fps=request.fps) as video:
            video.append(np.zeros((request.num_frames, request.height, request.width, 3), np.uint8))
        write_render_json(request, companion_path(request.out, ".render.json"))
        assert store.start(job_id, time.time())  # its render wrote it all; the kill came before the store heard
    video = store.folder_of(cut) / VIDEO
    video.write_bytes(video.read_bytes()[:-100])  # not whole: rendered again
    store.requeue_interrupted()
    rendered = []
    running = dispatcher(store, recording(rendered))
    running.start()
    try:
        wait_until(lambda: store.counts()["completed"] == 2)
    finally:
        running.stop(5.0)
    assert rendered == [cut]
    assert store.get(whole).progress == 100 and (store.folder_of(whole) / VIDEO).is_file()
