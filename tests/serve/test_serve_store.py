"""The parts of `camrender serve` below HTTP: the job store (schema, WAL, one server per store, transitions, purge),
a job's progress, what a rerun keeps, the compatibility table of docs/serve.md, and the command's own bad options
(one line, exit 2, before loading)."""
import os
import re
import socket
import sqlite3
import time
from pathlib import Path

import pytest

from camrender.api.requests import plan_request
from camrender.errors import CamrenderError
from camrender.render.load_settings import LoadSettings
from camrender.render.resume import partial_folder
from camrender.serve.fields import compatibility_tables
from camrender.serve.progress import JobProgress, JobStopped
from camrender.serve.store import APPLICATION_ID, DATABASE, SCHEMA_VERSION, JobStore, QueueFull
from camrender.serve.worker import rerun_state
from helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
SUMMARY = {"size": "32x32", "seconds": "1", "prompt": "", "num_frames": 17, "fps": 16.0, "seed": 0, "mode": "full",
           "notes": [], "user": None}


@pytest.fixture
def store(tmp_path):
    opened = JobStore(tmp_path / "store")
    yield opened
    opened.close()


def add(store, job_id, created=None, max_queue=100):
    store.folder_of(job_id).mkdir(parents=True, exist_ok=True)
    return store.add(job_id, {"options": {}}, SUMMARY, time.time() if created is None else created, max_queue)


def test_a_new_store_is_wal_with_its_schema_version(store):
    db = sqlite3.connect(store.folder / DATABASE)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    finally:
        db.close()


def test_one_server_per_store_and_reopening_keeps_the_jobs(tmp_path):
    first = JobStore(tmp_path / "store")
    add(first, "video_" + "1" * 32)
    with pytest.raises(CamrenderError, match="another camrender serve") as refused:
        JobStore(tmp_path / "store")
    assert refused.value.field == "store"
    first.close()
    again = JobStore(tmp_path / "store")
    try:
        assert again.get("video_" + "1" * 32).status == "queued"
    finally:
        again.close()


def test_transitions(store):
    ids = [f"video_{n:032x}" for n in range(3)]
    for job_id in ids:
        add(store, job_id, max_queue=3)
    with pytest.raises(QueueFull):
        add(store, "video_" + "f" * 32, max_queue=3)
    assert store.next_queued().id == ids[0] and store.next_queued(skip={ids[0]}).id == ids[1]
    assert store.start(ids[0], time.time()) and not store.start(ids[0], time.time())
    store.report(ids[0], progress=40, segments_done=2, segments_total=5, eta_s=3.0)
    assert (store.get(ids[0]).progress, store.get(ids[0]).segments_done) == (40, 2)
    assert store.cancel(ids[1]) == "queued" and store.cancel(ids[1]) is None
    assert not store.start(ids[1], time.time())  # a cancelled job never starts
    assert store.requeue_interrupted() == [ids[0]] and store.get(ids[0]).status == "queued"
    assert store.start(ids[0], time.time()) and store.get(ids[0]).attempts == 2
    assert store.finish(ids[0], "completed", inference_s=1.5)
    assert not store.finish(ids[0], "failed")  # finished already
    assert store.counts() == {"queued": 1, "in_progress": 0, "completed": 1, "failed": 0, "cancelled": 1}
    assert store.render_seconds() == [1.5]
    newest, more = store.page(None, 2)
    assert [job.id for job in newest] == [ids[2], ids[1]] and more
    assert [job.id for job in store.page(ids[1], 2)[0]] == [ids[0]]
    assert [job.id for job in store.page(None, 5, newest_first=False)[0]] == ids
    with pytest.raises(KeyError):
        store.page("video_" + "e" * 32, 2)


def test_purge_removes_old_finished_jobs_and_stray_folders(store):
    old, recent, waiting, busy = (f"video_{n:032x}" for n in range(4))
    for job_id in (old, recent, waiting, busy):
        add(store, job_id, created=time.time() - 30 * 86400)
    for job_id in (old, recent, busy):
        store.start(job_id, time.time())
        store.finish(job_id, "completed", inference_s=1.0)
    db = store._db()
    db.execute("UPDATE jobs SET completed_at = ? WHERE id IN (?, ?)", (time.time() - 8 * 86400, old, busy))
    stray = store.folder_of("video_" + "9" * 32)
    stray.mkdir()
    os.utime(stray, (time.time() - 8 * 86400,) * 2)
    fresh_stray = store.folder_of("video_" + "8" * 32)  # a submission still writing its uploads
    fresh_stray.mkdir()
    assert store.purge(time.time() - 7 * 86400, busy={busy}) == [old, busy]
    assert store.get(old) is None and not store.folder_of(old).exists()
    assert store.get(busy) is None and store.folder_of(busy).exists()  # its render lets the folder go
    assert store.get(recent) and store.get(waiting) and not stray.exists() and fresh_stray.exists()


