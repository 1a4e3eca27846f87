"""`camrender traj plot|preview|concat|retime`: see and reshape a path before rendering it.

No torch or model import: these commands run in seconds on a laptop.
"""
from __future__ import annotations

import time

import click

from camrender.cli import path_options
from camrender.cli.progress import LINE_INTERVAL_S, StageProgress, count, resolve_style
from camrender.errors import CamrenderError
from camrender.files import VIDEO_SUFFIXES, check_output_path, check_suffix
from camrender.trajectory import load
from camrender.trajectory.edit import concat, retime
from camrender.trajectory.formats import export_file
from camrender.views.plot import plot_format, plot_trajectory
from camrender.views.preview import preview_size, write_preview
from camrender.views.proxy_scene import ProxyScene


def _load(path, options=None):
    """The path of FILE; `options` (popped): the action scheme options and --intrinsics."""
    return load(path) if options is None else path_options.load_path(path, options)[0]


@click.command("plot")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(), help="Plot to write (.png, .jpg, .pdf or .svg).")
@click.option("--every", type=click.IntRange(min=1), default=None,
              help="Draw a view frustum every N frames (default: about 16 per path).")
@path_options.intrinsics_option
@path_options.scheme_options
def plot_command(file, out, every, **options):
    """Top and side views of the path with frustums, plus speed and field-of-view charts (PNG)."""
    plot_format(out)
    check_output_path(out)
    traj = _load(file, options)
    plot_trajectory(traj, out, every=every)
    click.echo(f"wrote {out}: {count(traj.num_frames, 'frame')}")


@click.command("preview")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(), help="mp4 to write.")
@click.option("--overlay", is_flag=True, help="Stamp frame number, position, yaw/pitch/roll and fov on each frame.")
@click.option("--width", type=click.IntRange(min=2), default=None,
              help="Output width in pixels (intrinsics scale with it; default: the trajectory's).")
@click.option("--height", type=click.IntRange(min=2), default=None,
              help="Output height in pixels (the missing side keeps the aspect ratio).")
@click.option("--scene-scale", type=float, default=1.0, show_default=True,
              help="Scale of the proxy scene in the trajectory's world units (1: ground 1.5 units below the first camera).")
@click.option("--absolute", is_flag=True,
              help="Use the poses as given instead of relative to frame 0 (the model's view).")
@path_options.intrinsics_option
@path_options.scheme_options
def preview_command(file, out, overlay, width, height, scene_scale, absolute, **options):
    """Render the path through a synthetic scene (ground grid, landmarks, horizon) on CPU.

    \b
    Frame 0 stands at the origin looking along +z (unless --absolute); up is -y.
    Ground 1.5 units below; red sphere ahead (+z), magenta right (+x), cyan left
    (-x), orange box behind (-z); a dark post 2 units ahead. See docs/preview.md.
    """
    check_suffix(out, VIDEO_SUFFIXES, "the preview video")
    check_output_path(out)
    traj = _load(file, options)
    preview_size(traj, width, height)  # size limits before any frame is drawn (or the progress bar shows)
    ProxyScene(scene_scale)  # its scale, likewise
    start = time.perf_counter()
    # a bar on a terminal; else a line every 5 s once it has taken 5 s (a quick preview only says it is written)
    progress = StageProgress(resolve_style("auto"), "frame", delay=LINE_INTERVAL_S)
    try:
        w, h = write_preview(traj, out, width=width, height=height, overlay=overlay, scene_scale=scene_scale,
                             relative=not absolute, progress=lambda done, total: progress(done, total, stage="preview"))
    finally:
        progress.close()
    seconds = time.perf_counter() - start
    click.echo(f"wrote {out}: {count(traj.num_frames, 'frame')} {w}x{h} at {traj.fps:g} fps "
               f"in {seconds:.1f} s ({traj.num_frames / max(seconds, 1e-9):.1f} frames/s)")


@click.command("concat")
@click.argument("first", type=click.Path(dir_okay=False))
@click.argument("second", type=click.Path(dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(), help="Trajectory file to write (format by suffix).")
@path_options.intrinsics_option
@path_options.scheme_options
def concat_command(first, second, out, **options):
    """Continue SECOND from the end pose of FIRST.

    SECOND is moved rigidly so that its first pose equals FIRST's last pose; that shared
    frame appears once, so the result has F1 + F2 - 1 frames.
    """
    result = concat(_load(first, dict(options)), _load(second, dict(options)))  # each reads the same options
    written = export_file(result, out)
    click.echo(f"wrote {' and '.join(written)}: {count(result.num_frames, 'frame')}, {result.duration:.3f} s at "
               f"{result.fps:g} fps")


@click.command("retime")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--fps", type=float, default=None, help="New frame rate; the duration stays unless --seconds is given.")
@click.option("--seconds", type=float, default=None, help="New duration; the frame rate stays unless --fps is given.")
@click.option("--interp", type=click.Choice(["spline", "linear"]), default="spline", show_default=True,
              help="Position interpolation between frames (rotations: slerp; focal length: in tan(fov/2)).")
@click.option("-o", "--out", required=True, type=click.Path(), help="Trajectory file to write (format by suffix).")
@path_options.intrinsics_option
@path_options.scheme_options
def retime_command(file, fps, seconds, interp, out, **options):
    """Resample the path in time: same start, end and shape, new frame rate and/or duration."""
    if fps is None and seconds is None:
        raise CamrenderError("give --fps and/or --seconds", field="retime")
    traj = _load(file, options)
    result = retime(traj, fps=fps, seconds=seconds, position=interp)
    written = export_file(result, out)
    click.echo(f"wrote {' and '.join(written)}: {count(result.num_frames, 'frame')}, {result.duration:.3f} s at "
               f"{result.fps:g} fps")


COMMANDS = [plot_command, preview_command, concat_command, retime_command]
