"""Slices of a batch for schedulers without Ray (Slurm job arrays, ...): `--shard K/N` renders the K-th of N
deterministic slices of the jobs, so N processes started alike cover the jobs file once.

Shard K of N holds the jobs at positions [K J / N, (K + 1) J / N) of the J jobs (lines of the jobs file, or the
sorted trajectory files of a folder): consecutive jobs, so that jobs sharing their load settings keep sharing a
pipeline. Under a Slurm job array the default is the array task's place in the array (`shard_from_environment`).
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Mapping, Optional

from camrender.errors import CamrenderError

SLURM_ID, SLURM_COUNT = "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"
SLURM_MIN, SLURM_STEP = "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP"


@dataclasses.dataclass(frozen=True)
class Shard:
    """The `index`-th (from 0) of `count` slices."""

    index: int
    count: int

    def holds(self, position: int, total: int) -> bool:
        """Whether the job at `position` of `total` jobs is in this slice."""
        return self.index * total // self.count <= position < (self.index + 1) * total // self.count

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """`--shard K/N` -> Shard(K, N); CamrenderError (field "shard") for anything but 0 <= K < N."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if match is None:
        raise CamrenderError(f"{text!r} is not K/N (the K-th of N slices, from 0: 0/4 ... 3/4)", field="shard")
    return _checked(int(match.group(1)), int(match.group(2)), f"--shard {text.strip()}")


def shard_from_environment(environ: Mapping[str, str] = os.environ) -> Optional[Shard]:
    """This Slurm array task's shard: its place in the array (SLURM_ARRAY_TASK_ID less SLURM_ARRAY_TASK_MIN, over
    SLURM_ARRAY_TASK_STEP) of SLURM_ARRAY_TASK_COUNT tasks; None outside a job array."""
    if SLURM_ID not in environ or SLURM_COUNT not in environ:
        return None
    try:
        task, count = int(environ[SLURM_ID]), int(environ[SLURM_COUNT])
        first, step = int(environ.get(SLURM_MIN, "0")), int(environ.get(SLURM_STEP, "1"))
    except ValueError:
        raise CamrenderError(f"{SLURM_ID}={environ[SLURM_ID]!r}, {SLURM_COUNT}={environ[SLURM_COUNT]!r}: not "
                             f"integers (pass --shard K/N)", field="shard") from None
    if step < 1 or (task - first) % step:
        raise CamrenderError(f"{SLURM_ID}={task} is not in the array {first}, {first} + {step}, ... "
                             f"(pass --shard K/N)", field="shard")
    return _checked((task - first) // step, count, f"{SLURM_ID}={task} of {SLURM_COUNT}={count}")


def choose_shard(option: Optional[str], environ: Mapping[str, str] = os.environ) -> Optional[Shard]:
    """The shard of `--shard` when given, else the Slurm array's, else None (every job)."""
    return parse_shard(option) if option is not None else shard_from_environment(environ)


def _checked(index: int, count: int, given: str) -> Shard:
    if count < 1:
        raise CamrenderError(f"{given}: N must be at least 1", field="shard")
    if not 0 <= index < count:
        raise CamrenderError(f"{given}: K must be in 0..{count - 1}", field="shard")
    return Shard(index, count)
