"""`camrender traj ...`: author, check and convert trajectory files (no model import)."""
import os

import click

from camrender.cli import path_options
from camrender.cli import traj_view as cli_traj_view
from camrender.cli.progress import count
from camrender.errors import CamrenderError
from camrender.files import atomic_write_text
from camrender.limits import MAX_IMAGE_SIDE
from camrender.trajectory import is_model_length, nearest_model_length, presets, v1
from camrender.trajectory.crop import crop_intrinsics
from camrender.trajectory.formats import export_file, get, help_text
from camrender.trajectory.formats.fileio import dump_json
from camrender.trajectory.stats import compute, fmt_length, fmt_number


@click.group()
def traj():
    """Create, check, convert and preview trajectory files."""


def _preset_help() -> str:
    lines = ["\b", "Presets and their parameters (world = first camera: +x right, +y down, +z forward):"]
    for name, summary, params in presets.describe():
        lines.append(f"  {name}: {summary}")
        for key, (default, text) in params.items():
            lines.append(f"      --{key.replace('_', '-')} (default {default:g}): {text}")
    return "\n".join(lines)


# every preset's own parameters, each once (the common ones have options of their own below)
_PRESET_PARAMS = tuple(dict.fromkeys(key for _, params in presets.PRESETS.values() for key in params))


def _new_options(function):
    for key in reversed(_PRESET_PARAMS):
        function = click.option(f"--{key.replace('_', '-')}", key, type=float, default=None,
                                help="Preset parameter (see the list below).")(function)
    return function


@traj.command("new", epilog=_preset_help())
@click.argument("preset")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
              help="Trajectory file to write: .json keeps the keyframes; another format's suffix "
                   "(.txt: RealEstate10K, ...) writes the per-frame path in it.")
@click.option("--frames", "num_frames", type=int, default=None, help="Video frames (default 161; the model needs 8k+1).")
@click.option("--fps", type=float, default=None, help="Frames per second (default 16).")
@click.option("--width", type=int, default=None, help="Image width in pixels (default 1280).")
@click.option("--height", type=int, default=None, help="Image height in pixels (default 704).")
@click.option("--fov", type=float, default=None, help="Horizontal field of view at the start, degrees (default 60).")
@_new_options
@click.option("--prompt", default=None, help="Text prompt stored in the file.")
@click.option("--negative-prompt", default=None, help="Negative prompt stored in the file.")
@click.option("--image", type=click.Path(dir_okay=False), default=None, help="First-frame image (stored relative to the file).")
@click.option("--seed", type=int, default=None, help="Seed stored in the file.")
@click.option("--expand", is_flag=True, help="Write one entry per frame instead of keyframes.")
def new_command(preset, out, num_frames, fps, width, height, fov, prompt, negative_prompt, image, seed, expand, **params):
    """Write the keyframes of a named camera move PRESET to a v1 file."""
    given = {"num_frames": num_frames, "fps": fps, "width": width, "height": height, "fov": fov, **params}
    given = {k: v for k, v in given.items() if v is not None}
    if preset not in presets.PRESETS:
        raise CamrenderError(f"unknown preset {preset!r} (known: {', '.join(presets.PRESETS)})", field="PRESET")
    for key in params:
        if params[key] is not None and key not in presets.PRESETS[preset][1]:
            takes = ", ".join(f"--{k.replace('_', '-')}" for k in presets.PRESETS[preset][1]) or "no parameters"
            raise CamrenderError(f"preset {preset} does not take --{key.replace('_', '-')} (it takes {takes})",
                                 field=key)
    doc = presets.make(preset, **given)
    if prompt is not None:
        doc["prompt"] = prompt
    if negative_prompt is not None:
        doc["negative_prompt"] = negative_prompt
    if image is not None:
        doc["image"] = os.path.relpath(os.path.abspath(image), os.path.dirname(os.path.abspath(out)))
    if seed is not None:
        doc["seed"] = seed
    trajectory = v1.parse_document(doc, path=out)  # validates, and checks that the image exists
    if os.path.splitext(out)[1].lower() != ".json":
        export_file(trajectory, out)  # the format its suffix names (an unknown suffix is an error)
    else:
        if expand:
            doc = v1.to_document(trajectory, out)
        atomic_write_text(out, dump_json(doc))
    note = ""
    if not is_model_length(trajectory.num_frames):
        note = f" (not 8k+1: renders re-time it to {nearest_model_length(trajectory.num_frames)} frames)"
    click.echo(f"wrote {out}: {preset}, {count(trajectory.num_frames, 'frame')} at {trajectory.fps:g} fps{note}")


