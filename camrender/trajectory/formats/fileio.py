"""Reading trajectory files, with every failure turned into CamrenderError, and `dump_json` (their
one-item-per-line JSON layout). Writing is `camrender.files`' (its helpers re-exported here for the
format modules)."""
from __future__ import annotations

import json
import os

from camrender.errors import CamrenderError
from camrender.files import (  # noqa: F401 (the format modules import them from here)
    atomic_output,
    atomic_write_text,
    check_output_path,
    output_file_mode,
    read_bounded,
)

# Checked before a byte is parsed: MAX_FRAMES frames fit with up to 670 bytes a frame (camrender's v1
# JSON takes about 250, a nerfstudio camera path about 400), and a file of this size parses in about a
# second (a 200 MB file used to take 23 s and 1.7 GB to be refused for its frame count).
MAX_FILE_BYTES = 32 * 1024 * 1024
# COLMAP's images.txt carries every image's 2D points: large reconstructions legitimately run to
# hundreds of MB (the reader keeps only the pose lines).
MAX_COLMAP_BYTES = 1024 * 1024 * 1024


def read_text(path, max_bytes: int = MAX_FILE_BYTES, what: str = "a trajectory file") -> str:
    """The file's UTF-8 text; CamrenderError naming the file (`what` it is) if it cannot be read, is not a
    regular file (a FIFO or a device would block or never end) or holds more than `max_bytes` (checked before
    reading, and the read stops there: `camrender.files.read_bounded`)."""
    path = os.fspath(path)
    data = read_bounded(path, max_bytes, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise CamrenderError(f"not UTF-8 text (byte {error.start})", path=path) from None


def json_lines(text: str) -> list:
    """The lines of a JSON-lines text: split at "\n" alone ("\r\n" too), never inside a JSON string, where
    str.splitlines would also split at U+2028, U+0085, form feeds and the like."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def parse_json(text: str, path) -> object:
    """Parse JSON text; errors name the line and column."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CamrenderError(f"invalid JSON at line {error.lineno} column {error.colno}: {error.msg}", path=path) from None
    except RecursionError:
        raise CamrenderError("invalid JSON: nested too deeply", path=path) from None
    except ValueError as error:  # e.g. integers with too many digits
        raise CamrenderError(f"invalid JSON: {error}", path=path) from None


# The document `formats.detect` parsed to tell a .json file's format, handed once to the reader it
# picks: a large file is parsed once, not twice. {(real path, size, mtime_ns): document}
_SNIFFED: dict = {}


def _file_key(path) -> tuple:
    stat = os.stat(path)
    return os.path.realpath(path), stat.st_size, stat.st_mtime_ns


def read_json(path, *, keep: bool = False, what: str = "a trajectory file") -> object:
    """The parsed JSON of the file `path` (`what` it is; CamrenderError naming it otherwise). keep: also hold
    the document for the next read_json of the same unchanged file (which takes it)."""
    try:
        key = _file_key(path)
    except OSError:
        key = None  # read_text says what is wrong
    if key is not None and key in _SNIFFED:
        return _SNIFFED.pop(key)
    doc = parse_json(read_text(path, what=what), os.fspath(path))
    if keep and key is not None:
        _SNIFFED.clear()
        _SNIFFED[key] = doc
    return doc


def dump_json(doc) -> str:
    """JSON text with one list item (frame, keyframe) per line: short, readable and diffable."""

    def one_line(value):
        return json.dumps(value, allow_nan=False, separators=(", ", ": "))

    if not isinstance(doc, dict):
        return one_line(doc) + "\n"
    lines = []
    for key, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            items = ",\n".join("    " + one_line(item) for item in value)
            lines.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
        else:
            lines.append(f"  {json.dumps(key)}: {one_line(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"
