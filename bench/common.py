"""Small pieces every bench script shares: the release latent grid's arguments and the JSON output.

The scripts run as `python3 bench/<name>.py`, which puts this folder first on sys.path, so they
import this module as `common`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def add_latent_args(parser, *, batch=2, frames=21, height=22, width=40):
    """--batch/--frames/--height/--width of the latent grid (default: the release step, B=2 guidance
    rows, T=21 latent frames of 22x40 tokens = 161 video frames at 704x1280)."""
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--frames", type=int, default=frames, help="latent frames")
    parser.add_argument("--height", type=int, default=height, help="latent rows")
    parser.add_argument("--width", type=int, default=width, help="latent columns")


def emit(result: dict, out=None, *, indent: int = 1, **dumps) -> str:
    """Print `result` as JSON on stdout (the scripts' output) and write the same text to `out`."""
    text = json.dumps(result, indent=indent, **dumps)
    print(text, flush=True)
    if out:
        Path(out).write_text(text + "\n")
    return text


if __name__ == "__main__":
    sys.exit("bench/common.py holds helpers of the bench scripts; run one of them")
