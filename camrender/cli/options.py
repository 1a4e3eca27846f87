"""The options the commands share, declared once: what a pipeline is loaded with (`LOAD`, the fields of
`camrender.render.load_settings.LoadSettings`), what one render asks for (`RENDER`, `plan_request`'s options) and
how a run shows itself (`RUN`). Their words, defaults and help come from `camrender.vocabulary`.

    @declare(*LOAD, *RENDER)
    def command(**options):
        load, render, rest = split_options(options)

`option_table()` writes the README's option table from the `render` command (a test keeps them equal).
"""
from __future__ import annotations

from pathlib import Path

import click

from camrender import vocabulary as words
from camrender.model.refiner.loading import check_refiner_offload
from camrender.errors import CamrenderError
from camrender.model.stage1.recipes import guidance_words, per_recipe, recent_words, steps_words
from camrender.render.resume import DEFAULT_CHECKPOINT_EVERY
from camrender.trajectory import controls


def _choice(vocabulary: words.Words, **extra):
    return click.option(vocabulary.option, default=vocabulary.default, show_default=vocabulary.default is not None,
                        type=click.Choice(vocabulary.values), help=vocabulary.describe(), **extra)


def _offload_value(context, parameter, value):
    if value is None:
        return None
    try:
        return check_refiner_offload(value)
    except CamrenderError as error:
        raise click.BadParameter(error.detail) from None


_PATH = click.Path(path_type=Path)
_FILE = click.Path(dir_okay=False, path_type=Path)

