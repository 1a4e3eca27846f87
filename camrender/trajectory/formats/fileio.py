"""Trajectory file helpers: the general ones are `camrender.files`'s (re-exported here for the format
modules), plus `dump_json`, the one-item-per-line JSON layout of trajectory files."""
from __future__ import annotations

import json

from camrender.files import (  # noqa: F401 (the format modules import them from here)
    MAX_FILE_BYTES,
    atomic_output,
    atomic_write_text,
    check_output_path,
    output_file_mode,
    parse_json,
    read_json,
    read_text,
)


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
