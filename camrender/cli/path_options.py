"""Options about reading a camera path, shared by `render` (and so batch jobs) and `traj check` /
`convert`: the action scheme and its speeds, `--intrinsics FILE.npy`, `--prompt-file`.

    @scheme_options
    @intrinsics_option
    def command(..., **options):
        traj, scheme = load_path(source, options)   # pops the options it reads
"""
from __future__ import annotations

import os

import click

from camrender.errors import CamrenderError
from camrender.trajectory import controls
from camrender.trajectory.formats import actions, detect, get, import_file, looks_like_actions
from camrender.trajectory.formats.fileio import read_text

SCHEME_KEYS = ("action_scheme", "translation_speed", "rotation_speed", "pitch_limit", "smooth")


def scheme_options(function):
    """--action-scheme, --translation-speed, --rotation-speed, --pitch-limit, --smooth/--no-smooth."""
    for decorator in reversed([
        click.option("--action-scheme", default=None, type=click.Choice(controls.SCHEME_NAMES),
                     help="What the keys of an action string do: sana-wm (NVlabs' current scheme: a/d yaw, j/l "
                          "strafe, smoothed; the default) or diffusers (the older one: a/d strafe, j/l yaw)."),
        click.option("--translation-speed", default=None, type=float,
                     help="Action strings: units per frame (default: sana-wm 0.025, diffusers 0.05)."),
        click.option("--rotation-speed", default=None, type=float,
                     help="Action strings: degrees per frame (default: sana-wm 0.6, diffusers 1.2)."),
        click.option("--pitch-limit", default=None, type=float,
                     help="Action strings: pitch limit in degrees (default: sana-wm 60, diffusers 85)."),
        click.option("--smooth/--no-smooth", default=None,
                     help="Action strings: the velocity model (ease in, coast out; default: on for sana-wm, "
                          "off for diffusers)."),
    ]):
        function = decorator(function)
    return function


def intrinsics_option(function):
    return click.option(
        "--intrinsics", default=None, type=click.Path(dir_okay=False),
        help="Intrinsics .npy ((3,3), (F,3,3), (4,) or (F,4) fx fy cx cy in pixels of the first-frame image) "
             "replacing the path's (default for NAME_pose.npy: NAME_intrinsics.npy beside it).")(function)


def prompt_file_option(function):
    return click.option("--prompt-file", default=None, type=click.Path(dir_okay=False),
                        help="UTF-8 text file holding the prompt (as the official --prompt FILE).")(function)


def render_options(function):
    """`render`'s: --prompt-file, --intrinsics and the action scheme options."""
    return prompt_file_option(intrinsics_option(scheme_options(function)))


def pop_scheme(options: dict) -> controls.ControlScheme:
    """The control scheme of the options (removed from `options`); CamrenderError for a bad value."""
    values = {key: options.pop(key, None) for key in SCHEME_KEYS}
    return controls.make_scheme(values.pop("action_scheme"), **values)


def reads_actions(source, fmt=None) -> bool:
    """Whether `source` (with `--from fmt`) is read as an action string."""
    if fmt:
        return get(fmt) is actions
    if not os.path.exists(source):
        return looks_like_actions(source)
    return os.path.isfile(source) and detect(source) is actions


def load_path(source, options: dict, *, fmt=None, image=None, notes=None):
    """(Trajectory, ControlScheme or None): `source` read with the options' scheme and --intrinsics
    (both popped from `options`); `image` (a path) gives the size the intrinsics are in pixels of.
    The scheme is None unless `source` is an action string. Notes go to `notes` (else stderr)."""
    scheme = pop_scheme(options)
    intrinsics = options.pop("intrinsics", None)
    image_size = None if image is None else image_size_of(image)
    said = [] if notes is None else notes
    traj = import_file(source, fmt, scheme=scheme, intrinsics=intrinsics, image_size=image_size, notes=said)
    if notes is None:
        for note in said:
            click.echo(f"camrender: {note}", err=True)
    return traj, (scheme if reads_actions(source, fmt) else None)


def image_size_of(path) -> tuple:
    """(width, height) of an image file (its header only); CamrenderError naming it otherwise."""
    # lazy: keeps `camrender --help` free of PIL
    import PIL.Image

    if not os.path.isfile(path):
        raise CamrenderError("first-frame image not found" if not os.path.exists(path) else "is not a file",
                             path=os.fspath(path), field="image")
    try:
        with PIL.Image.open(path) as handle:
            return handle.size
    except (OSError, ValueError, PIL.Image.DecompressionBombError) as error:
        raise CamrenderError(f"cannot read the image ({error})", path=os.fspath(path), field="image") from None


def resolve_path(options: dict, notes=None):
    """`render`'s path: (loaded Trajectory, the scheme record or None); --from-render's when it gave one."""
    loaded = options.pop("_trajectory", None)
    recorded = options.pop("_controls", None)
    if loaded is not None:
        for key in (*SCHEME_KEYS, "intrinsics"):
            options.pop(key, None)
        return loaded, recorded
    traj, scheme = load_path(options["traj"], options, image=options.get("image"), notes=notes)
    return traj, None if scheme is None else scheme.to_dict()


def resolve_prompt(options: dict) -> None:
    """--prompt-file FILE into options["prompt"] (UTF-8, stripped); an empty or unreadable file, or
    both --prompt and --prompt-file, is a CamrenderError."""
    path = options.pop("prompt_file", None)
    if path is None:
        return
    if options.get("prompt") is not None:
        raise CamrenderError("give --prompt or --prompt-file, not both", field="prompt-file")
    options["prompt"] = read_prompt_file(path)


MAX_PROMPT_FILE_BYTES = 1 << 20  # prompts are cut to 300 tokens (`camrender.render.request.MAX_SEQUENCE_LENGTH`)


def read_prompt_file(path) -> str:
    text = read_text(path, MAX_PROMPT_FILE_BYTES, "a prompt file").strip()
    if not text:
        raise CamrenderError("the prompt file is empty", path=os.fspath(path), field="prompt-file")
    return text