OPTIONS = {
    # ---------------------------------------------------------------- load: LoadSettings
    "model": click.option("--model", default=words.DEFAULT_MODEL, show_default=True,
                          help="Hub id, local diffusers folder, or 'tiny' (offline random-weight model: frames are "
                               "noise)."),
    "transformer_weights": click.option("--transformer-weights", default=None, type=_PATH,
                                        help="Original-format DiT weights (.safetensors or .pt) loaded over the "
                                             "transformer."),
    "vae": click.option("--vae", default=None, type=_PATH,
                        help="Diffusers VAE folder replacing the pipeline's, e.g. SANA-WM_streaming/ltx2_causal_vae."),
    "recipe": click.option(words.RECIPE.option, default=None,  # checked by the recipes (one line naming them all)
                           help=f"{words.RECIPE.help[:-1]}: {', '.join(words.RECIPE.values)})."),
    "allow_missing_weights": click.option("--allow-missing-weights", is_flag=True,
                                          help="Render even when --transformer-weights leaves transformer weights "
                                               "unloaded."),
    "kernels": _choice(words.KERNELS),
    "dtype": _choice(words.DTYPE),
    "device": click.option("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)."),
    "offload": click.option("--offload", is_flag=True,
                            help="Model CPU offload: components visit the GPU only while they run (needs accelerate)."),
    "cuda_graphs": click.option("--cuda-graphs/--no-cuda-graphs", default=True, show_default=True,
                                help="Replay stage 1's denoising passes as CUDA graphs (CUDA only, not with "
                                     "--offload): same output, less launch overhead."),
    "refiner": click.option("--refiner", default=words.NO_REFINER, show_default=True,
                            help="Stage 2: the SANA-WM refiner (a folder such as SANA-WM_streaming/refiner_diffusers, "
                                 "a hub id, 'tiny' with --model tiny, or 'none')."),
    "refiner_offload": click.option(words.REFINER_OFFLOAD.option, default=None, callback=_offload_value,
                                    metavar="none|layers|N", show_default=words.REFINER_OFFLOAD.default,
                                    help=words.REFINER_OFFLOAD.describe()),
    "precision": _choice(words.PRECISION),
    "stage1_precision": _choice(words.STAGE1_PRECISION),
    "refiner_precision": _choice(words.REFINER_PRECISION),
    "refiner_window": click.option("--refiner-window", default=None, type=click.IntRange(1, words.MAX_REFINER_WINDOW),
                                   show_default=str(words.REFINER_WINDOW), help=words.REFINER_WINDOW_HELP),
    # ---------------------------------------------------------------- render: plan_request
    "preset": _choice(words.PRESET),
    "prompt": click.option("--prompt", default=None, help="Text prompt (default: the trajectory's, else empty)."),
    "prompt_file": click.option("--prompt-file", default=None, type=_FILE,
                                help="UTF-8 text file holding the prompt (stripped; as the official --prompt FILE)."),
    "negative_prompt": click.option("--negative-prompt", default=None,
                                    help="Negative prompt, used with guidance (default: the trajectory's, else empty)."),
    "image": click.option("--image", default=None, type=_PATH, help="First-frame image (default: the trajectory's)."),
    "intrinsics": click.option("--intrinsics", default=None, type=_FILE,
                               help="Intrinsics .npy ((3,3), (F,3,3), (4,) or (F,4) fx fy cx cy in pixels of the "
                                    "first-frame image) replacing the path's (default for NAME_pose.npy: "
                                    "NAME_intrinsics.npy beside it)."),
    "action_scheme": click.option("--action-scheme", default=None, type=click.Choice(controls.SCHEME_NAMES),
                                  help="What the keys of an action string do: sana-wm (NVlabs' current scheme: a/d "
                                       "yaw, j/l strafe, smoothed; the default) or diffusers (the older one: a/d "
                                       "strafe, j/l yaw)."),
    "translation_speed": click.option("--translation-speed", default=None, type=float,
                                      help="Action strings: units per frame (default: sana-wm 0.025, diffusers 0.05)."),
    "rotation_speed": click.option("--rotation-speed", default=None, type=float,
                                   help="Action strings: degrees per frame (default: sana-wm 0.6, diffusers 1.2)."),
    "pitch_limit": click.option("--pitch-limit", default=None, type=float,
                                help="Action strings: pitch limit in degrees (default: sana-wm 60, diffusers 85)."),
    "smooth": click.option("--smooth/--no-smooth", default=None,
                           help="Action strings: the velocity model (ease in, coast out; default: on for sana-wm, "
                                "off for diffusers)."),
    "frames": click.option("--frames", default=None, type=click.IntRange(min=1),
                           help=f"Video frames, the recipe's "
                                f"{per_recipe(lambda recipe: f'{recipe.frame_stride}k+1')} (default: the path "
                                "re-timed to the nearest; see README)."),
    "mode": click.option(words.MODE.option, default=None, type=click.Choice(words.MODE.values),
                         help=f"{words.MODE.describe()} Default: the recipe's: "
                              f"{per_recipe(lambda recipe: recipe.mode)}."),
    "steps": click.option("--steps", default=None, type=click.IntRange(min=1),
                          help=f"Denoising steps (default: the recipe's: {per_recipe(steps_words)}; tiny full "
                               "mode: 10)."),
    "guidance": click.option("--guidance", default=None, type=float,
                             help=f"Classifier-free guidance, <= 1: off (default: the recipe's: "
                                  f"{per_recipe(guidance_words)})."),
    "flow_shift": click.option("--flow-shift", default=None, type=float,
                               help="Full mode's flow-match scheduler shift (the official --flow_shift; default: the "
                                    "recipe's)."),
    "seed": click.option("--seed", default=None, type=int, help="Noise seed (default: the trajectory's, else 0)."),
    "fps": click.option("--fps", default=None, type=float, help="Output frame rate (default: the trajectory's)."),
    "height": click.option("--height", default=None, type=click.IntRange(min=1),
                           help=f"Video height (default {words.RELEASE_SIZE[0]}; tiny: {words.TINY_SIZE[0]})."),
    "width": click.option("--width", default=None, type=click.IntRange(min=1),
                          help=f"Video width (default {words.RELEASE_SIZE[1]}; tiny: {words.TINY_SIZE[1]})."),
    "segment_frames": click.option("--segment-frames", default=None, type=click.IntRange(min=1),
                                   help="Latent frames per segment after the first (segment mode; default: the "
                                        f"recipe's: {per_recipe(lambda recipe: str(recipe.chunk_frames))})."),
    "cached_segments": click.option("--cached-segments", default=None, type=click.IntRange(min=0),
                                    help="Recent segments besides the first the softmax blocks attend to (segment "
                                         f"mode; default: the recipe's: {per_recipe(recent_words)})."),
    "prompt_cache": click.option("--prompt-cache", default=None,
                                 help="Folder of encoded prompts (default: $CAMRENDER_CACHE, else the user cache "
                                      "folder: $XDG_CACHE_HOME/camrender or ~/.cache/camrender); 'off' encodes every "
                                      "time and stores nothing."),
    "noise_frames": click.option("--noise-frames", default=None, type=click.IntRange(min=1), hidden=True,
                                 help="Latent frames of the noise draw, the clip keeping the first (a live flight's "
                                      "render file)."),
    # ---------------------------------------------------------------- run: how the command writes and shows itself
    "resume": click.option("--resume", is_flag=True,
                           help="Segment mode: continue an interrupted render of the same command from its "
                                "checkpoint."),
    "checkpoint_every": click.option("--checkpoint-every", default=DEFAULT_CHECKPOINT_EVERY, show_default=True,
                                     type=float, help="Segment mode: seconds between checkpoints (0: every "
                                                      "segment; inf: none)."),
    # ---------------------------------------------------------------- Ray: the workers of --executor ray
    "address": click.option("--address", default=None,
                            help="Ray: the cluster to join (auto: the one `ray start` made here, or RAY_ADDRESS; or "
                                 "HOST:PORT). Default: a Ray instance on this machine for this command, listening on "
                                 "127.0.0.1 only."),
    "workers": click.option("--workers", default=None, type=click.IntRange(min=1),
                            help="Ray: at most N workers (default: one per GPU of the cluster; per CPU for CPU "
                                 "renders)."),
    "retries": click.option("--retries", default=2, show_default=True, type=click.IntRange(min=0),
                            help="Ray: times a job whose worker was lost (killed, out of memory, its node gone) "
                                 "renders again, segment mode from its checkpoint."),
    "progress": _choice(words.PROGRESS),
    "quiet": click.option("--quiet", "-q", is_flag=True,
                          help="Only warnings and errors: no progress, no loading or done lines."),
}

