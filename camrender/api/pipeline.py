"""The Python API: `CamrenderPipeline`, in diffusers' style.

    pipe = CamrenderPipeline.from_pretrained("tiny")            # hub id, diffusers folder or "tiny"
    frames = pipe("trajectories/orbit.json", prompt="a quiet street", frames=17)   # (F, H, W, 3) uint8
    for chunk in pipe.stream(path, image="first.png"): ...      # per segment, as each one finishes
    pipe.write("orbit.mp4", path, image="first.png")            # the mp4 and its side files

The CLI (`camrender render`) is a layer over the same pieces: `camrender.api.requests.build_request`
decides every default, `camrender.render.loop.render_frames` renders, `camrender.api.output.write_video`
writes.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from camrender import trajectory as trajectories
from camrender.api.output import write_video
from camrender.api.requests import build_request, check_refiner_options, checked_refiner, stage_precisions
from camrender.errors import CamrenderError
from camrender.limits import check_latent_frames
from camrender.model.refiner.loading import check_refiner_offload
from camrender.model.refiner.stream import KV_MAX_FRAMES as DEFAULT_REFINER_WINDOW
from camrender.model.stage1.loading import DEFAULT_MODEL
from camrender.model.stage1.recipes import resolve_recipe
from camrender.render.loop import render_frames
from camrender.render.pipeline import load_patched_pipeline
from camrender.render.request import RenderRequest


class CamrenderPipeline:
    """A loaded SANA-WM pipeline, patched with camrender's kernels, that renders videos along camera paths.

    Build it with `from_pretrained`. Attributes: `pipe` (the diffusers `SanaWMPipeline`, patched, with
    the refiner attached when one was asked for), `recipe` (the checkpoint's
    `camrender.model.stage1.recipes.Recipe`) and `settings` (the model-side `RenderRequest` fields every render
    of this pipeline shares: model, dtype, device, kernels, offload, weights, VAE, refiner and its offload,
    CUDA graphs, the precision of each stage, the refiner's window).
    """

    def __init__(self, pipe, recipe, settings: dict):
        self.pipe, self.recipe, self.settings = pipe, recipe, dict(settings)

    @classmethod
    def from_pretrained(cls, model: str = DEFAULT_MODEL, *, refiner: Optional[str] = None,
                        recipe: Optional[str] = None, transformer_weights=None, vae=None, kernels: str = "fused",
                        dtype: str = "auto", device: Optional[str] = None, offload: bool = False,
                        refiner_offload: str = "none", allow_missing_weights: bool = False,
                        cuda_graphs: bool = True, precision: str = "bf16", stage1_precision: Optional[str] = None,
                        refiner_precision: Optional[str] = None, refiner_window: int = DEFAULT_REFINER_WINDOW,
                        log=None) -> "CamrenderPipeline":
        """Load and patch the pipeline (no network for "tiny" or a local folder).

        model: hub id, local diffusers folder, or "tiny" (the offline random-weight model); refiner:
        None, "tiny", a refiner folder or hub id (stage 2); recipe: "bidirectional", "streaming",
        "chunk-causal" or None (told from the checkpoint); transformer_weights: an original-format DiT
        file loaded over the transformer; vae: a diffusers VAE folder replacing the pipeline's; kernels:
        "fused" or "torch"; dtype: "auto" (bf16 on CUDA, fp32 on CPU), "bfloat16", "float16", "float32";
        device: "cuda", "cuda:1", "cpu" or None (CUDA when available); cuda_graphs: replay stage 1's
        denoising passes as CUDA graphs (CUDA, not with offload); refiner_offload: "none", "layers" or
        a number of the refiner's blocks kept in CPU memory (`camrender.model.refiner.loading.place_refiner`);
        precision: "bf16" or "fp8" (e4m3 W8A8 linears of the transformer blocks, GPUs of compute
        capability 8.9+) for both stages, or per stage
        `stage1_precision` / `refiner_precision`; refiner_window: the refiner's KV window in latent frames
        (the sink plus N-1 recent ones); log: a callable taking one line. The settings are decided here
        once (`camrender.model.settings.RenderSettings`) for every render: `request` refuses them.
        """
        found = resolve_recipe(recipe, str(transformer_weights) if transformer_weights else None, model)
        refiner = checked_refiner(refiner, model, vae, 9)
        refiner_offload = check_refiner_offload(refiner_offload)
        given = {name for name, changed in (("refiner_offload", refiner_offload != "none"),
                                            ("refiner_precision", refiner_precision is not None),
                                            ("refiner_window", refiner_window != DEFAULT_REFINER_WINDOW)) if changed}
        check_refiner_options(refiner, given)
        check_latent_frames(int(refiner_window), "refiner_window")
        precisions = stage_precisions(precision, stage1_precision, refiner_precision, device)
        settings = dict(model=model, dtype=dtype, device=device, offload=offload,
                        transformer_weights=transformer_weights, vae=vae, kernels=kernels,
                        allow_missing_weights=allow_missing_weights, refiner_offload=refiner_offload,
                        cuda_graphs=cuda_graphs, refiner=refiner, refiner_window=int(refiner_window), **precisions)
        loading = RenderRequest(traj=None, mode=found.mode, guidance=found.guidance, recipe=found.name, **settings)
        return cls(load_patched_pipeline(loading, log), found, settings)

    def request(self, trajectory, image=None, prompt: Optional[str] = None, **options) -> RenderRequest:
        """The `RenderRequest` of a render (every default decided, `camrender.api.requests.build_request`).

        trajectory: a `camrender.trajectory.Trajectory`, a path to any trajectory file camrender reads
        (v1 JSON, COLMAP, nerfstudio, transforms.json, RealEstate10K, .npy poses) or an action string
        such as "w-80,jw-40"; or an iterable of `camrender.render.camera_feed.SegmentCamera` (the path as a
        stream, pulled one segment at a time; give `frames`). options: frames, mode, steps, guidance,
        seed, fps, height, width, negative_prompt, segment_frames, cached_segments, out, prompt_cache (a
        folder of encoded prompts; None or "off": no cache, the default).
        The pipeline's own settings (`settings`: kernels, precisions, the refiner's window, ...) were decided
        at load: passing one here is refused rather than ignored.
        """
        fixed = sorted(set(options) & (set(self.settings) | {"precision", "recipe"}))
        if fixed:
            raise CamrenderError(f"{', '.join(fixed)}: decided when the pipeline loads; pass "
                                 f"{'it' if len(fixed) == 1 else 'them'} to CamrenderPipeline.from_pretrained",
                                 field=fixed[0])
        if options.get("prompt_cache") == "off":  # the CLI's word for no cache (None, the API's default)
            options["prompt_cache"] = None
        settings = {key: value for key, value in self.settings.items() if key != "refiner"}
        refiner = self.settings["refiner"] or "none"
        traj, cameras = _path_or_stream(trajectory)
        return build_request(traj, self.recipe, image=image, prompt=prompt, cameras=cameras, refiner=refiner,
                             **{**settings, **options})

    def stream(self, trajectory, image=None, prompt: Optional[str] = None, *, progress=None,
               **options) -> Iterator[np.ndarray]:
        """Render and yield the video as uint8 (F_chunk, H, W, 3) chunks as they finish: one per segment in
        segment mode, the whole clip at once in full mode. progress: `progress(done, total, info)`."""
        yield from render_frames(self.pipe, self.request(trajectory, image, prompt, **options), progress)

    def __call__(self, trajectory, image=None, prompt: Optional[str] = None, *, progress=None,
                 **options) -> np.ndarray:
        """Render the whole video: uint8 (F, H, W, 3), F = 8k + 1 frames (arguments as `request`)."""
        return np.concatenate(list(self.stream(trajectory, image, prompt, progress=progress, **options)))

    def write(self, out, trajectory, image=None, prompt: Optional[str] = None, *, progress=None,
              side_files: bool = True, **options) -> "RenderResult":
        """Render into the mp4 `out` (written to a temporary name and renamed; segment mode with
        checkpoints) and, with `side_files`, `NAME.traj.json`, `NAME.render.json` and `NAME.path.png`
        (a camera stream writes none: there is no whole path to save)."""
        request = self.request(trajectory, image, prompt, out=Path(out), **options)
        frames, files = write_video(self.pipe, request, progress, side_files=side_files and request.traj is not None)
        return RenderResult(Path(out), frames, files)


@dataclasses.dataclass(frozen=True)
class RenderResult:
    """What `CamrenderPipeline.write` wrote: the video, its frame count and its side files."""

    video: Path
    frames: int
    side_files: list


def _path_or_stream(trajectory) -> tuple:
    """(Trajectory or None, camera stream or None) of `CamrenderPipeline.request`'s `trajectory`."""
    if isinstance(trajectory, trajectories.Trajectory):
        return trajectory.validate(), None
    if isinstance(trajectory, (str, Path)):
        return trajectories.load(trajectory), None
    return None, trajectory
