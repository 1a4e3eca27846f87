"""Reading a camera path as the `traj` commands do (`load_path`: the action scheme and its speeds, `--intrinsics
FILE.npy`) and `--prompt-file` (the options themselves are declared once, `camrender.cli.options`).

    @scheme_options
    @intrinsics_option
    def command(..., **options):
        traj, scheme = load_path(source, options)   # pops the options it reads
"""
from __future__ import annotations

import os

import click

from camrender.cli.options import PATH, declare
from camrender.errors import CamrenderError
from camrender.render.inputs import image_size_of
from camrender.trajectory import controls
from camrender.trajectory.formats import read_path
from camrender.trajectory.formats.fileio import read_text

SCHEME_KEYS = tuple(name for name in PATH if name != "intrinsics")


def scheme_options(function):
    """--action-scheme, --translation-speed, --rotation-speed, --pitch-limit, --smooth/--no-smooth."""
    return declare(*SCHEME_KEYS)(function)


def intrinsics_option(function):
    return declare("intrinsics")(function)


def pop_scheme(options: dict) -> controls.ControlScheme:
    """The control scheme of the options (removed from `options`); CamrenderError for a bad value."""
    values = {key: options.pop(key, None) for key in SCHEME_KEYS}
    return controls.make_scheme(values.pop("action_scheme"), **values)


def load_path(source, options: dict, *, fmt=None, image=None, notes=None):
    """(Trajectory, ControlScheme or None): `source` read with the options' scheme and --intrinsics
    (both popped from `options`); `image` (a path) gives the size the intrinsics are in pixels of.
    The scheme is None unless `source` is an action string. Notes go to `notes` (else stderr)."""
    path_options = {key: options.pop(key, None) for key in (*SCHEME_KEYS, "intrinsics")}
    said = [] if notes is None else notes
    traj, scheme = read_path(source, fmt, image_size=None if image is None else image_size_of(image), notes=said,
                             **path_options)
    if notes is None:
        for note in said:
            click.echo(f"camrender: {note}", err=True)
    return traj, scheme


def read_prompt_option(options: dict) -> None:
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
