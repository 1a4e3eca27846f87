"""The Python API: `CamrenderPipeline`, in diffusers' style, and the front door of every command.

    pipe = CamrenderPipeline.from_pretrained("tiny")            # hub id, diffusers folder or "tiny"
    frames = pipe("trajectories/orbit.json", prompt="a quiet street", frames=17)   # (F, H, W, 3) uint8
    for chunk in pipe.stream(path, image="first.png"): ...      # per segment, as each one finishes
    pipe.write("orbit.mp4", path, image="first.png")            # the mp4 and its side files

`from_pretrained` takes what the pipeline is loaded with (`camrender.render.load_settings.LoadSettings`, decided
once); a call takes what it renders (`camrender.api.requests.plan_request`'s options). `camrender render`,
`play`, `batch` and `encode-prompt` are layers over these same calls.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from camrender import vocabulary as words
from camrender.api.output import write_video
from camrender.api.requests import check_options, plan_request, prepare_output
from camrender.render.load_settings import LoadSettings
from camrender.model.stage1.recipes import Recipe, get_recipe
from camrender.render.loop import render_frames
from camrender.render.pipeline import load_patched_pipeline
from camrender.render.request import RenderRequest
from camrender.render.resume import DEFAULT_CHECKPOINT_EVERY


class CamrenderPipeline:
    """A loaded SANA-WM pipeline, patched with camrender's kernels, that renders videos along camera paths.

    Build it with `from_pretrained`. Attributes: `pipe` (the diffusers `SanaWMPipeline`, patched, with the
    refiner attached when one was asked for), `settings` (its `LoadSettings`: model, weights, VAE, refiner,
    kernels, dtype, device, offload, CUDA graphs, each stage's precision, the refiner's window and offload),
    `recipe` (the checkpoint's `camrender.model.stage1.recipes.Recipe`), `ranks` (the video group it renders
    with, `camrender.parallel.distributed.Ranks`; None on one process) and `log` (a callable taking one line,
    or None: where notes go).
    """

    def __init__(self, pipe, settings: LoadSettings, *, ranks=None, log: Optional[Callable[[str], None]] = None):
        self.pipe, self.settings, self.ranks, self.log = pipe, settings, ranks, log

    @property
    def recipe(self) -> Recipe:
        return get_recipe(self.settings.recipe)

    @classmethod
    def from_pretrained(cls, model: str = words.DEFAULT_MODEL, *, settings: Optional[LoadSettings] = None,
                        ranks=None, log: Optional[Callable[[str], None]] = None,
                        prepare: Optional[RenderRequest] = None, **load_options) -> "CamrenderPipeline":
        """Load and patch the pipeline (no network for "tiny" or a local folder).

        model: hub id, local diffusers folder, or "tiny" (the offline random-weight model); load_options: the
        other `LoadSettings` fields (refiner: None, "tiny", a refiner folder or hub id; recipe; transformer_weights;
        vae; kernels "fused" | "torch"; dtype "auto" | "bfloat16" | "float16" | "float32"; device "cuda",
        "cuda:1", "cpu" or None; offload; cuda_graphs; refiner_offload "none" | "layers" | N; precision "bf16" |
        "fp8" for both stages, or stage1_precision / refiner_precision; refiner_window; allow_missing_weights),
        checked by `LoadSettings.create` (a mistyped keyword names the closest valid one); or `settings`, a
        `LoadSettings` made already. ranks: the video group's `Ranks` under torchrun (None: one process);
        log: a callable taking one line (loading steps and notes); prepare: the one request this pipeline is
        loaded for (`camrender.render.pipeline.load_patched_pipeline`: cached prompts load no text encoder).
        """
        if settings is None:
            settings = LoadSettings.create(model, **load_options)
        elif load_options or model != words.DEFAULT_MODEL:
            raise ValueError("give either settings or the load options, not both")
        return cls(load_patched_pipeline(settings, log, ranks=ranks, prepare=prepare), settings, ranks=ranks, log=log)

    def request(self, trajectory, image=None, prompt: Optional[str] = None, **options) -> RenderRequest:
        """The `RenderRequest` of a render on this pipeline, every default decided (`plan_request`).

        trajectory: a `camrender.trajectory.Trajectory`, a path to any trajectory file camrender reads
        (v1 JSON, COLMAP, nerfstudio, transforms.json, RealEstate10K, .npy poses) or an action string
        such as "w-80,jw-40"; or an iterable of `camrender.render.camera_feed.SegmentCamera` (the path as a
        stream, pulled one segment at a time; give `frames`). options: frames, mode, steps, guidance, seed,
        fps, height, width, negative_prompt, segment_frames, cached_segments, flow_shift, out, prompt_cache (a
        folder of encoded prompts; None or "off": no cache, the default), the action-string options
        (action_scheme, translation_speed, rotation_speed, pitch_limit, smooth) and intrinsics. The pipeline's
        own settings (`settings`) were decided at load: passing one here is refused rather than ignored.
        """
        check_options(options)
        notes = []
        request = plan_request(self.settings, trajectory, image=image, prompt=prompt, notes=notes, **options)
        for note in notes:
            self._say(note)
        return request

    def stream(self, trajectory, image=None, prompt: Optional[str] = None, *, progress=None,
               **options) -> Iterator[np.ndarray]:
        """Render and yield the video as uint8 (F_chunk, H, W, 3) chunks as they finish: one per segment in
        segment mode, the whole clip at once in full mode. trajectory: as `request`'s, or a `RenderRequest`
        planned by `request` (then no other argument). progress: `progress(done, total, info)`."""
        yield from render_frames(self.pipe, self._request(trajectory, image, prompt, options), progress)

    def __call__(self, trajectory, image=None, prompt: Optional[str] = None, *, progress=None,
                 **options) -> np.ndarray:
        """Render the whole video: uint8 (F, H, W, 3), F = 8k + 1 frames (arguments as `stream`)."""
        return np.concatenate(list(self.stream(trajectory, image, prompt, progress=progress, **options)))

    def write(self, out, trajectory=None, image=None, prompt: Optional[str] = None, *, progress=None,
              side_files: bool = True, resume: bool = False, checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY,
              overwrite: bool = True, check: Optional[Callable[[], None]] = None, prepared=None,
              **options) -> "RenderResult":
        """Render into the mp4 `out` (written to a temporary name and renamed; segment mode with checkpoints every
        `checkpoint_every` seconds, continued from the last with `resume`; an existing video replaced only with
        `overwrite`) and, with `side_files`,
        `NAME.traj.json`, `NAME.render.json` and `NAME.path.png` (a camera stream writes none: there is no whole
        path to save). out: the path, or a `RenderRequest` planned with its `out` (then no trajectory or options).
        check: called before each chunk is written (raise there to stop); prepared: `prepare_output`'s result
        when the caller checked the output already (before loading the model)."""
        if isinstance(out, RenderRequest):
            request = self._request(out, image, prompt, options)
        else:
            request = self._request(trajectory, image, prompt, {**options, "out": Path(out)})
        own = prepared is None  # (then its claim on the output is this call's to give back)
        if own:
            prepared = prepare_output(request, resume=resume, checkpoint_every=checkpoint_every, overwrite=overwrite,
                                      log=self._say,
                                      leader=self.ranks is None or self.ranks.is_leader)
        try:
            frames, files = write_video(self.pipe, request, prepared, progress, log=self._say,
                                        side_files=side_files and request.traj is not None, check=check)
        finally:
            if own:
                prepared.release()
        return RenderResult(Path(request.out), frames, files)

    def _request(self, trajectory, image, prompt, options: dict) -> RenderRequest:
        if isinstance(trajectory, RenderRequest):
            if image is not None or prompt is not None or options:
                raise ValueError("a planned RenderRequest takes no other render options")
            return trajectory
        return self.request(trajectory, image, prompt, **options)

    def _say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)


@dataclasses.dataclass(frozen=True)
class RenderResult:
    """What `CamrenderPipeline.write` wrote: the video, its frame count and its side files."""

    video: Path
    frames: int
    side_files: list
