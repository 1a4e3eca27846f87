"""One request field's value as its kind (`camrender.serve.fields`) wants it: from JSON's own types, or from the text
of a multipart field. Each refusal is a `ServeError` (400, or 413 for an image over the size limit) naming the field.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import re
from typing import Optional

from camrender.serve.errors import ServeError
from camrender.trajectory.fields import type_name

SIZE = re.compile(r"^\s*(\d{1,6})\s*[xX]\s*(\d{1,6})\s*$")
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclasses.dataclass(frozen=True)
class Upload:
    """A file part of a multipart body: the name the client gave it (or None) and its bytes."""

    filename: Optional[str]
    data: bytes


def _refuse(name: str, message: str) -> ServeError:
    return ServeError(400, message, param=name)


def text(value, name: str) -> str:
    if isinstance(value, Upload):
        try:
            return value.data.decode("utf-8")
        except UnicodeDecodeError:
            raise _refuse(name, "must be UTF-8 text") from None
    if not isinstance(value, str):
        raise _refuse(name, f"must be a string, got {_kind(value)}")
    return value


def integer(value, name: str) -> int:
    """An integer: a JSON integer (or a float with no fraction) or the digits of a form field."""
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise _refuse(name, f"must be an integer, got {value[:40]!r}") from None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(name, f"must be an integer, got {_kind(value)}")
    return value


def number(value, name: str) -> float:
    """A finite number: a JSON number or the text of one."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise _refuse(name, f"must be a number, got {value[:40]!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(name, f"must be a number, got {_kind(value)}")
    try:
        value = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise _refuse(name, "must be a finite number") from None
    if not math.isfinite(value):
        raise _refuse(name, f"must be a finite number, got {value}")
    return value


def boolean(value, name: str) -> bool:
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    if not isinstance(value, bool):
        raise _refuse(name, f"must be true or false, got {_kind(value)}")
    return value


def size(value, name: str) -> tuple:
    """(width, height) of "WIDTHxHEIGHT"."""
    found = SIZE.match(text(value, name))
    if not found:
        raise _refuse(name, f"must be WIDTHxHEIGHT such as 1280x704, got {str(value)[:40]!r}")
    return int(found.group(1)), int(found.group(2))


def json_object(value, name: str) -> dict:
    """A JSON object, or the text of one (a multipart field)."""
    if isinstance(value, (str, Upload)):
        try:
            value = json.loads(text(value, name))
        except (ValueError, RecursionError):
            raise _refuse(name, "must be a JSON object (its text is not JSON)") from None
    if not isinstance(value, dict):
        raise _refuse(name, f"must be a JSON object, got {_kind(value)}")
    return value


def image_bytes(value, name: str, max_bytes: int) -> bytes:
    """The bytes of an image field: a file part, base64, a `data:` URL, or vLLM-Omni's {"image_url": ...}. A URL
    of any other scheme is refused: the server fetches nothing."""
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"image_url"})
        if unknown:
            raise _refuse(f"{name}.{unknown[0]}", "not taken: send the image itself ({\"image_url\": \"data:...\"})")
        return image_bytes(value.get("image_url"), f"{name}.image_url", max_bytes)
    if isinstance(value, Upload):
        data = value.data
    else:
        data = _decode_base64(text(value, name).strip(), name, max_bytes)
    if not data:
        raise _refuse(name, "is empty")
    if len(data) > max_bytes:
        raise ServeError(413, f"the image has {len(data)} bytes, more than the server's limit of {max_bytes}",
                         param=name, code="too_large")
    return data


def _decode_base64(encoded: str, name: str, max_bytes: int) -> bytes:
    scheme = encoded.split(":", 1)[0].lower() if ":" in encoded[:16] else None
    if scheme is not None and scheme != "data":
        raise _refuse(name, f"a {scheme}: URL is refused: the server fetches nothing (upload the file, or send it as "
                            "base64 or a data: URL)")
    if scheme == "data":
        header, _, encoded = encoded.partition(",")
        if not header.lower().endswith(";base64"):
            raise _refuse(name, "a data: URL must be base64 (data:image/png;base64,...)")
    if len(encoded) > 4 * (max_bytes // 3 + 2) + 1024:  # before decoding: a limit on the work, not only the result
        raise ServeError(413, f"the image is more than the server's limit of {max_bytes} bytes", param=name,
                         code="too_large")
    try:
        return base64.b64decode("".join(encoded.split()), validate=True)
    except (binascii.Error, ValueError):
        raise _refuse(name, "is not base64 (nor a file part of a multipart body)") from None


def _kind(value) -> str:
    """A JSON value's kind in words for messages (`type_name`), with a number's or a string's value."""
    if isinstance(value, Upload):
        return "a file"
    shown = repr(value)[:40] if isinstance(value, (int, float, str)) and not isinstance(value, bool) else ""
    return f"{type_name(value)} {shown}".strip()
