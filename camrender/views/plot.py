"""A one-page PNG of a camera path: top and side views with view frustums, speed and field of view.

Views (OpenCV world axes: +x right, +y down, +z forward, so "up" is -y):
* top view: x (right) horizontally, z (forward) vertically, seen from above;
* side view: z (forward) horizontally, height -y vertically, seen from the +x side.
Poses are drawn as given (absolute world coordinates), not relative to frame 0.
matplotlib runs on the Agg backend: no display is ever opened.
"""
from __future__ import annotations

import math
import os
import warnings

import numpy as np

from camrender.errors import CamrenderError
from camrender.files import atomic_output
from camrender.trajectory.stats import fields_of_view, rotation_angles

_FRUSTUM_TARGET = 16  # about this many frustums per view when `every` is not given


def _nice_length(span: float) -> float:
    """A 1/2/5 x 10^k length close to a fifth of `span` (for the scale bar)."""
    if not (span > 0 and math.isfinite(span)):
        return 1.0
    raw = span / 5
    power = 10 ** math.floor(math.log10(raw))
    for step in (1, 2, 5, 10):
        if step * power >= raw:
            return step * power
    return 10 * power


def speeds(traj) -> np.ndarray:
    """(F-1,) camera speed between consecutive frames, world units per second."""
    positions = np.asarray(traj.c2w)[:, :3, 3]
    return np.linalg.norm(np.diff(positions, axis=0), axis=1) * traj.fps


def angular_speeds(traj) -> np.ndarray:
    """(F-1,) rotation speed between consecutive frames, degrees per second."""
    return rotation_angles(traj.c2w) * traj.fps


def frustum_lines(c2w: np.ndarray, intrinsics, width: int, height: int, depth: float) -> np.ndarray:
    """(8, 2, 3) world-space segments of a camera frustum: 4 edges from the centre to the image
    corners at `depth` along the optical axis, and the 4 sides of that far rectangle."""
    fx, fy, cx, cy = intrinsics
    corners_px = [(0, 0), (width, 0), (width, height), (0, height)]
    cam = np.array([[(u - cx) / fx * depth, (v - cy) / fy * depth, depth] for u, v in corners_px])
    world = cam @ c2w[:3, :3].T + c2w[:3, 3]
    centre = c2w[:3, 3]
    edges = [(centre, world[i]) for i in range(4)] + [(world[i], world[(i + 1) % 4]) for i in range(4)]
    return np.array(edges)


def _headroom(values: np.ndarray) -> float:
    """Upper y limit for a chart starting at 0 (float noise of a constant stays flat)."""
    top = float(np.max(values)) if len(values) else 0.0
    return top * 1.15 if top > 1e-9 else 1.0


def _default_every(num_frames: int) -> int:
    return max(1, int(math.ceil((num_frames - 1) / _FRUSTUM_TARGET))) if num_frames > 1 else 1


def plot_trajectory(traj, path, *, every: int | None = None) -> None:
    """Write a plot (PNG, or JPEG/PDF/SVG by the suffix of `path`) atomically, showing `traj` (a camrender Trajectory).

    every: draw a frustum every this many frames (default: about 16 per path, plus the
    last frame). Frustum depth is a tenth of the path's extent (or 1 unit for a static camera).
    matplotlib's and numpy's warnings while drawing (a glyph the font lacks in a file name, a
    degenerate axis) stay here: the plot is drawn all the same.
    """
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        _draw(traj, path, every)