LOAD = ("model", "transformer_weights", "vae", "recipe", "allow_missing_weights", "kernels", "dtype", "device",
        "offload", "cuda_graphs", "refiner", "refiner_offload", "precision", "stage1_precision", "refiner_precision",
        "refiner_window")
PATH = ("intrinsics", "action_scheme", "translation_speed", "rotation_speed", "pitch_limit", "smooth")
RENDER = ("preset", "prompt", "negative_prompt", "image", *PATH, "frames", "mode", "steps", "guidance",
          "flow_shift", "seed", "fps", "height", "width", "segment_frames", "cached_segments", "prompt_cache",
          "noise_frames")
RUN = ("progress", "quiet")
RAY = ("address", "workers", "retries")


def refuse_ray_options(executor: str) -> None:
    """The Ray options (`RAY`) given to the running command without `--executor ray`: CamrenderError naming the
    first."""
    context = click.get_current_context()
    for name in RAY:
        if executor != "ray" and context.get_parameter_source(name) != click.core.ParameterSource.DEFAULT:
            raise CamrenderError(f"{spelling(name)} is for the Ray executor: add --executor ray", field=name)


def overwrite_option(default: bool, help_text: str):
    """--overwrite/--no-overwrite: whether a command replaces a video that exists (each command says its default)."""
    return click.option("--overwrite/--no-overwrite", default=default, show_default=True, help=help_text)


def declare(*names):
    """A decorator adding the options `names` to a click command, listed by --help in that order."""
    def add(command):
        for name in reversed(names):
            command = OPTIONS[name](command)
        return command
    return add


def split_options(options: dict) -> tuple:
    """(load, render, rest): `options` (a command's parsed values) as `LoadSettings.create`'s keywords, then
    `plan_request`'s, then the command's own (--prompt-file is read into the prompt first: `read_prompt`)."""
    load = {name: options[name] for name in LOAD if name in options}
    render = {name: options[name] for name in RENDER if name in options}
    rest = {name: value for name, value in options.items() if name not in load and name not in render}
    return load, render, rest


def spelling(name: str) -> str:
    """An option's name as typed: refiner_window -> --refiner-window."""
    return "--" + name.replace("_", "-")


def option_table(command: click.Command) -> str:
    """The markdown table of `command`'s visible options (names, default, help), as the README shows it."""
    rows = ["| option | default | |", "|---|---|---|"]
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        names = " / ".join(f"`{name}`" for name in [*param.opts, *param.secondary_opts])
        text = (param.help or "").replace("|", "\\|")
        rows.append(f"| {names} | {_default_words(param)} | {text} |")
    return "\n".join(rows)


def _default_words(param: click.Option) -> str:
    """An option's default as the table shows it: `value`, on / off for a switch, "required", or nothing."""
    if isinstance(param.show_default, str):
        return f"`{param.show_default}`"
    if param.required:
        return "required"
    if param.is_flag and param.secondary_opts and param.default is not None:
        return "on" if param.default else "off"
    if param.is_flag or param.default is None or not isinstance(param.default, (str, int, float)):
        return ""
    return f"`{param.default}`"
