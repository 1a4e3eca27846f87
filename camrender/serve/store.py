"""The job store of `camrender serve`: SQLite (the standard library's `sqlite3`, WAL mode) under `--store DIR`.

    DIR/jobs.sqlite3            every accepted job: its checked inputs (`spec`), status and progress
    DIR/jobs/<id>/input/        the job's uploads (first-frame image, trajectory document, intrinsics)
    DIR/jobs/<id>/video.mp4     the finished video, with video.render.json, video.traj.json, video.path.png
    DIR/server.lock             held (flock) by the server that uses the store: one server per store

A job is committed (synchronous=FULL: on disk, not only in the page cache) before its submission is
answered, so a server killed at any point and started again keeps every accepted job. Each thread talks to
the database on a connection of its own (WAL: readers never wait for the writer).
The schema's version is the database's `user_version`: a store of another version is refused, never migrated
behind the user's back.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Optional

from camrender.errors import CamrenderError
from camrender.files import probe_writable

SCHEMA_VERSION = 1
APPLICATION_ID = 0x63616D72  # "camr": tells a camrender store from another program's SQLite file
DATABASE = "jobs.sqlite3"
JOBS = "jobs"
LOCK = "server.lock"
STATUSES = ("queued", "in_progress", "completed", "failed", "cancelled")
FINISHED = ("completed", "failed", "cancelled")

_SCHEMA = """
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- submission order
    id TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,               -- unix seconds: the request arrived
    started_at REAL,                        -- the renderer was handed the job (last attempt)
    completed_at REAL,                      -- it finished (completed, failed or cancelled)
    progress INTEGER NOT NULL DEFAULT 0,    -- 0-100
    stage TEXT,
    segments_done INTEGER,
    segments_total INTEGER,
    eta_s REAL,                             -- seconds left, from the current stage's rate
    inference_s REAL,                       -- seconds the finished render took
    attempts INTEGER NOT NULL DEFAULT 0,    -- renders started (a restart after a kill is one more)
    spec TEXT NOT NULL,                     -- JSON: the checked inputs (camrender.serve.jobs)
    summary TEXT NOT NULL,                  -- JSON: what the job object shows (size, seconds, ...)
    error TEXT                              -- JSON {"code", "message", "param"} of a failed job
);
CREATE INDEX jobs_status ON jobs (status, seq);
"""
_COLUMNS = ("seq", "id", "status", "created_at", "started_at", "completed_at", "progress", "stage",
            "segments_done", "segments_total", "eta_s", "inference_s", "attempts", "spec", "summary", "error")


@dataclasses.dataclass(frozen=True)
class Job:
    """One row of the store (times in unix seconds; `spec`, `summary`, `error` decoded from JSON)."""

    seq: int
    id: str
    status: str
    created_at: float
    started_at: Optional[float]
    completed_at: Optional[float]
    progress: int
    stage: Optional[str]
    segments_done: Optional[int]
    segments_total: Optional[int]
    eta_s: Optional[float]
    inference_s: Optional[float]
    attempts: int
    spec: dict
    summary: dict
    error: Optional[dict]


class QueueFull(Exception):
    """The queue holds `--max-queue` jobs already."""


class JobStore:
    """The store under `folder` (created when missing). CamrenderError (field "store") for a folder that cannot
    hold one, a database of another schema version or program, or a store another live server holds."""

    def __init__(self, folder):
        self.folder = Path(folder).expanduser().resolve()
        self._local = threading.local()
        self._open_folder()
        self._lock = self._take_lock()
        self._check_schema()

    # --- opening -----------------------------------------------------------------------------------
    def _open_folder(self) -> None:
        if self.folder.exists() and not self.folder.is_dir():
            raise CamrenderError("is not a folder", path=self.folder, field="store")
        try:
            (self.folder / JOBS).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CamrenderError(f"cannot create the store: {error.strerror or error}", path=self.folder,
                                 field="store") from None
        for place in (self.folder / DATABASE, self.folder / JOBS / "probe"):
            try:
                probe_writable(place)
            except CamrenderError as error:
                raise CamrenderError(f"is not writable ({error.detail})", path=self.folder, field="store") from None

    def _take_lock(self):
        handle = open(self.folder / LOCK, "a+")  # noqa: SIM115 - held for the server's lifetime
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise CamrenderError(f"another camrender serve ({holder}) uses this store", path=self.folder,
                                 field="store") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        return handle

    def _check_schema(self) -> None:
        db = self._db()
        try:
            application, version = (db.execute(f"PRAGMA {name}").fetchone()[0]
                                    for name in ("application_id", "user_version"))
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except sqlite3.DatabaseError as error:
            self.close()
            raise CamrenderError(f"{DATABASE} is not a camrender job store ({error})", path=self.folder,
                                 field="store") from None
        if tables == 0 and application == 0:
            with db:
                db.executescript(_SCHEMA)
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        if application != APPLICATION_ID:
            self.close()
            raise CamrenderError(f"{DATABASE} is not a camrender job store", path=self.folder, field="store")
        if version != SCHEMA_VERSION:
            self.close()
            raise CamrenderError(f"holds a job store of schema version {version}; this camrender reads version "
                                 f"{SCHEMA_VERSION} (use another --store, or the camrender that made it)",
                                 path=self.folder, field="store")

    def _db(self) -> sqlite3.Connection:
        """This thread's connection (autocommit; `with db:` makes a transaction)."""
        db = getattr(self._local, "db", None)
        if db is None:
            try:
                db = sqlite3.connect(self.folder / DATABASE, timeout=30.0, isolation_level=None)
                db.execute("PRAGMA journal_mode = WAL")
                db.execute("PRAGMA synchronous = FULL")
            except sqlite3.DatabaseError as error:
                raise CamrenderError(f"cannot open {DATABASE} ({error})", path=self.folder, field="store") from None
            self._local.db = db
        return db

    def close(self) -> None:
        """This thread's connection closed and the store's lock let go."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
        if getattr(self, "_lock", None) is not None:
            self._lock.close()
            self._lock = None

    # --- reading -----------------------------------------------------------------------------------
    def folder_of(self, job_id: str) -> Path:
        """The job's folder (`id` checked by the caller: `camrender.serve.jobs.check_id`)."""
        return self.folder / JOBS / job_id

    def get(self, job_id: str) -> Optional[Job]:
        row = self._db().execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def page(self, after: Optional[str], limit: int, newest_first: bool = True) -> tuple:
        """(up to `limit` jobs after the job `after` in the order asked, whether more follow); KeyError for an
        `after` that is not in the store."""
        seq = None
        if after is not None:
            found = self._db().execute("SELECT seq FROM jobs WHERE id = ?", (after,)).fetchone()
            if found is None:
                raise KeyError(after)
            seq = found[0]
        where = "" if seq is None else f"WHERE seq {'<' if newest_first else '>'} ?"
        rows = self._db().execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs {where} ORDER BY seq "
                                  f"{'DESC' if newest_first else 'ASC'} LIMIT ?",
                                  (() if seq is None else (seq,)) + (limit + 1,)).fetchall()
        return [_job(row) for row in rows[:limit]], len(rows) > limit

    def next_queued(self, skip=()) -> Optional[Job]:
        """The oldest queued job whose id is not in `skip`."""
        for row in self._db().execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE status = 'queued' "
                                      f"ORDER BY seq"):
            if row[1] not in skip:
                return _job(row)
        return None

    def counts(self) -> dict:
        """{status: number of jobs} for every status."""
        found = dict(self._db().execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall())
        return {status: found.get(status, 0) for status in STATUSES}

    def render_seconds(self) -> list:
        """Seconds each completed job in the store rendered."""
        return [row[0] for row in self._db().execute(
            "SELECT inference_s FROM jobs WHERE status = 'completed' AND inference_s IS NOT NULL")]

    # --- writing -----------------------------------------------------------------------------------
    def add(self, job_id: str, spec: dict, summary: dict, created_at: float, max_queue: int) -> Job:
        """Store a new queued job, committed to disk; QueueFull when `max_queue` jobs wait already."""
        db = self._db()
        with db:
            db.execute("BEGIN IMMEDIATE")
            queued = db.execute("SELECT count(*) FROM jobs WHERE status = 'queued'").fetchone()[0]
            if queued >= max_queue:
                raise QueueFull(queued)
            db.execute("INSERT INTO jobs (id, status, created_at, spec, summary) VALUES (?, 'queued', ?, ?, ?)",
                       (job_id, created_at, json.dumps(spec), json.dumps(summary)))
        return self.get(job_id)

    def _update(self, job_id: str, changes: dict, statuses=None) -> bool:
        """Set `changes` on the job (only while its status is one of `statuses`); whether it changed."""
        values = [json.dumps(value) if name in ("spec", "summary", "error") and value is not None else value
                  for name, value in changes.items()]
        sql = f"UPDATE jobs SET {', '.join(f'{name} = ?' for name in changes)} WHERE id = ?"
        if statuses:
            sql += f" AND status IN ({', '.join('?' * len(statuses))})"
        return self._db().execute(sql, (*values, job_id, *(statuses or ()))).rowcount == 1

    def start(self, job_id: str, at: float) -> bool:
        """queued -> in_progress (False: it was cancelled meanwhile)."""
        db = self._db()
        with db:
            db.execute("BEGIN IMMEDIATE")
            return self._update(job_id, {"status": "in_progress", "started_at": at, "progress": 0, "stage": None,
                                         "segments_done": None, "eta_s": None}, ("queued",)) and \
                db.execute("UPDATE jobs SET attempts = attempts + 1 WHERE id = ?", (job_id,)).rowcount == 1

    def report(self, job_id: str, **fields) -> None:
        """Progress of the job in progress: progress, stage, segments_done, segments_total, eta_s."""
        self._update(job_id, fields, ("in_progress",))

    def finish(self, job_id: str, status: str, *, error: Optional[dict] = None,
               inference_s: Optional[float] = None, queued_too: bool = False) -> bool:
        """in_progress -> completed, failed or cancelled; with `queued_too` a queued job as well (it failed before
        its render started, or its video was written before a kill). False: the job was cancelled or deleted
        meanwhile."""
        changes = {"status": status, "completed_at": time.time(), "error": error, "eta_s": None}
        if status == "completed":
            changes.update(progress=100, inference_s=inference_s)
        return self._update(job_id, changes, ("queued", "in_progress") if queued_too else ("in_progress",))

    def requeue(self, job_id: str, attempted: bool = True) -> bool:
        """in_progress -> queued: a render the server stopped goes on when it starts again. attempted False: the
        server stopped it on purpose (SIGTERM), which does not count as one of its attempts."""
        db = self._db()
        with db:
            db.execute("BEGIN IMMEDIATE")
            changed = self._update(job_id, {"status": "queued", "eta_s": None}, ("in_progress",))
            if changed and not attempted:
                db.execute("UPDATE jobs SET attempts = attempts - 1 WHERE id = ?", (job_id,))
            return changed

    def requeue_interrupted(self) -> list:
        """At start: the jobs a killed server left in progress go back to the queue (ids, oldest first)."""
        db = self._db()
        ids = [row[0] for row in db.execute("SELECT id FROM jobs WHERE status = 'in_progress' ORDER BY seq")]
        for job_id in ids:
            self.requeue(job_id)
        return ids

    def cancel(self, job_id: str) -> Optional[str]:
        """A queued or running job -> cancelled; its status before (None: it was finished already)."""
        db = self._db()
        with db:
            db.execute("BEGIN IMMEDIATE")
            job = self.get(job_id)
            if job is None or job.status in FINISHED:
                return None
            self._update(job_id, {"status": "cancelled", "completed_at": time.time(), "eta_s": None})
            return job.status

    def delete(self, job_id: str, files: bool = True) -> bool:
        """Remove the job's row (and, with `files`, its folder); whether it was there."""
        gone = self._db().execute("DELETE FROM jobs WHERE id = ?", (job_id,)).rowcount == 1
        if files:
            shutil.rmtree(self.folder_of(job_id), ignore_errors=True)
        return gone

    def purge(self, finished_before: float, busy=()) -> list:
        """Finished jobs that finished before `finished_before` (unix seconds), and job folders without a job
        (a submission killed before it was stored), removed with their files; the ids removed. busy: ids whose
        folder a render still uses."""
        db = self._db()
        old = [row[0] for row in db.execute(
            f"SELECT id FROM jobs WHERE status IN ({', '.join('?' * len(FINISHED))}) AND completed_at < ?",
            (*FINISHED, finished_before))]
        for job_id in old:
            self.delete(job_id, files=job_id not in busy)
        known = {row[0] for row in db.execute("SELECT id FROM jobs")}
        for folder in (self.folder / JOBS).iterdir():
            if folder.name in known or folder.name in busy:
                continue
            try:
                modified = folder.stat().st_mtime
            except FileNotFoundError:  # removed meanwhile (a render thread letting a deleted job's folder go)
                continue
            if modified < finished_before:
                shutil.rmtree(folder, ignore_errors=True)
        return old


def _job(row) -> Job:
    values = dict(zip(_COLUMNS, row))
    for name in ("spec", "summary", "error"):
        values[name] = None if values[name] is None else json.loads(values[name])
    return Job(**values)
