"""NVlabs SANA-WM's trajectory files: ``NAME_pose.npy`` and ``NAME_intrinsics.npy``.

- Poses: (F, 4, 4) floating-point camera-to-world matrices, OpenCV axes (+x right, +y down,
  +z forward), one per video frame.
- Intrinsics: (3, 3) or (4,) for every frame, or per frame (F', 3, 3) / (F', 4); [fx, fy, cx, cy]
  in pixels of the first-frame image as given (before any resize). Fitted in time to the F frames
  of the path as NVlabs' ``load_intrinsics`` does: a longer sequence is cut to its first F, one
  of length 1 repeats, a shorter one is interpolated linearly over the same start and end.
  Without an intrinsics file (given, or ``NAME_intrinsics.npy`` beside ``NAME_pose.npy``), the
  path gets a centred pinhole of `DEFAULT_FOV` degrees horizontally.

The image size the intrinsics refer to is the first-frame image's when it is known
(``image_size``: renders and ``--image`` give it), else `DEFAULT_SIZE`, the release render size
(what ``traj convert --image`` writes, so such a path survives a round trip through the pair). Files are read with ``allow_pickle=False`` after a size check.
`write` writes ``NAME_pose.npy`` plus ``NAME_intrinsics.npy`` ((F, 4), pixels of the path's
width x height) beside it, both float64.
"""
from __future__ import annotations

import io
import math
import os

import numpy as np

from camrender.errors import CamrenderError
from camrender.trajectory.formats.fileio import atomic_output
from camrender.trajectory.model import DEFAULT_FPS, MAX_FRAMES, Trajectory

NAME = "npy"
SUFFIXES = (".npy",)
DESCRIPTION = "NVlabs SANA-WM NAME_pose.npy (F,4,4 c2w, OpenCV) with NAME_intrinsics.npy beside it"

DEFAULT_FOV = 60.0  # degrees, horizontal
DEFAULT_SIZE = (1280, 704)  # (width, height) when no image tells: the release render size
MAX_BYTES = MAX_FRAMES * 16 * 8 + 4096  # the largest (F, 4, 4) float64 file we accept, header included
INTRINSICS_SHAPES = "(3, 3), (F, 3, 3), (4,) or (F, 4)"


def load_array(path, what: str) -> np.ndarray:
    """A float64 array from a .npy file: no pickles, no files over `MAX_BYTES`, floating point only."""
    shown = os.fspath(path)
    if not shown.lower().endswith(".npy"):
        raise CamrenderError(f"{what} must be a .npy file", path=shown, field=what)
    if not os.path.isfile(path):
        raise CamrenderError("file not found" if not os.path.exists(path) else "is not a file", path=shown)
    size = os.path.getsize(path)
    if size > MAX_BYTES:
        raise CamrenderError(f"file is {size} bytes, more than a {MAX_FRAMES}-frame path ({MAX_BYTES})",
                             path=shown, field=what)
    _check_header(path, shown, what)
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as error:
        text = str(error)
        reason = "holds Python objects (a pickle); camrender never loads pickles" if "pickle" in text else text[:120]
        raise CamrenderError(f"cannot read: {reason}", path=shown, field=what) from None
    except (OSError, EOFError) as error:
        raise CamrenderError(f"cannot read: {error}", path=shown, field=what) from None
    if not isinstance(array, np.ndarray) or array.dtype.kind != "f":
        kind = getattr(array, "dtype", type(array).__name__)
        raise CamrenderError(f"must hold floating-point numbers, got {kind}", path=shown, field=what)
    return np.asarray(array, dtype=np.float64)


def _check_header(path, shown: str, what: str) -> None:
    """Refuse, from the header alone, a file that is no .npy, holds objects or declares more than `MAX_BYTES`."""
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(handle)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError):
        raise CamrenderError("not a .npy array file (a pickle, or damaged)", path=shown, field=what) from None
    if dtype.hasobject:
        raise CamrenderError("holds Python objects (a pickle); camrender never loads pickles", path=shown, field=what)
    if math.prod(shape) * dtype.itemsize > MAX_BYTES:
        raise CamrenderError(f"declares an array of shape {shape}, more than {MAX_BYTES} bytes", path=shown, field=what)


def load_poses(path) -> np.ndarray:
    """(F, 4, 4) float64 c2w from a pose .npy; CamrenderError naming the file and shape (frames are checked later)."""
    poses = load_array(path, "c2w")
    if poses.ndim != 3 or poses.shape[1:] != (4, 4) or poses.shape[0] == 0:
        raise CamrenderError(f"poses must have shape (F, 4, 4), got {poses.shape}", path=os.fspath(path), field="c2w")
    return poses


def fit_in_time(values: np.ndarray, num_frames: int) -> np.ndarray:
    """(F', ...) -> (num_frames, ...): cut, repeated (F' = 1) or linearly interpolated over [0, 1] (F' < F)."""
    count = values.shape[0]
    if count >= num_frames:
        return values[:num_frames].copy()
    if count == 1:
        return np.repeat(values, num_frames, axis=0)
    flat = values.reshape(count, -1)
    old, new = np.linspace(0.0, 1.0, count), np.linspace(0.0, 1.0, num_frames)
    fitted = np.stack([np.interp(new, old, flat[:, i]) for i in range(flat.shape[1])], axis=1)
    return fitted.reshape((num_frames, *values.shape[1:]))


