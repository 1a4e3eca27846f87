"""The files one render writes for an output `NAME.mp4`, and claiming them before anything loads.

    NAME.mp4, NAME.traj.json, NAME.render.json, NAME.path.png     the video and its side files
    .NAME.mp4.partial/                                           segment mode's work (`camrender.render.resume`)
    .NAME.mp4.lock                                               held while a render writes NAME.mp4

`claim_output` takes an exclusive lock (`fcntl.flock`) on the lock file for the whole render: a second render
of the same output refuses in one line instead of interleaving its segment files with the first's. The lock
dies with its process (a crash or a kill leaves at most an unlocked, harmless file, which the next render takes
over). The lock's name has the suffix in lower case: `c.mp4` and `c.MP4` share their side files (`c.render.json`),
so they share the lock too. A batch checks its outputs as a set before any job runs (`check_batch_output`,
`check_summary_target`).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from camrender.errors import CamrenderError
from camrender.files import check_names_fit
from camrender.render.resume import partial_folder

try:  # POSIX; elsewhere renders run unguarded
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

SIDE_SUFFIXES = (".traj.json", ".render.json", ".path.png")


def companion_path(video: Path, suffix: str) -> Path:
    """`out/orbit.mp4` -> `out/orbit<suffix>` (e.g. ".traj.json", ".path.png")."""
    video = Path(video)
    return video.with_name(video.stem + suffix) if video.suffix else video.with_name(video.name + suffix)


def lock_path(out) -> Path:
    """`.NAME.mp4.lock` beside `out` (its suffix in lower case: see the module docstring)."""
    out = Path(out)
    return out.with_name(f".{out.stem}{out.suffix.lower()}.lock")


def check_output_names(out) -> None:
    """CamrenderError unless `out` and every name a render makes beside it (side files, partial folder, lock)
    fit the folder's file-name limit and no side file's name is taken by a folder: found now, not when the
    last side file is written after the render."""
    beside = [companion_path(out, suffix) for suffix in SIDE_SUFFIXES]
    check_names_fit(out, [*(path.name for path in beside), partial_folder(out).name, lock_path(out).name])
    for path in (*beside, lock_path(out)):
        if path.is_dir():
            raise CamrenderError(f"{path.name} beside it is a directory; the render writes a file there",
                                 path=out)


class _Lock:
    """The flock this process holds on one lock file, shared by the claims of one thread (`claim_output`)."""

    def __init__(self, path: str, descriptor):
        self.path, self.descriptor, self.claims = path, descriptor, 0
        self.thread = threading.get_ident()

    def drop(self) -> None:
        self.claims -= 1
        if self.claims > 0:
            return
        _HELD.pop(self.path, None)
        if self.descriptor is not None:
            try:
                os.unlink(self.path)  # while still locked: a process that opened it meanwhile sees another file
            except OSError:
                pass
            os.close(self.descriptor)


class OutputClaim:
    """One holder's claim on an output (`claim_output`); `release` (or leaving its `with`) gives it back, once
    (again: nothing). The claims of one output in one thread share its lock, freed with the last of them (the CLI
    claims before loading, the writer again)."""

    def __init__(self, lock: _Lock):
        self._lock = lock
        lock.claims += 1

    def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.drop()

    def __enter__(self) -> "OutputClaim":
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


_HELD: dict = {}  # lock file path -> the _Lock this process holds


def claim_output(out) -> OutputClaim:
    """A claim on output `out`, held until released; CamrenderError (one line, naming `out` and the holder's
    pid) when another process, or another thread of this one, holds it."""
    path = os.path.abspath(lock_path(out))
    held = _HELD.get(path)
    if held is not None and held.thread != threading.get_ident():
        raise CamrenderError("another render of this process is writing this video (or one sharing its side "
                             "files)", path=out)
    return OutputClaim(held if held is not None else _lock(path, out))


def _lock(path: str, out) -> _Lock:
    """Take the flock of the lock file `path` (of output `out`), created if need be."""
    if fcntl is None:
        return _Lock(path, None)
    for _ in range(8):  # the holder may remove the file between our open and our lock: take the new one
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as error:
            raise CamrenderError(f"cannot create its lock file {os.path.basename(path)}: {error.strerror or error}",
                                 path=out) from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(descriptor)
            os.close(descriptor)
            raise CamrenderError(f"another camrender{holder} is writing this video (or one sharing its side files); "
                                 f"wait for it to finish or choose another output", path=out) from None
        except OSError:  # a file system without locks: render unguarded rather than not at all
            os.close(descriptor)
            return _Lock(path, None)
        try:
            same = os.stat(path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same = False
        if same:
            try:  # the holder's pid, for the message of a render refused; a full disk goes without it
                os.ftruncate(descriptor, 0)
                os.write(descriptor, f"{os.getpid()}\n".encode())
            except OSError:
                pass
            _HELD[path] = lock = _Lock(path, descriptor)
            return lock
        os.close(descriptor)
    raise CamrenderError("its lock file keeps changing; is another camrender starting on it?", path=out)


def _holder(descriptor) -> str:
    try:
        return f" (pid {int(os.pread(descriptor, 32, 0).decode().strip())})"
    except (OSError, ValueError):
        return ""


# ----------------------------------------------------------------------------- a batch's outputs as a set
def output_key(out) -> str:
    """What two outputs must not share: the resolved path, case-folded (on a case-insensitive file system they
    are one file; everywhere, `c.mp4` and `c.MP4` share their side files)."""
    return str(Path(out).resolve()).casefold()


def check_batch_output(out, seen: dict, where: str) -> None:
    """CamrenderError naming `where` when the output `out` is a directory, or (case-insensitively) another
    job's output in `seen` ({output_key: (where, resolved path)}); else records it there."""
    if Path(out).is_dir():
        raise CamrenderError("is a directory, not a video file", path=where, field="output")
    key, resolved = output_key(out), str(Path(out).resolve())
    if key in seen:
        other, other_path = seen[key]
        note = "" if other_path == resolved else " (outputs that differ only in case share their side files)"
        raise CamrenderError(f"same output as {other}{note}", path=where, field="output")
    seen[key] = (where, resolved)


def check_summary_target(summary, jobs_source, job_values: list) -> None:
    """CamrenderError unless the `--summary` file `summary` is none of what the batch reads or writes: the jobs
    file or folder `jobs_source`, a file a job names (any value of `job_values`, one dict per job, that is an
    existing file), a job's output or one of its side files."""
    if summary is None:
        return
    target = output_key(summary)
    taken = {output_key(jobs_source): "the jobs file"}
    for values in job_values:
        for name, value in values.items():
            if not isinstance(value, (str, os.PathLike)) or not str(value):
                continue
            if name == "out":
                for path in (value, *(companion_path(value, suffix) for suffix in SIDE_SUFFIXES)):
                    taken.setdefault(output_key(path), f"a job's output ({Path(path).name})")
            elif Path(value).is_file():
                taken.setdefault(output_key(value), f"a file a job reads ({Path(value).name})")
    if target in taken:
        raise CamrenderError(f"the summary would overwrite {taken[target]}; write it elsewhere", path=summary,
                             field="summary")
