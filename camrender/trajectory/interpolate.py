"""Sample a keyframed camera path at arbitrary times.

Positions: cubic Hermite spline whose tangents are the time-weighted three-point
derivative (a Catmull-Rom spline for non-uniform key times; C1, passes through every
key, no global overshoot), or piecewise linear. Rotations: quaternion slerp per
segment, or squad (Shoemake's spherical spline, C1). Focal lengths: linear in
tan(fov/2) space, i.e. in (size/2)/f, so a zoom changes the field of view evenly;
principal points linearly. Times outside the key range hold the first/last key.
"""
from __future__ import annotations

import numpy as np

from camrender.trajectory import rotations

POSITION_METHODS = ("spline", "linear")
ROTATION_METHODS = ("slerp", "squad")


def _segments(times: np.ndarray, samples: np.ndarray):
    """For each sample: its segment index i (keys i, i+1) and local parameter s in [0, 1]."""
    clamped = np.clip(samples, times[0], times[-1])
    index = np.clip(np.searchsorted(times, clamped, side="right") - 1, 0, max(len(times) - 2, 0))
    if len(times) == 1:
        return index, np.zeros_like(clamped)
    span = times[index + 1] - times[index]
    return index, (clamped - times[index]) / span


def hermite_tangents(times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Time-weighted three-point derivative at every key; ends use the quadratic end condition. values: (K, D)."""
    k = len(times)
    tangents = np.zeros_like(values)
    if k < 2:
        return tangents
    steps = times[1:] - times[:-1]
    secants = (values[1:] - values[:-1]) / steps[:, None]
    tangents[0] = secants[0]
    tangents[-1] = secants[-1]
    h0, h1 = steps[:-1, None], steps[1:, None]  # inner key i: the steps before and after it
    tangents[1:-1] = (secants[:-1] * h1 + secants[1:] * h0) / (h0 + h1)
    if k >= 3 and values.shape[1] == 3:
        tangents[0] = _arc_end_tangent(values[0], values[1], values[2], times[1] - times[0])
        tangents[-1] = -_arc_end_tangent(values[-1], values[-2], values[-3], times[-1] - times[-2])
    return tangents


def _arc_end_tangent(a, b, c, h) -> np.ndarray:
    """Velocity at ``a`` of the circle through a, b, c travelled from a to b in time h (a straight line if collinear).

    Makes a spline through points on a circle (orbits) stay on it up to the end keys.
    """
    ab, ac = b - a, c - a
    normal = np.cross(ab, ac)
    nn = float(np.dot(normal, normal))
    chord = float(np.linalg.norm(ab))
    if chord == 0.0:
        return np.zeros(3)
    if nn <= 1e-18 * max(float(np.dot(ab, ab)) * float(np.dot(ac, ac)), 1e-300):
        return ab / h
    # circumcentre relative to a
    centre = (np.dot(ac, ac) * np.cross(normal, ab) + np.dot(ab, ab) * np.cross(ac, normal)) / (2.0 * nn)
    radius = float(np.linalg.norm(centre))
    direction = np.cross(normal, -centre)  # perpendicular to the radius at a, in the plane, toward b
    direction /= np.linalg.norm(direction)
    if np.dot(direction, ab) < 0:
        direction = -direction
    angle = 2.0 * np.arcsin(min(1.0, chord / (2.0 * radius)))
    return direction * (radius * angle / h)


def interpolate_vectors(times, values, samples, method: str = "spline") -> np.ndarray:
    """Interpolate (K, D) key values at (M,) sample times -> (M, D)."""
    times = np.asarray(times, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    samples = np.asarray(samples, dtype=np.float64)
    if len(times) == 1:
        return np.repeat(values, len(samples), axis=0)
    index, s = _segments(times, samples)
    p0, p1 = values[index], values[index + 1]
    if method == "linear":
        return p0 + s[:, None] * (p1 - p0)
    tangents = hermite_tangents(times, values)
    h = (times[index + 1] - times[index])[:, None]
    m0, m1 = tangents[index] * h, tangents[index + 1] * h
    s = s[:, None]
    s2, s3 = s * s, s * s * s
    return (2 * s3 - 3 * s2 + 1) * p0 + (s3 - 2 * s2 + s) * m0 + (-2 * s3 + 3 * s2) * p1 + (s3 - s2) * m1


def interpolate_rotations(times, matrices, samples, method: str = "slerp") -> np.ndarray:
    """Interpolate (K, 3, 3) key rotations at (M,) sample times -> (M, 3, 3)."""
    times = np.asarray(times, dtype=np.float64)
    samples = np.asarray(samples, dtype=np.float64)
    quats = rotations.make_continuous(np.stack([rotations.matrix_to_quat(m) for m in matrices]))
    if len(times) == 1:
        return np.repeat(rotations.quat_to_matrix(quats[0])[None], len(samples), axis=0)
    index, s = _segments(times, samples)
    controls = rotations.squad_controls(quats) if method == "squad" else None
    out = np.empty((len(samples), 3, 3))
    for j, (i, sj) in enumerate(zip(index, s)):
        if controls is None:
            q = rotations.slerp(quats[i], quats[i + 1], sj)
        else:
            q = rotations.squad(quats[i], quats[i + 1], controls[i], controls[i + 1], sj)
        out[j] = rotations.quat_to_matrix(q)
    return out


def interpolate_intrinsics(times, intrinsics, samples, width: float, height: float) -> np.ndarray:
    """Interpolate (K, 4) [fx, fy, cx, cy] keys: focal linear in tan(fov/2), centre linear -> (M, 4)."""
    intrinsics = np.asarray(intrinsics, dtype=np.float64)
    tangent_space = np.stack(
        [0.5 * width / intrinsics[:, 0], 0.5 * height / intrinsics[:, 1], intrinsics[:, 2], intrinsics[:, 3]], axis=1
    )
    sampled = interpolate_vectors(times, tangent_space, samples, method="linear")
    return np.stack(
        [0.5 * width / sampled[:, 0], 0.5 * height / sampled[:, 1], sampled[:, 2], sampled[:, 3]], axis=1
    )


def sample_path(times, c2w, intrinsics, samples, width, height, position="spline", rotation="slerp"):
    """Sample keyed poses (K, 4, 4) and intrinsics (K, 4) at times (M,) -> c2w (M, 4, 4), intrinsics (M, 4)."""
    c2w = np.asarray(c2w, dtype=np.float64)
    out = np.zeros((len(samples), 4, 4))
    out[:, :3, :3] = interpolate_rotations(times, c2w[:, :3, :3], samples, rotation)
    out[:, :3, 3] = interpolate_vectors(times, c2w[:, :3, 3], samples, position)
    out[:, 3, 3] = 1.0
    return out, interpolate_intrinsics(times, intrinsics, samples, width, height)