def _draw(traj, path, every) -> None:
    # lazy: keeps `camrender --help` and the `traj` commands free of matplotlib (and the PIL it imports)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar

    if every is not None and every < 1:
        raise CamrenderError(f"must be at least 1, got {every}", field="every")
    c2w = np.asarray(traj.c2w, np.float64)
    positions = c2w[:, :3, 3]
    n = len(c2w)
    every = every or _default_every(n)
    extent = float(np.max(np.ptp(positions, axis=0))) if n > 1 else 0.0
    depth = extent / 10 if extent > 1e-9 else 1.0
    shown = sorted(set(range(0, n, every)) | {n - 1})

    fig = Figure(figsize=(12, 8), dpi=100)  # fixed layout: constrained layout costs seconds
    FigureCanvasAgg(fig)
    views_grid = fig.add_gridspec(1, 2, left=0.06, right=0.9, top=0.92, bottom=0.45, wspace=0.18)
    charts_grid = fig.add_gridspec(2, 1, left=0.06, right=0.9, top=0.37, bottom=0.06, hspace=0.45)
    top = fig.add_subplot(views_grid[0, 0])
    side = fig.add_subplot(views_grid[0, 1])
    speed_ax = fig.add_subplot(charts_grid[0, 0])
    fov_ax = fig.add_subplot(charts_grid[1, 0], sharex=speed_ax)
    colour_ax = fig.add_axes([0.925, 0.45, 0.012, 0.47])

    # (horizontal, vertical) world components of each view; side view shows height = -y
    views = [
        (top, lambda p: (p[..., 0], p[..., 2]), "x (right)", "z (forward)", "top view (x-z, from above)"),
        (side, lambda p: (p[..., 2], -p[..., 1]), "z (forward)", "height = -y (up)", "side view (z-y, from +x)"),
    ]
    frames = np.arange(n)
    for ax, project, xlabel, ylabel, title in views:
        h, v = project(positions)
        segments = np.concatenate(
            [frustum_lines(c2w[f], traj.intrinsics[f], traj.width, traj.height, depth) for f in shown]
        )
        sh, sv = project(segments)  # (S, 2) each
        ax.add_collection(LineCollection(np.stack([sh, sv], axis=-1), colors="0.55", linewidths=0.7, zorder=1))
        points = ax.scatter(h, v, c=frames, cmap="viridis", s=8, zorder=2)
        ax.plot(h, v, color="0.3", lw=0.8, zorder=2)
        ax.scatter(h[:1], v[:1], marker="o", s=90, facecolor="none", edgecolor="tab:green", lw=2, zorder=3, label="start")
        ax.scatter(h[-1:], v[-1:], marker="s", s=90, facecolor="none", edgecolor="tab:red", lw=2, zorder=3, label="end")
        ax.set_aspect("equal", adjustable="datalim")
        ax.margins(0.08)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, lw=0.3)
        ax.legend(loc="upper right", fontsize=8)
        # the frustums (already in the data limits) keep the view at least `depth` wide
        all_h, all_v = project(np.concatenate([positions, positions + c2w[:, :3, 2] * depth]))
        bar = _nice_length(max(np.ptp(all_h), np.ptp(all_v), depth))
        ax.add_artist(AnchoredSizeBar(ax.transData, bar, f"{bar:g} units", "lower left", pad=0.4,
                                      frameon=True, size_vertical=0, fontproperties={"size": 8}))
    fig.colorbar(points, cax=colour_ax, label="frame")

    if n > 1:
        mid = frames[:-1] + 0.5
        linear, turning = speeds(traj), angular_speeds(traj)
        speed_ax.plot(mid, linear, color="tab:blue", lw=1.2, label="speed")
        speed_ax.set_ylabel("units / s", color="tab:blue")
        speed_ax.set_ylim(0, _headroom(linear))
        turn_ax = speed_ax.twinx()
        turn_ax.plot(mid, turning, color="tab:orange", lw=1.0, ls="--", label="turn rate")
        turn_ax.set_ylabel("deg / s", color="tab:orange")
        turn_ax.set_ylim(0, _headroom(turning))
        speed_ax.set_title("speed (blue) and rotation speed (orange) between frames", fontsize=9)
    else:
        speed_ax.text(0.5, 0.5, "single frame: no motion", ha="center", va="center", transform=speed_ax.transAxes)
        speed_ax.set_title("speed", fontsize=9)
    hfov, vfov = fields_of_view(traj.intrinsics, traj.width, traj.height)
    fov_ax.plot(frames, hfov, label="horizontal", color="tab:purple")
    fov_ax.plot(frames, vfov, label="vertical", color="tab:brown")
    fov_ax.set_ylabel("fov (deg)")
    fov_ax.set_xlabel(f"frame ({traj.fps:g} fps)")
    fov_ax.legend(loc="upper right", fontsize=8)
    lo, hi = float(min(hfov.min(), vfov.min())), float(max(hfov.max(), vfov.max()))
    if hi - lo < 1.0:  # a constant fov: show a readable band instead of float noise
        fov_ax.set_ylim(lo - 5, hi + 5)
    name = os.path.basename(str(traj.source)) if getattr(traj, "source", None) else "trajectory"
    fig.suptitle(f"{name}: {n} frames, {(n - 1) / traj.fps:.2f} s at {traj.fps:g} fps, "
                 f"{traj.width}x{traj.height}, path length {np.sum(np.linalg.norm(np.diff(positions, axis=0), axis=1)):.3g} units")
    _save_atomic(fig, path)


PLOT_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".pdf": "pdf", ".svg": "svg"}


def plot_format(path) -> str:
    """matplotlib's format name for the plot file `path`, by its suffix; CamrenderError for others."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in PLOT_FORMATS:
        raise CamrenderError(f"a plot is written as {', '.join(PLOT_FORMATS)}; got {suffix or 'no suffix'!r}",
                             path=os.fspath(path))
    return PLOT_FORMATS[suffix]


def _save_atomic(fig, path) -> None:
    fmt = plot_format(path)
    with atomic_output(path, "wb") as out:
        fig.savefig(out, format=fmt)
