"""The header of a safetensors file, read and checked without loading a tensor (no torch): which tensors it
holds, their dtypes and shapes, its metadata, and whether the file is whole.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON ({name: {"dtype", "shape",
"data_offsets"}, "__metadata__": {str: str}}), then the tensors' bytes. It is whole when every tensor's byte
range has the size its dtype and shape give, the ranges tile the data without gaps, and the data ends where
the file ends.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct

from camrender.files import open_regular

MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit
# safetensors' dtype codes -> (torch's dtype name, bytes per element)
DTYPES = {"F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
          "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1),
          "U16": ("uint16", 2), "U32": ("uint32", 4), "U64": ("uint64", 8), "BOOL": ("bool", 1),
          "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1)}


def read_header(path) -> tuple:
    """({tensor name: (dtype name as torch spells it, shape list)}, metadata dict) of the safetensors file at
    `path`; ValueError saying what is wrong when the file is not whole (CamrenderError when it is missing or not a
    regular file, OSError when it cannot be read)."""
    with open_regular(path, "safetensors file") as handle:
        length = os.fstat(handle.fileno()).st_size
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"{length} bytes, shorter than a header")
        (size,) = struct.unpack("<Q", head)
        if size > min(MAX_HEADER_BYTES, length - 8):
            raise ValueError(f"a header of {size} bytes in a file of {length}")
        header = json.loads(handle.read(size).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("the metadata is not a map of strings")
    layout, ranges = {}, []
    for name, entry in header.items():
        try:
            dtype, itemsize = DTYPES[entry["dtype"]]
            shape, (start, stop) = list(entry["shape"]), entry["data_offsets"]
            if not all(isinstance(n, int) and n >= 0 for n in (*shape, start, stop)):
                raise TypeError
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"tensor {name}: a malformed entry") from None
        if stop - start != math.prod(shape) * itemsize:
            raise ValueError(f"tensor {name}: {stop - start} bytes for a {dtype} tensor of shape {shape}")
        layout[name] = (dtype, shape)
        ranges.append((start, stop))
    end = 0
    for start, stop in sorted(ranges):
        if start != end:
            raise ValueError(f"the tensors' bytes overlap or leave a gap at {start}")
        end = stop
    if 8 + size + end != length:
        raise ValueError(f"the tensors end at byte {8 + size + end}, the file at {length}: cut short or padded")
    return layout, metadata


def layout_fingerprint(layout: dict) -> str:
    """sha256 of a {name: (dtype name, shape)} layout, independent of order."""
    rows = sorted([name, dtype, [int(n) for n in shape]] for name, (dtype, shape) in layout.items())
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()
