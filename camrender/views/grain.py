"""The proxy scene's grain: a fixed random texture over the ground's checker and the landmarks (numpy only).

A flat checker and flat-shaded landmarks give a feature detector (SIFT) little to hold on to, and the
checker repeats itself every two cells, so pose estimators (`camrender eval`) lose track on a preview.
The grain is soft blotches of light and dark, `TEXELS_PER_UNIT` per scene unit (a grid cell), tiling
every `TEXELS / TEXELS_PER_UNIT` units, the same in every frame (drawn once from a fixed seed). Where a
texel covers less than about a pixel it fades out, as the grid lines do, so far surfaces stay calm
instead of shimmering.
"""
from __future__ import annotations

import functools

import numpy as np

TEXELS = 512  # the texture is TEXELS x TEXELS, periodic (a power of two: indices wrap with a mask)
_MASK = TEXELS - 1
TEXELS_PER_UNIT = 32.0
AMPLITUDE = 0.35  # the grain scales a surface's luminance by 1 +- AMPLITUDE at most
_BLUR_TEXELS = 1.2  # Gaussian sigma of the blotches, texels
_SPREAD = 2.0  # the texture's standard deviation is 1 / _SPREAD before clipping to [-1, 1]
_SEED = 20240601
_FADE_START_PX, _FADE_FULL_PX = 0.75, 2.0  # texel sizes (pixels) between which the grain fades in


@functools.lru_cache(maxsize=1)
def texture() -> np.ndarray:
    """(TEXELS, TEXELS) float32 in [-1, 1]: white noise blurred periodically (in Fourier space), scaled
    to a standard deviation of 1 / _SPREAD and clipped."""
    noise = np.random.default_rng(_SEED).standard_normal((TEXELS, TEXELS))
    frequencies = np.fft.fftfreq(TEXELS)
    squared = frequencies[:, None] ** 2 + frequencies[None, :] ** 2
    blurred = np.real(np.fft.ifft2(np.fft.fft2(noise) * np.exp(-2 * (np.pi * _BLUR_TEXELS) ** 2 * squared)))
    blurred -= blurred.mean()
    return np.clip(blurred / (_SPREAD * blurred.std()), -1, 1).astype(np.float32)


def grain(a: np.ndarray, b: np.ndarray, pixels_per_unit: np.ndarray) -> np.ndarray:
    """The luminance factor (h, w) float32 in [1 - AMPLITUDE, 1 + AMPLITUDE] at surface coordinates
    (a, b) (scene units, shape (h, w)) seen with `pixels_per_unit` pixels per scene unit: bilinear in
    the texture, faded to 1 where texels shrink under a pixel. Non-finite coordinates (pixels a caller
    masks out) give any value, with no warning."""
    with np.errstate(invalid="ignore", over="ignore"):
        return 1 + np.float32(AMPLITUDE) * _fade(pixels_per_unit) * _texture_value(a, b)


def surface_grain(px, py, pz, normal, pixels_per_unit) -> np.ndarray:
    """`grain` on a landmark: points (px, py, pz) relative to its centre (scene units) with unit normals
    (nx, ny, nz) (each (h, w)); the texture is projected along each axis and blended by the normal's
    components to the fourth power, so a box face takes one projection and a sphere shows no seams."""
    weights = [np.square(np.square(n)) for n in normal]
    total = weights[0] + weights[1] + weights[2]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        value = sum(w * _texture_value(a, b) for w, (a, b) in zip(weights, ((pz, py), (px, pz), (px, py)))) / total
        return 1 + np.float32(AMPLITUDE) * _fade(pixels_per_unit) * value


def _fade(pixels_per_unit):
    """0 where a texel covers less than _FADE_START_PX pixels, 1 from _FADE_FULL_PX on, linear between."""
    texel_px = pixels_per_unit * np.float32(1.0 / TEXELS_PER_UNIT)
    return np.clip((texel_px - _FADE_START_PX) * np.float32(1.0 / (_FADE_FULL_PX - _FADE_START_PX)), 0, 1)


def _texture_value(a, b):
    """The texture, bilinear and periodic, at (a, b) in scene units: values in [-1, 1]."""
    u, v = a * np.float32(TEXELS_PER_UNIT), b * np.float32(TEXELS_PER_UNIT)
    u0, v0 = np.floor(u), np.floor(v)
    fu, fv = u - u0, v - v0
    index = (v0.astype(np.int32) & _MASK) * TEXELS + (u0.astype(np.int32) & _MASK)
    corners = _corners().take(index, axis=0, mode="clip")  # (h, w, 4): one gather per pixel
    top = corners[..., 0] + fu * (corners[..., 1] - corners[..., 0])
    bottom = corners[..., 2] + fu * (corners[..., 3] - corners[..., 2])
    return top + fv * (bottom - top)


@functools.lru_cache(maxsize=1)
def _corners() -> np.ndarray:
    """(TEXELS * TEXELS, 4) float32: each texel with its right, lower and lower-right neighbours (periodic)."""
    t = texture()
    right, below = np.roll(t, -1, axis=1), np.roll(t, -1, axis=0)
    return np.stack([t, right, below, np.roll(below, -1, axis=1)], axis=-1).reshape(-1, 4)