def test_purge_goes_on_past_a_folder_removed_meanwhile(store, monkeypatch):
    stray = store.folder_of("video_" + "9" * 32)
    stray.mkdir()
    os.utime(stray, (time.time() - 8 * 86400,) * 2)
    gone = store.folder_of("video_" + "7" * 32)  # listed, then removed (a render letting a deleted job's folder go)
    listed = Path.iterdir
    monkeypatch.setattr(Path, "iterdir", lambda folder: iter([gone, *listed(folder)]))
    assert store.purge(time.time() - 7 * 86400) == [] and not stray.exists()


def test_a_job_is_on_disk_with_its_folders_before_it_is_stored(tmp_path, monkeypatch):
    from camrender import files
    from camrender.serve.jobs import JobRules, accept

    flushed = []
    flush = files.fsync_path
    monkeypatch.setattr(files, "fsync_path", lambda path: (flushed.append(Path(path)), flush(path)))
    folder = tmp_path / "jobs" / ("video_" + "1" * 32)
    accept({"trajectory": "w-8", "size": "32x32"}, folder, JobRules(LoadSettings.create("tiny"), None, 1 << 20))
    folders = {path for path in flushed if path.is_dir()}  # each holds a new entry: a folder, or a renamed upload
    assert {tmp_path / "jobs", folder, folder / "input", folder / "input" / "path"} <= folders