@traj.command("check")
@click.argument("file")
@click.option("--from", "fmt", default=None, help=f"Input format: {help_text()} (default: from the suffix/content).")
@path_options.intrinsics_option
@click.option("--image", default=None, type=click.Path(dir_okay=False),
              help="First-frame image: the size a .npy's intrinsics are in pixels of.")
@path_options.scheme_options
def check_command(file, fmt, image, **options):
    """Validate FILE and print frames, duration, path length, fov range and the largest step per frame."""
    trajectory, scheme = path_options.load_path(file, options, fmt=fmt, image=image)
    s = compute(trajectory)
    model = "yes" if is_model_length(s.num_frames) else f"no: renders resample to {nearest_model_length(s.num_frames)}"
    lines = [
        f"file:         {file}",
        f"frames:       {s.num_frames} at {s.fps:g} fps (8k+1 for the model: {model})",
        f"duration:     {s.duration:.3f} s",
        f"image size:   {trajectory.width} x {trajectory.height}",
        f"path length:  {fmt_length(s.path_length)}",
        f"fov range:    horizontal {s.fov_h[0]:.2f}-{s.fov_h[1]:.2f} deg, vertical {s.fov_v[0]:.2f}-{s.fov_v[1]:.2f} deg",
        f"max step:     {fmt_number(s.max_move)} units/frame (frame {s.max_move_frame}), "
        f"{s.max_turn:.3f} deg/frame (frame {s.max_turn_frame})",
    ]
    if scheme is not None:
        lines.append(f"action scheme: {scheme.name}, {scheme.translation_speed:g} units and {scheme.rotation_speed:g} "
                     f"deg per frame, pitch within +-{scheme.pitch_limit:g} deg, smoothing {'on' if scheme.smooth else 'off'}")
    for label, value in (("prompt", trajectory.prompt), ("image", trajectory.image), ("seed", trajectory.seed)):
        if value is not None:
            lines.append(f"{label + ':':<13} {value}")
    click.echo("\n".join(lines))


@traj.command("convert")
@click.argument("source")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="File to write.")
@click.option("--from", "from_fmt", default=None,
              help=f"Input format: {help_text()} (default: from the suffix/content).")
@click.option("--to", "to_fmt", default=None,
              help=f"Output format: {help_text(exportable=True)} (default: from the output suffix).")
@path_options.intrinsics_option
@click.option("--image", default=None, type=click.Path(dir_okay=False),
              help="First-frame image: the intrinsics are mapped through its resize-to-cover and centre crop to "
                   "--width x --height, as a render maps them (and the file names the image).")
@click.option("--width", type=click.IntRange(min=1, max=MAX_IMAGE_SIDE), default=1280, show_default=True,
              help="Render width (with --image).")
@click.option("--height", type=click.IntRange(min=1, max=MAX_IMAGE_SIDE), default=704, show_default=True,
              help="Render height (with --image).")
@path_options.scheme_options
def convert_command(source, out, from_fmt, to_fmt, image, width, height, **options):
    """Convert SOURCE to another format (with --from actions, SOURCE may be the action string itself).

    \b
    camrender traj convert demo_0_pose.npy --image demo_0.png -o demo_0.json   # OpenCV c2w, render-size intrinsics
    camrender traj convert path.json -o path_pose.npy                          # + path_intrinsics.npy beside it
    """
    if to_fmt is not None:
        get(to_fmt)
    trajectory, _ = path_options.load_path(source, options, fmt=from_fmt, image=image)
    if image is not None:
        intrinsics = crop_intrinsics(trajectory.intrinsics, (trajectory.width, trajectory.height), (width, height))
        trajectory = trajectory.replace(intrinsics=intrinsics, width=width, height=height,
                                        image=os.path.abspath(image)).validate()
    written = export_file(trajectory, out, to_fmt)
    click.echo(f"wrote {' and '.join(written)}: {count(trajectory.num_frames, 'frame')}")


for _command in cli_traj_view.COMMANDS:
    traj.add_command(_command)
