"""From a camera path and a render's options to a `RenderRequest`: every check and default of one render, in one
place, for the Python API and the CLI alike (`plan_request`), and what is checked of its output before the
model loads (`prepare_output`).

Nothing here loads a model: a request is checked against its pipeline's `LoadSettings` and the configs on disk.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Optional

from camrender import trajectory as trajectories
from camrender import vocabulary as words
from camrender.errors import CamrenderError
from camrender.files import VIDEO_SUFFIXES, check_output_path, check_suffix, probe_writable
from camrender.limits import (MAX_STEPS, TIME_STRIDE, check_finite, check_fps, check_frames, check_latent_frames,
                              check_seed, check_size)
from camrender.render.load_settings import FIELDS as LOAD_FIELDS
from camrender.render.load_settings import LoadSettings, unknown_keyword
from camrender.model.stage1.recipes import get_recipe
from camrender.parallel.cfg import check_split, head_split_size
from camrender.render.inputs import image_size_of, open_image
from camrender.render.prompt_cache import OFF as NO_CACHE
from camrender.render.request import RenderRequest
from camrender.output.resume_check import check_resume
from camrender.output.targets import OutputClaim, check_output_names, claim_output
from camrender.render.resume import DEFAULT_CHECKPOINT_EVERY
from camrender.trajectory.formats import read_path
from camrender.trajectory.resample import frames_note, to_model_frames

# full mode's defaults where a recipe has none: the default recipe's (the recipe table is their one source)
RELEASE_GUIDANCE = get_recipe(words.DEFAULT_RECIPE).guidance
RELEASE_STEPS = get_recipe(words.DEFAULT_RECIPE).steps
TINY_STEPS = 10  # full mode with the tiny model (its frames are noise anyway)
PATH_OPTIONS = ("action_scheme", "translation_speed", "rotation_speed", "pitch_limit", "smooth", "intrinsics")
RENDER_OPTIONS = ("preset", "image", "prompt", "negative_prompt", "frames", "mode", "steps", "guidance", "seed", "fps",
                  "height", "width", "segment_frames", "cached_segments", "prompt_cache", "out", "noise_frames",
                  "flow_shift", "controls", *PATH_OPTIONS)


def default_steps(steps: Optional[int], mode: str, model: str, recipe):
    """`steps`, else the recipe's: the streaming recipe's timestep list (None), 60 steps otherwise
    (full mode with the tiny model: 10)."""
    if steps is not None:
        return steps
    if mode == "full":
        return TINY_STEPS if model == words.TINY else (recipe.steps or RELEASE_STEPS)
    return recipe.steps if recipe.mode == "segments" else None


def default_guidance(guidance: Optional[float], mode: str, recipe):
    """`guidance`, else the recipe's (bidirectional and chunk-causal 5, streaming off); the
    bidirectional checkpoint forced into segment mode samples without guidance."""
    if guidance is not None:
        return guidance
    if mode != recipe.mode:
        return None if mode == "segments" else RELEASE_GUIDANCE
    return recipe.guidance if recipe.guidance > 1 else None


def default_size(height: Optional[int], width: Optional[int], model: str) -> tuple:
    """(height, width) in pixels: the given ones, else the release size (the tiny model's: 64 x 112)."""
    default_h, default_w = words.TINY_SIZE if model == words.TINY else words.RELEASE_SIZE
    return height or default_h, width or default_w


def check_options(options: dict) -> None:
    """A keyword of a render that is not one: a load setting is refused (it was decided when the pipeline
    loaded), a mistyped one names the closest valid one."""
    for name in options:
        if name in LOAD_FIELDS or name == "precision":
            raise CamrenderError("decided when the pipeline loads; pass it to CamrenderPipeline.from_pretrained",
                                 field=name)
        if name not in RENDER_OPTIONS:
            raise unknown_keyword(name, RENDER_OPTIONS)


def plan_request(load: LoadSettings, trajectory=None, *, preset: Optional[str] = None, **options) -> RenderRequest:
    """The request of one render on a pipeline of `load`, every default decided and every value checked
    (`_plan`'s arguments); `preset` (`camrender.vocabulary.PRESET`, e.g. "sana-wm-bench") gives its settings to the
    options left None."""
    if preset is not None:
        given = {name: value for name, value in options.items() if value is not None}
        options = {**words.PRESETS[words.check_word(words.PRESET, preset)], **given}
    return _plan(load, trajectory, **options)


def _plan(load: LoadSettings, trajectory=None, *, image=None, prompt: Optional[str] = None,
          negative_prompt: Optional[str] = None, frames: Optional[int] = None, mode: Optional[str] = None,
          steps: Optional[int] = None, guidance: Optional[float] = None, seed: Optional[int] = None,
          fps: Optional[float] = None, height: Optional[int] = None, width: Optional[int] = None,
          segment_frames: Optional[int] = None, cached_segments: Optional[int] = None, prompt_cache=None,
          out=None, noise_frames: Optional[int] = None, flow_shift: Optional[float] = None,
          controls: Optional[dict] = None, notes: Optional[list] = None, **path_options) -> RenderRequest:
    """The request of one render on a pipeline of `load`, every default decided and every value checked.

    trajectory: a `camrender.trajectory.Trajectory`, a path to any trajectory file camrender reads (v1 JSON,
    COLMAP, nerfstudio, transforms.json, RealEstate10K, SANA-WM pose .npy) or an action string such as
    "w-80,jw-40" (read with `path_options`: action_scheme, translation_speed, rotation_speed, pitch_limit,
    smooth, intrinsics); or an iterable of `camrender.render.camera_feed.SegmentCamera` (the path as a stream;
    give `frames`). The path is re-timed to `frames`, else to the nearest frame count of the recipe.
    image: path or PIL image (default: the trajectory's; only the tiny model renders without one); prompt,
    negative_prompt, seed, fps: default the trajectory's, else "", "", 0, 16; mode, steps, guidance,
    segment_frames, cached_segments: default the recipe's; height, width: default the release size (tiny:
    64 x 112); prompt_cache: a folder of encoded prompts, None or "off" for none; out: the mp4 to write (checked
    here: suffix, folder); noise_frames: latent frames of the noise draw (a live flight's); flow_shift: full
    mode's scheduler shift instead of the recipe's; controls: the action-scheme record of a Trajectory given
    already rolled out (a render file's). notes: a list that gets one-line notes (a re-timed path).
    Raises CamrenderError (one line naming the file and field) for what does not fit; nothing is written.
    """
    unknown = sorted(set(path_options) - set(PATH_OPTIONS))
    if unknown:
        check_options({unknown[0]: None})
    said = [] if notes is None else notes
    recipe = get_recipe(load.recipe)
    if flow_shift is not None:
        check_finite(flow_shift, "flow-shift", minimum=0.0)
        recipe = dataclasses.replace(recipe, flow_shift=float(flow_shift))
    mode = words.check_word(words.MODE, mode or recipe.mode)
    _check_numbers(steps, guidance, seed, fps, segment_frames, cached_segments)
    if out is not None:
        out = _checked_out(out)
    if frames is not None:
        check_frames(frames, mode)
    traj, cameras, controls = _path_of(trajectory, image, controls, said, path_options)
    if traj is not None:
        loaded = traj
        traj = to_model_frames(traj, frames, stride=recipe.frame_stride)
        note = frames_note(loaded.num_frames, traj.num_frames, frames, recipe.frame_stride, recipe.name)
        if note:
            said.append(note)
        frames = traj.num_frames
    elif cameras is None or frames is None:
        raise CamrenderError("give a trajectory, or a camera stream and its number of frames", field="frames")
    check_frames(frames, mode)
    image = _checked_image(image if image is not None else getattr(traj, "image", None), traj, load.model, said)
    height, width = default_size(height, width, load.model)
    check_size(height, width, load.model)
    if load.refiner is not None and frames < 9:  # 8k+1 frames: k latent frames after the image's
        raise CamrenderError(f"the refiner needs at least 9 frames (it refines the latent frames after the "
                             f"image's), got {frames}", field="frames")
    _check_noise_frames(noise_frames, frames)
    prompt = _first(prompt, getattr(traj, "prompt", None), "")
    negative = _first(negative_prompt, getattr(traj, "negative_prompt", None), "")
    seed = _first(seed, getattr(traj, "seed", None), 0)
    fps = _first(fps, getattr(traj, "fps", None), 16.0)
    if traj is not None:
        traj = traj.replace(prompt=prompt, negative_prompt=negative, image=image if isinstance(image, str) else None,
                            seed=seed, fps=fps)
    return RenderRequest(traj=traj, prompt=prompt, negative_prompt=negative, image=image,
                         steps=default_steps(steps, mode, load.model, recipe),
                         guidance=default_guidance(guidance, mode, recipe), seed=seed, num_frames=frames, fps=fps,
                         height=height, width=width, mode=mode, recipe=recipe, segment_frames=segment_frames,
                         cached_segments=cached_segments, prompt_cache=_cache_folder(prompt_cache),
                         controls=controls, out=out, cameras=cameras, noise_frames=noise_frames, settings=load)


def _cache_folder(value) -> Optional[str]:
    """The prompt cache folder of a render: None or "off" for none."""
    return None if value in (None, NO_CACHE) else str(Path(value).expanduser())


def _first(*values):
    return next((value for value in values if value is not None), None)


def _check_numbers(steps, guidance, seed, fps, segment_frames, cached_segments) -> None:
    check_finite(guidance, "guidance", minimum=0.0)
    check_finite(fps, "fps")
    check_fps(fps)
    if steps is not None and steps > MAX_STEPS:
        raise CamrenderError(f"must be at most {MAX_STEPS}, got {steps}", field="steps")
    if steps is not None and steps < 1:
        raise CamrenderError(f"must be at least 1, got {steps}", field="steps")
    check_seed(seed)
    if segment_frames is not None and segment_frames < 1:
        raise CamrenderError(f"must be at least 1, got {segment_frames}", field="segment-frames")
    if cached_segments is not None and cached_segments < 0:
        raise CamrenderError(f"must be at least 0, got {cached_segments}", field="cached-segments")


def _checked_out(out) -> Path:
    """The output video: an .mp4 in a folder that takes new files, whose name and side files' names fit it
    (checked now, not after the model loaded)."""
    check_suffix(out, VIDEO_SUFFIXES, "the output video")
    out = check_output_path(out)
    check_output_names(out)
    probe_writable(out)
    return out


def _path_of(trajectory, image, controls, notes: list, path_options: dict) -> tuple:
    """(Trajectory or None, camera stream or None, controls record or None) of `plan_request`'s trajectory."""
    if isinstance(trajectory, trajectories.Trajectory):
        return trajectory.validate(), None, controls
    if isinstance(trajectory, (str, Path)):
        size = image_size_of(image) if isinstance(image, (str, Path)) else None
        traj, scheme = read_path(trajectory, image_size=size, notes=notes, **path_options)
        return traj, None, None if scheme is None else scheme.to_dict()
    if trajectory is None:
        return None, None, None
    return None, trajectory, None


def _checked_image(image, traj, model: str, notes: list):
    """The first-frame image, readable (now, not after the model loads), a path made absolute; a note when its
    aspect differs from the path's intrinsics'; None only for the tiny model."""
    if image is None:
        if model != words.TINY:
            raise CamrenderError("SANA-WM needs a first-frame image: pass --image or set \"image\" in the "
                                 "trajectory", path=getattr(traj, "source", None), field="image")
        return None
    width, height = open_image(image).size
    if traj is not None and abs(width / height - traj.width / traj.height) > 0.01 * traj.width / traj.height:
        notes.append(f"warning: the image is {width}x{height} but the trajectory's intrinsics are for "
                     f"{traj.width}x{traj.height}; both are cover-cropped to the video separately")
    return str(Path(image).resolve()) if isinstance(image, (str, Path)) else image


def _check_noise_frames(drawn, frames: int) -> None:
    """noise_frames (None, or latent frames of the noise draw, which a `camrender play` flight's render file
    sets) checked against the `frames` video frames' latent frames."""
    latent = (frames - 1) // TIME_STRIDE + 1
    if drawn is not None and drawn < latent:
        raise CamrenderError(f"must be at least the clip's {latent} latent frames, got {drawn}", field="noise-frames")
    check_latent_frames(drawn, "noise-frames")


@dataclasses.dataclass(frozen=True)
class PreparedOutput:
    """What `prepare_output` decided before the model loads: the checkpoint to resume from (None: from the
    start), the seconds between checkpoints (inf: the render keeps none) and the claim on the output its
    leader holds (`camrender.output.targets.claim_output`; None on the other ranks) until `release`."""

    resume_info: Optional[dict]
    checkpoint_every: float
    claim: Optional[OutputClaim] = None

    def release(self) -> None:
        """Give the output's claim back (again: nothing)."""
        if self.claim is not None:
            self.claim.release()


def resume_refusal(request) -> Optional[str]:
    """Why `request` cannot continue from a checkpoint (None: it can, in segment mode)."""
    if request.settings.refiner is not None:
        return "--resume does not work with --refiner yet (the refiner's state is not checkpointed)"
    if request.recipe.sampler == "chunk-flow-euler":
        return "--resume does not work with the chunk-causal recipe (several chunks are in flight at every boundary)"
    if request.mode == "segments" and request.settings.head_split > 1:
        return ("--resume does not work with several GPUs per video in segment mode yet (each GPU holds its own "
                "heads' state; split renders keep no checkpoint)")
    return None


def check_checkpoint_every(seconds: float) -> None:
    """CamrenderError (field checkpoint-every) unless `seconds` between checkpoints is 0 (every segment) or more."""
    if math.isnan(seconds) or seconds < 0:
        raise CamrenderError(f"must be a number of seconds (0: every segment), got {seconds}", field="checkpoint-every")


def prepare_output(request, *, resume: bool = False, checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY,
                   overwrite: bool = True, log=None, leader: bool = True) -> PreparedOutput:
    """Check how `request` is written and what earlier runs left at its output, before anything loads:
    `resume` continues an interrupted segment-mode render from its checkpoint (not with the refiner, the
    chunk-causal recipe or a head split: their state is not checkpointed), `checkpoint_every` seconds between
    checkpoints (0: every segment); an existing video at the output is replaced (with a note) only with
    `overwrite`. Only the `leader` of a video group looks at the output.
    Raises CamrenderError (one line) for what does not fit."""
    check_checkpoint_every(checkpoint_every)
    refusal = resume_refusal(request) if resume else None
    if refusal is not None:
        raise CamrenderError(refusal, field="resume")
    # the refiner's window is not part of a checkpoint, nor the other ranks' heads of a split segment render:
    # with either, the render keeps none
    keeps = request.settings.refiner is None and not (request.mode == "segments" and request.settings.head_split > 1)
    if not leader:
        return PreparedOutput(None, checkpoint_every if keeps else float("inf"))
    claim = claim_output(request.out)  # before anything looks at the output: a second render refuses here
    try:
        if Path(request.out).exists():
            if not overwrite:
                raise CamrenderError("exists: pass --overwrite to replace it, or remove it", path=request.out,
                                     field="overwrite")
            (log or (lambda line: None))(f"replacing {request.out} (--no-overwrite keeps it)")
        info = check_resume(request, resume, log or (lambda line: None))
    except BaseException:
        claim.release()
        raise
    return PreparedOutput(info, checkpoint_every if keeps else float("inf"), claim)


def on_video_group(request: RenderRequest, per_video: int, device: Optional[str] = None) -> RenderRequest:
    """`request` as a video group of `per_video` ranks renders it: the heads split as the group's layout asks
    (`camrender.parallel.cfg`; CamrenderError for a layout that does not fit) and, given, this rank's device."""
    check_split(request.mode, request.guidance, per_video)
    changes = {"head_split": head_split_size(request.mode, request.guidance, per_video)}
    if device is not None:
        changes["device"] = device
    return dataclasses.replace(request, settings=request.settings.replace(**changes))


def for_ranks(request: RenderRequest, ranks) -> RenderRequest:
    """`request` as this rank of a video group renders it (`camrender.parallel.distributed.Ranks`; None: one
    process, the request as it is)."""
    return request if ranks is None else on_video_group(request, ranks.per_video, str(ranks.device))