def load_intrinsics(path, num_frames: int) -> np.ndarray:
    """(num_frames, 4) [fx, fy, cx, cy] from an intrinsics .npy of any of `INTRINSICS_SHAPES`."""
    values = load_array(path, "intrinsics")
    where = os.fspath(path)
    if values.shape == (4,) or values.shape == (3, 3):
        values = values[None]
    if values.ndim == 3 and values.shape[1:] == (3, 3) and values.shape[0] > 0:
        values = np.stack([values[:, 0, 0], values[:, 1, 1], values[:, 0, 2], values[:, 1, 2]], axis=1)
    elif not (values.ndim == 2 and values.shape[1] == 4 and values.shape[0] > 0):
        raise CamrenderError(f"intrinsics must have shape {INTRINSICS_SHAPES}, got {values.shape}", path=where,
                             field="intrinsics")
    if values.shape[0] > MAX_FRAMES:
        raise CamrenderError(f"more than {MAX_FRAMES} frames", path=where, field="intrinsics")
    for index, row in enumerate(values):  # the file's own frames, before fitting
        for name, value in zip(("fx", "fy", "cx", "cy"), row):
            if not math.isfinite(value):
                raise CamrenderError(f"must be a finite number, got {value}", path=where, frame=index, field=name)
            if name in ("fx", "fy") and value <= 0:
                raise CamrenderError(f"focal length must be positive, got {value:g}", path=where, frame=index,
                                     field=name)
    return fit_in_time(values, num_frames)


def sidecar(pose_path) -> str | None:
    """``NAME_intrinsics.npy`` beside ``NAME_pose.npy`` (or ``NAME.npy``) when that file exists, else None."""
    stem = os.fspath(pose_path)[: -len(".npy")]
    stem = stem[: -len("_pose")] if stem.endswith("_pose") else stem
    candidate = stem + "_intrinsics.npy"
    return candidate if os.path.isfile(candidate) else None


def default_intrinsics(num_frames: int, width: int, height: int, fov: float = DEFAULT_FOV) -> np.ndarray:
    focal = 0.5 * width / math.tan(math.radians(fov) / 2)
    return np.tile([focal, focal, width / 2, height / 2], (num_frames, 1))


def with_intrinsics(traj: Trajectory, path, image_size=None) -> Trajectory:
    """`traj` with the intrinsics of the .npy `path` (pixels of `image_size`, else of `DEFAULT_SIZE`)."""
    intrinsics = load_intrinsics(path, traj.num_frames)
    image_size = image_size or DEFAULT_SIZE
    return traj.replace(intrinsics=intrinsics, width=int(image_size[0]), height=int(image_size[1]))


def read(path, *, intrinsics=None, image_size=None, notes=None) -> Trajectory:
    """A Trajectory from a pose .npy, with `intrinsics` (a .npy path), else the file beside it, else
    the default field of view (a note goes to the `notes` list when given)."""
    shown = os.fspath(path)
    poses = load_poses(path)
    if poses.shape[0] > MAX_FRAMES:
        raise CamrenderError(f"more than {MAX_FRAMES} frames", path=shown, field="c2w")
    intrinsics = intrinsics if intrinsics is not None else sidecar(path)
    width, height = image_size or DEFAULT_SIZE
    traj = Trajectory(poses, default_intrinsics(len(poses), width, height), width, height, DEFAULT_FPS, source=shown)
    if intrinsics is not None:
        traj = with_intrinsics(traj, intrinsics, image_size)
        if image_size is None and notes is not None:
            notes.append(f"{shown}: the intrinsics of {os.fspath(intrinsics)} are taken as pixels of a "
                         f"{width}x{height} image (no first-frame image gives the size: pass --image)")
    elif notes is not None:
        notes.append(f"{shown}: no intrinsics (--intrinsics or NAME_intrinsics.npy beside it): "
                     f"a {DEFAULT_FOV:g} degree horizontal field of view")
    return traj.validate()


def intrinsics_path_for(pose_path) -> str:
    """Where `write` puts the intrinsics of ``pose_path``: ``NAME_intrinsics.npy`` beside ``NAME_pose.npy``."""
    stem = os.fspath(pose_path)[: -len(".npy")] if os.fspath(pose_path).lower().endswith(".npy") else os.fspath(pose_path)
    stem = stem[: -len("_pose")] if stem.endswith("_pose") else stem
    return stem + "_intrinsics.npy"


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype=np.float64), allow_pickle=False)
    return buffer.getvalue()


def write(traj: Trajectory, path) -> list:
    """``path`` (F, 4, 4) c2w and ``NAME_intrinsics.npy`` (F, 4) beside it, both from temporary files
    renamed into place once both are written; returns both paths."""
    with atomic_output(path, "wb") as poses, atomic_output(intrinsics_path_for(path), "wb") as intrinsics:
        poses.write(_npy_bytes(traj.c2w))
        intrinsics.write(_npy_bytes(traj.intrinsics))
    return [path, intrinsics_path_for(path)]
