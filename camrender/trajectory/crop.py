"""The first frame's resize-to-cover and centre crop, and the same map for pinhole intrinsics.

The rule of diffusers' and NVlabs' ``resize_and_center_crop`` / ``transform_intrinsics_for_crop``:
scale = max(dst_h / src_h, dst_w / src_w); resized = (max(dst_w, round(src_w * scale)),
max(dst_h, round(src_h * scale))); crop offset = ((resized_w - dst_w) // 2, (resized_h - dst_h) // 2).
"""
from __future__ import annotations

import numpy as np


def cover_crop_geometry(src_size, dst_size):
    """Resize (aspect kept, covering ``dst_size``) then centre crop.

    Args: src_size, dst_size: (width, height) in pixels.
    Returns: ((resized_width, resized_height), (left, top)) -- the resized size and the crop offset.
    """
    src_w, src_h = src_size
    dst_w, dst_h = dst_size
    scale = max(dst_h / src_h, dst_w / src_w)
    resized_w = max(dst_w, int(round(src_w * scale)))
    resized_h = max(dst_h, int(round(src_h * scale)))
    return (resized_w, resized_h), ((resized_w - dst_w) // 2, (resized_h - dst_h) // 2)


def crop_intrinsics(intrinsics: np.ndarray, src_size, dst_size) -> np.ndarray:
    """[fx, fy, cx, cy] (..., 4) in pixels of ``src_size`` -> pixels of the cover-resized, centre-cropped ``dst_size``."""
    (resized_w, resized_h), (left, top) = cover_crop_geometry(src_size, dst_size)
    sx, sy = resized_w / src_size[0], resized_h / src_size[1]
    out = np.array(intrinsics, dtype=np.float64, copy=True)
    out[..., 0] *= sx
    out[..., 2] = out[..., 2] * sx - left
    out[..., 1] *= sy
    out[..., 3] = out[..., 3] * sy - top
    return out
