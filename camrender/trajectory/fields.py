"""Typed access to fields of a parsed JSON document, raising CamrenderError that names file, frame and field.

JSON gives Python objects of any type; these helpers accept only what the format allows
(``true`` is not a number, ``NaN`` is not finite, a matrix has exactly 4 rows of 4 numbers).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from camrender.errors import CamrenderError


@dataclass(frozen=True)
class Where:
    """Location of a value: file path, frame index (or None) and dotted field name."""

    path: object = None
    frame: int | None = None
    field: str | None = None

    def at(self, field: str, frame: int | None = None) -> "Where":
        name = field if not self.field else f"{self.field}.{field}"
        return Where(self.path, self.frame if frame is None else frame, name)

    def error(self, message: str) -> CamrenderError:
        return CamrenderError(message, path=self.path, frame=self.frame, field=self.field)


def type_name(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def require_object(value, where: Where) -> dict:
    if not isinstance(value, dict):
        raise where.error(f"must be an object, got {type_name(value)}")
    return value


def check_keys(obj: dict, where: Where, allowed, required=()) -> None:
    """Reject unknown keys and report the first missing required key."""
    for key in obj:
        if key not in allowed:
            raise where.at(str(key)).error(f"unknown field (allowed: {', '.join(sorted(allowed))})")
    for key in required:
        if key not in obj:
            raise where.at(key).error("missing required field")


def number(value, where: Where, *, positive=False, minimum=None) -> float:
    """A finite JSON number (not a boolean) as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise where.error(f"must be a number, got {type_name(value)}")
    try:
        result = float(value)
    except OverflowError:
        raise where.error("number is too large") from None
    if not math.isfinite(result):
        raise where.error(f"must be a finite number, got {value}")
    if positive and result <= 0:
        raise where.error(f"must be positive, got {result:g}")
    if minimum is not None and result < minimum:
        raise where.error(f"must be at least {minimum:g}, got {result:g}")
    return result


def integer(value, where: Where, *, minimum=None, maximum=None) -> int:
    """A JSON integer (a float with an integral value is accepted)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.error(f"must be an integer, got {type_name(value)}")
    if minimum is not None and value < minimum:
        raise where.error(f"must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise where.error(f"must be at most {maximum}, got {value}")
    return value


def string(value, where: Where, *, choices=None) -> str:
    if not isinstance(value, str):
        raise where.error(f"must be a string, got {type_name(value)}")
    if choices is not None and value not in choices:
        raise where.error(f"must be one of {', '.join(choices)}, got {value!r}")
    return value


def vector(value, where: Where, length: int) -> np.ndarray:
    """A list of ``length`` finite numbers."""
    if not isinstance(value, list) or len(value) != length:
        got = f"{len(value)} entries" if isinstance(value, list) else type_name(value)
        raise where.error(f"must be a list of {length} numbers, got {got}")
    return np.array([number(v, where) for v in value], dtype=np.float64)


def matrix4(value, where: Where) -> np.ndarray:
    """A 4x4 matrix written as 4 rows of 4 numbers."""
    if not isinstance(value, list) or len(value) != 4 or not all(isinstance(row, list) and len(row) == 4 for row in value):
        raise where.error("must be a 4x4 matrix: a list of 4 rows of 4 numbers")
    return np.array([[number(v, where) for v in row] for row in value], dtype=np.float64)
