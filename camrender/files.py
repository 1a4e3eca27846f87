"""Files, for every layer: checking an output path (`check_suffix`, `check_output_path`, `probe_writable`), the
one atomic writer (`atomic_path`: a temporary file beside the target, renamed into place only when it is
complete; `atomic_output` opens it as a file), and the one bounded reader of user files (`read_bounded`:
regular files only, never more than a limit read). Parsing trajectory files is
`camrender.trajectory.formats.fileio`'s."""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Optional

from camrender.errors import CamrenderError

# The longest file name most file systems take (bytes); `name_limit` asks the folder's own.
NAME_MAX = 255


def name_limit(folder) -> int:
    """The longest file name (bytes) `folder` takes."""
    try:
        return int(os.pathconf(folder or ".", "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return NAME_MAX


def check_names_fit(path, names=()) -> None:
    """CamrenderError (naming `path`) unless `path`'s file name and each of `names` (files to be made beside
    it) fit the folder's file-name limit: found now, not when the last of them is written."""
    path = Path(path)
    limit = name_limit(path.parent if str(path.parent) else ".")
    for name in (path.name, *names):
        size = len(os.fsencode(name))
        if size > limit:
            shown = name if len(name) <= 40 else f"{name[:12]}...{name[-24:]}"
            what = "the file name" if name == path.name else f"the name of {shown} beside it"
            raise CamrenderError(f"{what} is {size} bytes, longer than the {limit} the folder allows (use a shorter "
                                 f"name)", path=path)


def open_regular(path, kind: str = "file"):
    """`path` opened for reading in binary; CamrenderError naming it when it is missing, a folder, or not a
    regular file (a FIFO, a device such as /dev/zero, a socket: they could block or never end). A FIFO is
    opened without waiting for a writer."""
    shown = os.fspath(path)
    if not shown:
        raise CamrenderError("no file given (the path is an empty string)")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0) \
        | getattr(os, "O_BINARY", 0)
    try:
        descriptor = os.open(shown, flags)
    except FileNotFoundError:
        raise CamrenderError("file not found", path=shown) from None
    except IsADirectoryError:
        raise CamrenderError(f"is a directory, not a {kind}", path=shown) from None
    except (OSError, ValueError) as error:  # ValueError: an embedded NUL byte
        raise CamrenderError(f"cannot read file: {getattr(error, 'strerror', None) or error}", path=shown) from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        if stat.S_ISDIR(mode):
            raise CamrenderError(f"is a directory, not a {kind}", path=shown)
        raise CamrenderError(f"is not a regular file (a FIFO, device or socket), expected a {kind}", path=shown)
    return os.fdopen(descriptor, "rb")


def read_bounded(path, max_bytes: int, what: str = "a file") -> bytes:
    """The bytes of the regular file `path` (`open_regular`; `what` it is, with its article, for messages);
    CamrenderError naming it when it holds more than `max_bytes`: its size is checked first, and the read
    itself stops past the limit (a file that grows)."""
    kind = what.split(" ", 1)[1] if what.split(" ", 1)[0] in ("a", "an") else what
    with open_regular(path, kind) as handle:
        size = os.fstat(handle.fileno()).st_size
        data = b"" if size > max_bytes else handle.read(max_bytes + 1)
    if size > max_bytes or len(data) > max_bytes:
        shown = max(size, len(data))
        raise CamrenderError(f"file is {_size_words(shown)}, larger than the {_size_words(max_bytes)} {what} may "
                             f"be", path=os.fspath(path))
    return data


def _size_words(size: int) -> str:
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size} bytes"


VIDEO_SUFFIXES = (".mp4",)


def check_suffix(path, suffixes, what: str) -> None:
    """CamrenderError unless `path` ends with one of `suffixes` (lower case, with the dot)."""
    suffix = Path(path).suffix.lower()
    if suffix not in suffixes:
        raise CamrenderError(f"{what} must end with {' or '.join(suffixes)}, got {suffix or 'no suffix'!r}",
                             path=path)


