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
from camrender.trajectory.stats import fields_of_view, fmt_length, rotation_angles

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


# corners of a view, in axes fractions, in the order they are preferred for the scale bar and the legend
_CORNERS = {"lower left": (0.0, 0.0), "lower right": (1.0, 0.0), "upper left": (0.0, 1.0), "upper right": (1.0, 1.0)}
_CORNER_BOX = (0.4, 0.16)  # the room a scale bar or the legend takes in a corner, axes fractions


def corners_by_room(ax, points: np.ndarray, markers: np.ndarray) -> list:
    """The names of `_CORNERS` of `ax`, emptiest first: how many of `points` ((N, 2) data coordinates: the
    path, the frustums) fall in each corner's box, a point of `markers` (the start and end) counting as
    all of them. The view's limits must be final (`ax.apply_aspect()`)."""
    def inside(data, corner):
        fractions = ax.transLimits.transform(data)
        near = np.abs(fractions - np.array(corner))  # distance from the corner along each axis
        return int(np.sum((near[:, 0] < _CORNER_BOX[0]) & (near[:, 1] < _CORNER_BOX[1])))

    weight = len(points) + 1
    crowd = {name: inside(points, corner) + weight * inside(markers, corner) for name, corner in _CORNERS.items()}
    return sorted(_CORNERS, key=lambda name: crowd[name])  # stable: ties keep the preferred order


def plot_trajectory(traj, path, *, every: int | None = None) -> None:
    """Write a plot (PNG, or JPEG/PDF/SVG by the suffix of `path`) atomically, showing `traj` (a camrender Trajectory).

    every: draw a frustum every this many frames (default: about 16 per path, plus the
    last frame). Frustum depth is a tenth of the path's extent (or 1 unit for a static camera).
    matplotlib's and numpy's warnings while drawing (a glyph the font lacks in a file name, a
    degenerate axis) stay here: the plot is drawn all the same.
    """
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        _save_atomic(draw(traj, every), path)


def draw(traj, every: int | None = None):
    """The plot of `traj` as a matplotlib Figure (Agg canvas); `plot_trajectory` writes it."""
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
    charts_grid = fig.add_gridspec(2, 2, left=0.06, right=0.9, top=0.37, bottom=0.06, hspace=0.45, wspace=0.18)
    top = fig.add_subplot(views_grid[0, 0])
    side = fig.add_subplot(views_grid[0, 1])
    speed_ax = fig.add_subplot(charts_grid[0, 0])
    turn_ax = fig.add_subplot(charts_grid[0, 1], sharex=speed_ax)  # its own chart: the lines never hide each other
    fov_ax = fig.add_subplot(charts_grid[1, :], sharex=speed_ax)
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
        # the frustums (already in the data limits) keep the view at least `depth` wide
        all_h, all_v = project(np.concatenate([positions, positions + c2w[:, :3, 2] * depth]))
        bar = _nice_length(max(np.ptp(all_h), np.ptp(all_v), depth))
        # the scale bar and the legend go to the corners the path, the frustums and the markers leave free
        ax.autoscale_view()
        ax.apply_aspect()
        along = np.linspace(0.0, 1.0, 5)[:, None, None]  # 5 points along each frustum line
        on_lines = (segments[:, 0] * (1 - along) + segments[:, 1] * along).reshape(-1, 3)
        drawn = np.concatenate([np.stack([h, v], axis=-1), np.stack(project(on_lines), axis=-1)])
        bar_corner, legend_corner = corners_by_room(ax, drawn, np.stack([h[[0, -1]], v[[0, -1]]], axis=-1))[:2]
        ax.legend(loc=legend_corner, fontsize=8)
        ax.add_artist(AnchoredSizeBar(ax.transData, bar, fmt_length(bar), bar_corner, pad=0.4,
                                      frameon=True, size_vertical=0, fontproperties={"size": 8}))
    fig.colorbar(points, cax=colour_ax, label="frame")

    if n > 1:
        mid = frames[:-1] + 0.5
        linear, turning = speeds(traj), angular_speeds(traj)
        speed_ax.plot(mid, linear, color="tab:blue", lw=1.2, label="speed")
        speed_ax.set_ylabel("units / s")
        speed_ax.set_ylim(0, _headroom(linear))
        turn_ax.plot(mid, turning, color="tab:orange", lw=1.2, label="rotation speed")
        turn_ax.set_ylabel("deg / s")
        turn_ax.set_ylim(0, _headroom(turning))
        speed_ax.set_title("speed between frames", fontsize=9)
        turn_ax.set_title("rotation speed between frames", fontsize=9)
    else:
        for ax in (speed_ax, turn_ax):
            ax.text(0.5, 0.5, "single frame: no motion", ha="center", va="center", transform=ax.transAxes)
        speed_ax.set_title("speed", fontsize=9)
        turn_ax.set_title("rotation speed", fontsize=9)
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
    length = float(np.sum(np.linalg.norm(np.diff(positions, axis=0), axis=1)))
    fig.suptitle(f"{name}: {n} frames, {(n - 1) / traj.fps:.2f} s at {traj.fps:g} fps, "
                 f"{traj.width}x{traj.height}, path length {fmt_length(length, 3)}")
    return fig


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
