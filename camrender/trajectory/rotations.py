"""Rotation helpers: quaternions (w, x, y, z), slerp, squad, look-at frames, axis conventions.

All functions use float64 numpy arrays. Quaternions are unit, scalar first.
"""
from __future__ import annotations

import numpy as np

# Flip between OpenGL camera axes (+x right, +y up, +z backward) and OpenCV (+x right, +y down, +z forward).
GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])


def flip_camera_axes(c2w: np.ndarray) -> np.ndarray:
    """OpenGL <-> OpenCV camera-to-world (the flip is its own inverse); works on (..., 4, 4)."""
    return np.asarray(c2w, dtype=np.float64) @ GL_TO_CV


def invert_rigid(m: np.ndarray) -> np.ndarray:
    """Closed-form inverse of rigid transforms (..., 4, 4): [R t] -> [R^T, -R^T t]."""
    m = np.asarray(m, dtype=np.float64)
    out = np.zeros_like(m)
    rt = np.swapaxes(m[..., :3, :3], -1, -2)
    out[..., :3, :3] = rt
    out[..., :3, 3] = -np.einsum("...ij,...j->...i", rt, m[..., :3, 3])
    out[..., 3, 3] = 1.0
    return out


def relative_poses(c2w: np.ndarray) -> np.ndarray:
    """(F, 4, 4) poses relative to frame 0: inv(c2w_0) @ c2w_f; frame 0 is exactly the identity."""
    c2w = np.asarray(c2w, dtype=np.float64)
    out = invert_rigid(c2w[0]) @ c2w
    out[0] = np.eye(4)
    return out


def matrix_to_quat(r: np.ndarray) -> np.ndarray:
    """(3, 3) rotation -> unit quaternion (w, x, y, z) with w >= 0 (Shepperd's method)."""
    r = np.asarray(r, dtype=np.float64)
    trace = r[0, 0] + r[1, 1] + r[2, 2]
    if trace > 0:
        s = 2.0 * np.sqrt(1.0 + trace)
        q = [0.25 * s, (r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s]
    elif r[0, 0] > r[1, 1] and r[0, 0] > r[2, 2]:
        s = 2.0 * np.sqrt(1.0 + r[0, 0] - r[1, 1] - r[2, 2])
        q = [(r[2, 1] - r[1, 2]) / s, 0.25 * s, (r[0, 1] + r[1, 0]) / s, (r[0, 2] + r[2, 0]) / s]
    elif r[1, 1] > r[2, 2]:
        s = 2.0 * np.sqrt(1.0 + r[1, 1] - r[0, 0] - r[2, 2])
        q = [(r[0, 2] - r[2, 0]) / s, (r[0, 1] + r[1, 0]) / s, 0.25 * s, (r[1, 2] + r[2, 1]) / s]
    else:
        s = 2.0 * np.sqrt(1.0 + r[2, 2] - r[0, 0] - r[1, 1])
        q = [(r[1, 0] - r[0, 1]) / s, (r[0, 2] + r[2, 0]) / s, (r[1, 2] + r[2, 1]) / s, 0.25 * s]
    q = np.array(q)
    q /= np.linalg.norm(q)
    return q if q[0] >= 0 else -q


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    """Unit quaternion (w, x, y, z) -> (3, 3) rotation."""
    w, x, y, z = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product a * b."""
    w1, x1, y1, z1 = a
    w2, x2, y2, z2 = b
    return np.array(
        [
            w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
            w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
            w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
            w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
        ]
    )


def quat_conj(q: np.ndarray) -> np.ndarray:
    return np.array([q[0], -q[1], -q[2], -q[3]])


def quat_log(q: np.ndarray) -> np.ndarray:
    """Log of a unit quaternion as a pure quaternion (0, v * angle/2)."""
    w = float(np.clip(q[0], -1.0, 1.0))
    v = np.asarray(q[1:], dtype=np.float64)
    norm = np.linalg.norm(v)
    if norm < 1e-12:
        return np.zeros(4)
    return np.concatenate([[0.0], v / norm * np.arctan2(norm, w)])


def quat_exp(q: np.ndarray) -> np.ndarray:
    """Exp of a pure quaternion (0, v)."""
    v = np.asarray(q[1:], dtype=np.float64)
    angle = np.linalg.norm(v)
    if angle < 1e-12:
        return np.array([1.0, *v])
    return np.concatenate([[np.cos(angle)], v / angle * np.sin(angle)])


def slerp(q0: np.ndarray, q1: np.ndarray, s: float) -> np.ndarray:
    """Spherical linear interpolation from q0 (s=0) to q1 (s=1) along the shorter arc."""
    q0 = np.asarray(q0, dtype=np.float64)
    q1 = np.asarray(q1, dtype=np.float64)
    if np.dot(q0, q1) < 0:
        q1 = -q1
    return _slerp_no_flip(q0, q1, s)


def make_continuous(quats: np.ndarray) -> np.ndarray:
    """Flip signs so consecutive quaternions lie in the same hemisphere (shortest arcs)."""
    out = np.array(quats, dtype=np.float64, copy=True)
    for i in range(1, len(out)):
        if np.dot(out[i - 1], out[i]) < 0:
            out[i] = -out[i]
    return out


def squad_controls(quats: np.ndarray) -> np.ndarray:
    """Shoemake's inner control quaternions s_i for squad through continuous key quaternions."""
    n = len(quats)
    controls = np.array(quats, dtype=np.float64, copy=True)
    for i in range(1, n - 1):
        inv = quat_conj(quats[i])
        a = quat_log(quat_mul(inv, quats[i + 1]))
        b = quat_log(quat_mul(inv, quats[i - 1]))
        controls[i] = quat_mul(quats[i], quat_exp(-(a + b) / 4.0))
    return controls


def squad(q0, q1, s0, s1, s: float) -> np.ndarray:
    """Spherical quadrangle interpolation between q0 and q1 with controls s0, s1."""
    outer = slerp(q0, q1, s)
    inner = slerp(s0, s1, s)
    q = _slerp_no_flip(outer, inner, 2 * s * (1 - s))
    return q / np.linalg.norm(q)


def _slerp_no_flip(q0, q1, s):
    """Slerp along the arc from q0 to q1 as given (no sign flip to the shorter arc)."""
    dot = float(np.clip(np.dot(q0, q1), -1.0, 1.0))
    if abs(dot) > 0.9999995:
        q = q0 + s * (q1 - q0)
        return q / np.linalg.norm(q)
    theta = np.arccos(dot)
    return (np.sin((1 - s) * theta) * q0 + np.sin(s * theta) * q1) / np.sin(theta)


def look_at_rotation(position, target, up) -> np.ndarray | None:
    """OpenCV camera-to-world rotation looking from ``position`` at ``target``.

    Columns are the camera's x (right), y (down), z (forward) axes in world coordinates;
    ``up`` is the world direction that should appear up in the image (camera -y).
    Returns None when the view direction is zero or parallel to ``up``.
    """
    forward = np.asarray(target, dtype=np.float64) - np.asarray(position, dtype=np.float64)
    norm = np.linalg.norm(forward)
    if not np.isfinite(norm) or norm < 1e-12:
        return None
    z = forward / norm
    x = np.cross(z, np.asarray(up, dtype=np.float64))
    xn = np.linalg.norm(x)
    if not np.isfinite(xn) or xn < 1e-9:
        return None
    x /= xn
    y = np.cross(z, x)
    return np.stack([x, y, z], axis=1)


def rot_x(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def rot_y(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def rot_z(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