def check_output_path(path) -> Path:
    """Raise `CamrenderError` unless a file can be written at `path`; return it as a `Path`.

    Checks (without creating anything): the path is not a directory, its folder exists and is
    writable.
    """
    path = Path(path)
    check_names_fit(path)
    if path.is_dir():
        raise CamrenderError("output path is a directory, expected a file name", path=path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise CamrenderError(f"output folder does not exist: {str(parent)!r}", path=path)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CamrenderError(f"output folder {str(parent)!r} is not writable", path=path)
    return path


def probe_writable(path) -> None:
    """Create and delete a file next to `path`: some folders pass the permission bits and still refuse new files
    (/sys, read-only mounts), which would only show after the model has loaded. (Its name fits the folder, as
    every temporary name does: `temp_name_beside`.)"""
    remove_quietly(temp_beside(path, ".probe", prefix=f".{Path(path).name}."))


def temp_beside(path, suffix: str = "", prefix: str = ".tmp-") -> str:
    """Create an empty temporary file in `path`'s folder (so the rename into place is atomic); its name."""
    temp = temp_name_beside(path, suffix, prefix)
    create_new(temp, path)
    return temp


def temp_name_beside(path, suffix: str = "", prefix: str = ".tmp-") -> str:
    """A fresh random name for a temporary file in `path`'s folder; nothing is created (`create_new` does).
    A writer that holds the name before the file exists can remove the file whenever an interrupt lands.
    A prefix that would make the name longer than the folder allows (it often holds the target's name) is
    cut short."""
    folder = os.path.dirname(os.path.abspath(path))
    token = secrets.token_hex(_TOKEN_BYTES)
    room = name_limit(folder) - len(os.fsencode(token + suffix))
    while len(os.fsencode(prefix)) > room and len(prefix) > 1:
        prefix = prefix[:-1]
    return os.path.join(folder, f"{prefix}{token}{suffix}")


_TOKEN_BYTES = 6  # the random part of a temporary name: 12 hex digits


def temporaries_of(path) -> list:
    """The temporary files made for `path` that are still beside it: what a writer killed before it renamed or
    removed them leaves. `.NAME.<random>...` (the video writers' names) and
    `.tmp-<random>NAME` (`atomic_output`'s, whose name keeps only NAME's last 32 characters: a longer NAME is left
    out, as its temporaries cannot be told from those of a file whose name ends the same; so is a prefix cut short
    for a name near the folder's limit)."""
    path = Path(path)
    name, folder = path.name, path.parent if str(path.parent) else Path(".")
    token = f"[0-9a-f]{{{2 * _TOKEN_BYTES}}}"
    patterns = [re.compile(rf"\.{re.escape(name)}\.{token}\..+")]
    if len(name) <= 32:
        patterns.append(re.compile(rf"\.tmp-{token}{re.escape(name)}"))
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    return [entry for entry in entries if any(pattern.fullmatch(entry.name) for pattern in patterns)]


def create_new(temp, path) -> None:
    """Create the empty file `temp` (mode 0600; failing if it exists, as mkstemp does); an error names `path`,
    the file that `temp` stands in for."""
    try:
        os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as error:
        folder = os.path.dirname(os.path.abspath(temp))
        raise CamrenderError(f"cannot create a file in {folder!r}: {error.strerror or error}", path=path) from None


def place(temp, path, *, durable: bool = False, chmod: bool = True) -> None:
    """Rename the finished temporary file `temp` over `path`. chmod: give it the mode a plain open()
    would (temporary files are made 0600); durable: its data, and the folder's entries before and after the
    rename, flushed to disk (a checkpoint refers to files renamed before it)."""
    folder = os.path.dirname(os.path.abspath(path))
    if chmod:
        os.chmod(temp, output_file_mode(path))
    if durable:
        fsync_path(temp)
        fsync_path(folder)
    os.replace(temp, path)
    if durable:
        fsync_path(folder)


def remove_quietly(path) -> None:
    """Delete a file if it is there."""
    try:
        os.unlink(path)
    except OSError:
        pass


@contextlib.contextmanager
def atomic_path(path, *, suffix: str = "", prefix: str = ".tmp-", durable: bool = False, chmod: bool = True):
    """The one atomic writer: yield the name of a temporary file beside `path` to write; when the block
    completes it is renamed over `path` (`place`), when it raises it is deleted, so no partial file is
    ever left at `path`."""
    temp = temp_beside(path, suffix, prefix)
    try:
        yield temp
        place(temp, path, durable=durable, chmod=chmod)
    except BaseException:
        remove_quietly(temp)
        raise


@contextlib.contextmanager
def atomic_output(path, mode: str = "w", *, durable: bool = False):
    """`atomic_path` as an open file (text: UTF-8, newline "\\n"); flushed to disk before the rename (durable:
    the rename too, `place`). OSErrors become CamrenderError naming the file."""
    path = os.fspath(check_output_path(path))
    text_options = {} if "b" in mode else {"encoding": "utf-8", "newline": "\n"}
    try:
        with atomic_path(path, suffix=os.path.basename(path)[-32:], durable=durable) as temp:
            with open(temp, mode, **text_options) as out:
                yield out
                out.flush()
                os.fsync(out.fileno())
    except OSError as error:
        raise CamrenderError(f"cannot write: {error.strerror or error}", path=path) from None


def atomic_write_text(path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see `atomic_output`)."""
    with atomic_output(path) as out:
        out.write(text)


def output_file_mode(path) -> int:
    """Permissions for a file written at ``path``: the existing file's, or 0666 minus the process umask."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def make_folders(path, *, durable: bool = False, made: Optional[list] = None) -> None:
    """Create the folder `path` and those missing above it; durable: each new folder's entry flushed to disk in
    the folder holding it (a file placed durably in `path` is then found after a crash); made: the folders it
    made are appended to it, deepest first (also those made before an OSError)."""
    path = Path(path)
    missing = [folder for folder in (path, *path.parents) if not folder.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
    finally:
        if made is not None:
            made.extend(folder for folder in missing if folder.is_dir())
    if durable:
        for folder in reversed(missing):
            fsync_path(folder.parent)


def fsync_path(path) -> None:
    """Flush a file's data, or a folder's entries (renames), to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
