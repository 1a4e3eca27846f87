"""`NAME.eval.png`: the requested and the estimated path from above and from the side, and the per-frame errors.

Both paths are drawn as the metrics see them: relative to their first scored frame, the estimate aligned
onto the request (`metrics.pose_errors`), in the requested path's units, OpenCV world axes (up is -y) as in
`camrender traj plot`. Frames the estimator could not place are marked with crosses. matplotlib on Agg.
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from camrender.files import atomic_output

REQUESTED_COLOUR, ESTIMATED_COLOUR = "tab:blue", "tab:orange"


def plot_score(result, path, title: str = "") -> None:
    """Draw a scored `score.VideoScore` (its `errors` set) as a PNG at `path`, atomically."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        _draw(result, path, title)


def _draw(result, path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    errors, plan = result.errors, result.job.plan
    requested, estimated = errors.requested[:, :3, 3], errors.estimated[:, :3, 3]
    unplaced = ~errors.registered
    fig = Figure(figsize=(12, 8), dpi=100)
    FigureCanvasAgg(fig)
    views_grid = fig.add_gridspec(1, 2, left=0.06, right=0.97, top=0.9, bottom=0.45, wspace=0.2)
    charts_grid = fig.add_gridspec(2, 1, left=0.06, right=0.97, top=0.37, bottom=0.07, hspace=0.5)
    views = [
        (fig.add_subplot(views_grid[0, 0]), (0, 2, 1), "x (right)", "z (forward)", "from above (x-z)"),
        (fig.add_subplot(views_grid[0, 1]), (2, 1, -1), "z (forward)", "height = -y (up)", "from the side (z-y)"),
    ]
    for ax, (across, along, sign), xlabel, ylabel, name in views:
        ax.plot(requested[:, across], sign * requested[:, along], color=REQUESTED_COLOUR, lw=1.5, label="requested")
        ax.plot(estimated[:, across], sign * estimated[:, along], color=ESTIMATED_COLOUR, lw=1.2, ls="--",
                label="estimated (aligned)")
        ax.scatter(requested[:1, across], sign * requested[:1, along], s=60, facecolor="none", edgecolor="tab:green",
                   lw=2, zorder=3, label="first scored frame")
        if unplaced.any():
            ax.scatter(estimated[unplaced, across], sign * estimated[unplaced, along], marker="x", color="tab:red",
                       zorder=3, label="not placed (nearest pose)")
        ax.set_aspect("equal", adjustable="datalim")
        ax.margins(0.1)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=name)
        ax.grid(True, lw=0.3)
        ax.legend(loc="best", fontsize=8)
    frames = plan.path_indices
    for row, (values, label, unit) in enumerate(((errors.rotation_deg, "rotation error", "degrees"),
                                                 (errors.translation, "translation error", "path units"))):
        ax = fig.add_subplot(charts_grid[row, 0])
        ax.plot(frames, values, color="tab:purple", lw=1.2)
        if unplaced.any():
            ax.scatter(frames[unplaced], values[unplaced], marker="x", color="tab:red", zorder=3)
        ax.set_ylim(0, max(float(np.max(values)) * 1.15, 1e-6))
        ax.set_ylabel(unit)
        ax.set_title(f"{label} per scored frame (mean {float(np.mean(values)):.4g})", fontsize=9)
        ax.grid(True, lw=0.3)
    ax.set_xlabel(f"path frame (every {plan.interval}{', frame 0 skipped' if plan.skip_first_frame else ''})")
    fig.suptitle(title or os.path.basename(result.job.video.path), fontsize=10)
    with atomic_output(path, "wb") as out:
        fig.savefig(out, format="png")