@pytest.mark.parametrize("make, words", [
    (lambda path: path.write_text("not a folder"), "is not a folder"),
    (lambda path: (path.mkdir(), (path / DATABASE).write_bytes(b"garbage" * 200)), "not a database"),
    (lambda path: (path.mkdir(), _sqlite(path / DATABASE, 0, 1)), "is not a camrender job store"),
    (lambda path: (path.mkdir(), _sqlite(path / DATABASE, APPLICATION_ID, SCHEMA_VERSION + 1)),
     f"schema version {SCHEMA_VERSION + 1}"),
])
def test_a_store_that_cannot_be_used_is_one_line_exit_2_before_loading(tmp_path, capsys, make, words):
    store = tmp_path / "store"
    make(store)
    code, out, err = run_cli(["serve", "--model", "tiny", "--store", store], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert words in err and "store" in err and "loading" not in err and "Traceback" not in err


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs a folder that refuses new files (/sys)")
def test_a_store_that_refuses_new_files_is_one_line_exit_2(capsys):
    code, out, err = run_cli(["serve", "--model", "tiny", "--store", "/sys/kernel"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "store: cannot create the store" in err and "loading" not in err


def _sqlite(path, application, version):
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE other (x)")
    db.execute(f"PRAGMA application_id = {application}")
    db.execute(f"PRAGMA user_version = {version}")
    db.commit()
    db.close()


@pytest.mark.parametrize("args, words", [
    (["--keep", "7x"], "keep"), (["--keep", "0d"], "keep"), (["--token-file", "missing.txt"], "token-file"),
    (["--max-body-mb", "0"], "max-body-mb"), (["--max-image-mb", "nan"], "max-image-mb"),
    (["--checkpoint-every", "nan"], "checkpoint-every"), (["--port", "70000"], "port"),
    (["--refiner-window", "3"], "refiner"), (["--device", "cuda:9"], "device"),
])
def test_bad_options_are_one_line_exit_2_before_loading(tmp_path, capsys, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["serve", "--model", "tiny", "--store", tmp_path / "store", *args], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert "loading" not in err and "Traceback" not in err and not (tmp_path / "store").exists()


def test_an_address_or_port_it_cannot_listen_on_is_refused_before_loading(tmp_path, capsys):
    for args, words in ((["--host", "192.0.2.1"], "no interface"), (["--host", "no-such-host.invalid"], "host")):
        code, _, err = run_cli(["serve", "--model", "tiny", "--store", tmp_path / "store", *args], capsys)
        assert code == 2 and words in err and "loading" not in err, err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code, _, err = run_cli(["serve", "--model", "tiny", "--store", tmp_path / "store", "--port",
                                taken.getsockname()[1]], capsys)
        assert code == 2 and "in use" in err and "loading" not in err, err


def test_a_short_token_file_is_refused(tmp_path, capsys):
    (tmp_path / "token").write_text("short\n")
    code, _, err = run_cli(["serve", "--model", "tiny", "--store", tmp_path / "store", "--token-file",
                            tmp_path / "token"], capsys)
    assert code == 2 and "at least 16 characters" in err


def test_progress_percent_segments_eta_and_stops():
    clock = iter(range(100))
    written, stop = [], [None]
    progress = JobProgress(lambda **fields: written.append(fields), lambda: stop[0], refiner=True,
                           clock=lambda: float(next(clock)), interval=2.0)
    for step in range(1, 5):
        progress(step, 4, stage="stage 1", unit="step")
    assert [fields["progress"] for fields in written] == [17, 51, 69]  # the first, then every 2 s, and the last
    assert written[-1]["eta_s"] == 0.0 and written[0]["eta_s"] == 3.0
    progress(1, 10, stage="stage 2 (refiner)", unit="block")
    progress(10, 10, stage="stage 2 (refiner)", unit="block")
    assert written[-1]["progress"] == 99 and "segments_done" not in written[-1]
    segments = JobProgress(lambda **fields: written.append(fields), lambda: stop[0], refiner=False,
                           clock=lambda: float(next(clock)))
    segments(5, 13, stage="stage 1", unit="segment")  # a resumed render's first report: 4 segments were done
    assert (written[-1]["segments_done"], written[-1]["segments_total"], written[-1]["progress"]) == (5, 13, 38)
    assert written[-1]["eta_s"] == 8.0
    stop[0] = "cancelled"
    with pytest.raises(JobStopped, match="cancelled"):
        segments(6, 13, stage="stage 1", unit="segment")
    with pytest.raises(JobStopped):
        segments.check()


def test_a_rerun_keeps_a_checkpoint_and_nothing_else(tmp_path):
    load = LoadSettings.create("tiny")
    full = plan_request(load, "w-16", out=tmp_path / "video.mp4", frames=17, width=32, height=32)
    left = [tmp_path / ".video.mp4.0123456789ab.part.mp4",  # a full-mode render killed while it wrote
            tmp_path / ".tmp-0123456789abvideo.render.json", tmp_path / ".video.mp4.lock"]  # ... its side files
    for path in left:
        path.write_bytes(b"partial")
    assert rerun_state(full, 0.0) is False and not any(path.exists() for path in left)
    segments = plan_request(load, "w-16", out=tmp_path / "video.mp4", frames=17, width=32, height=32,
                            mode="segments")
    folder = partial_folder(segments.out)
    folder.mkdir()
    (folder / "segment-00000.mp4").write_bytes(b"x")  # killed before its first checkpoint: starts over
    assert rerun_state(segments, 0.0) is False and not folder.exists()


def test_docs_compatibility_tables_are_the_parsers():
    text = (REPO / "docs" / "serve.md").read_text()
    match = re.search(r"<!-- generated by camrender\.serve\.fields\.compatibility_tables[^>]*-->\n(.*?)\n\n<!-- end",
                      text, re.S)
    assert match, "docs/serve.md has no generated compatibility tables"
    assert match.group(1) == compatibility_tables()


def test_a_job_is_planned_again_identically_and_only_on_its_settings(tmp_path):
    from camrender.serve.jobs import JobRules, accept, plan_job

    rules = JobRules(LoadSettings.create("tiny"), None, 1 << 20)
    body = {"prompt": "a street", "trajectory": "w-16", "size": "32x32", "seed": 4,
            "extra_params": {"sana_wm": {"intrinsics": {"fx": 20, "fy": 20, "cx": 16, "cy": 16}}}}
    accepted = accept(body, tmp_path / "job", rules)
    first = plan_job(accepted.spec, tmp_path / "job", rules)
    assert (first.width, first.height, first.seed, first.num_frames) == (32, 32, 4, 17)
    assert first.traj.intrinsics[0].tolist() == [20.0, 20.0, 16.0, 16.0]
    again = plan_job(accepted.spec, tmp_path / "job", rules)
    assert again.traj.c2w.tolist() == first.traj.c2w.tolist() and again.out == first.out == tmp_path / "job" / "video.mp4"
    bench = accept({"trajectory": "w-16", "size": "32x32", "preset": "sana-wm-bench"}, tmp_path / "bench", rules)
    assert bench.summary["seed"] == 42  # the preset's, for what is not given; its 961 frames, of a 17-frame path:
    assert bench.summary["num_frames"] == 17 and "fewer than the 961 asked" in bench.summary["notes"][0]
    other = JobRules(LoadSettings.create("tiny", kernels="torch"), None, 1 << 20)
    with pytest.raises(CamrenderError, match="kernels: 'fused' then, 'torch' now") as refused:
        plan_job(accepted.spec, tmp_path / "job", other)
    assert refused.value.field == "kernels"


def test_a_job_a_kill_ended_three_times_fails_without_a_fourth_render(tmp_path):
    from camrender.serve.jobs import JobRules, accept
    from camrender.serve.worker import Dispatcher, InProcessRenderer

    rules = JobRules(LoadSettings.create("tiny"), None, 1 << 20)
    store = JobStore(tmp_path / "store")
    try:
        accepted = accept({"trajectory": "w-8", "size": "32x32"}, store.folder_of("video_" + "1" * 32), rules)
        store.add("video_" + "1" * 32, accepted.spec, accepted.summary, time.time(), 10)
        for _ in range(3):  # three renders started, each ended by a kill (the next start requeues it)
            assert store.start("video_" + "1" * 32, time.time())
            store.requeue_interrupted()
        rendered = []

        class Recording(InProcessRenderer):
            def render(self, job, progress):
                rendered.append(job.id)
                return 0

        dispatcher = Dispatcher(store, Recording(None), rules, checkpoint_every=0.0, log=lambda line: None)
        dispatcher.start()
        deadline = time.monotonic() + 30
        while store.get("video_" + "1" * 32).status == "queued" and time.monotonic() < deadline:
            time.sleep(0.05)
        dispatcher.stop(5.0)
        failed = store.get("video_" + "1" * 32)
        assert failed.status == "failed" and "killed while it rendered this job, 3 times" in failed.error["message"]
        assert rendered == []
    finally:
        store.close()
