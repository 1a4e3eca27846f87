"""camrender's own trajectory format (JSON, version 1); see docs/trajectory-format.md."""
from __future__ import annotations

from camrender.trajectory.formats.fileio import atomic_write_text, dump_json, read_json
from camrender.trajectory import v1 as schema

NAME = "v1"
SUFFIXES = (".json",)
DESCRIPTION = "camrender trajectory JSON v1 (frames, keyframes or preset)"


def sniff(doc) -> bool:
    """True for a parsed JSON document that looks like ours (it has a 'version' field)."""
    return isinstance(doc, dict) and "version" in doc and "camera_path" not in doc


def read(path):
    return schema.parse_document(read_json(path), path=str(path))  # validated by parse_document


def write(traj, path) -> None:
    atomic_write_text(path, dump_json(schema.to_document(traj, path)))
