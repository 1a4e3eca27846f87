"""Checkpoint recipes: how each released SANA-WM checkpoint is sampled.

A recipe is everything about a render that follows from which checkpoint is loaded rather
than from the user's path: the mode, the chunk layout of segment mode, the softmax window and
scale, the sampler and its default steps / timestep list and guidance, and the frame-count
stride. `RECIPES` holds one per checkpoint:

| recipe | checkpoint | mode | sampler |
|---|---|---|---|
| `bidirectional` | `SANA-WM_bidirectional-diffusers` (diffusers folder) | full clip | flow-match Euler, 60 steps, guidance 5 |
| `streaming` | `SANA-WM_streaming/sana_dit/model.pt` | segments | self-forcing Euler over 1000, 960, 889, 727; no guidance |
| `chunk-causal` | `SANA-WM_chunk_causal/dit/*.safetensors` | segments | ChunkFlowEuler (staggered per-chunk schedule), 60 steps, guidance 5 |

`detect_recipe(path)` tells the recipe of an original-format weights file (safetensors metadata,
the distillation trainer's `generator` / `denoising_step_list` wrapper, the file name as a last
resort); `resolve_recipe` combines it with `--recipe`. Nothing here imports the model.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from camrender.errors import CamrenderError

__all__ = ["Recipe", "RECIPES", "get_recipe", "detect_recipe", "resolve_recipe", "segment_bounds"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How one checkpoint is sampled.

    Attributes:
        name: the `--recipe` word.
        mode: default render mode, "full" or "segments".
        chunk_frames: latent frames per chunk after the first (segment mode).
        cached_chunks: softmax window, the official `num_cached_blocks` n: chunk i attends to the
            sink (chunk 0), chunks max(i - n + 1, 0) .. i-1, and itself; None: every earlier chunk.
        softmax_scale: "head" (1/sqrt(head dim) in the main and camera softmax attention, the
            original code) or "diffusers" (the camera attention at 1/sqrt(128), its head dim padded,
            as diffusers' bidirectional model).
        camera_downscale: whether UCPE-encoded camera q/k/v are scaled back to their pre-UCPE RMS
            (diffusers' model) or not (the original code).
        sampler: "euler" (full clip, CFG), "self-forcing" (per chunk: a short timestep list, then a
            timestep-0 cache pass), "chunk-flow-euler" (the chunk-causal teacher's staggered sampler).
        timesteps: default per-chunk timestep list (self-forcing), or None.
        steps: default number of denoising steps (None: the timestep list).
        guidance: default classifier-free guidance (<= 1: off).
        frame_stride: video frame counts are `frame_stride * k + 1`.
    """

    name: str
    mode: str
    chunk_frames: int
    cached_chunks: Optional[int]
    softmax_scale: str
    camera_downscale: bool
    sampler: str
    timesteps: Optional[tuple]
    steps: Optional[int]
    guidance: float
    frame_stride: int

    @property
    def recent_chunks(self) -> Optional[int]:
        """Chunks besides the sink a chunk's softmax queries attend to (n - 1; None: all)."""
        return None if self.cached_chunks is None else max(self.cached_chunks - 1, 0)


STREAMING_TIMESTEPS = (1000.0, 960.0, 889.0, 727.0)

RECIPES = {
    "bidirectional": Recipe(
        name="bidirectional", mode="full", chunk_frames=3, cached_chunks=2, softmax_scale="diffusers",
        camera_downscale=True, sampler="euler", timesteps=None, steps=60, guidance=5.0, frame_stride=8,
    ),
    "streaming": Recipe(
        # inference_sana_wm_streaming.py defaults: num_frame_per_block=3, num_cached_blocks=2,
        # sink on, denoising_step_list [1000, 960, 889, 727, 0], cfg_scale 1, frames snapped to 24k+1.
        name="streaming", mode="segments", chunk_frames=3, cached_chunks=2, softmax_scale="head",
        camera_downscale=False, sampler="self-forcing", timesteps=STREAMING_TIMESTEPS, steps=None, guidance=1.0,
        frame_stride=24,
    ),
    "chunk-causal": Recipe(
        name="chunk-causal", mode="segments", chunk_frames=3, cached_chunks=None, softmax_scale="head",
        camera_downscale=False, sampler="chunk-flow-euler", timesteps=None, steps=60, guidance=5.0, frame_stride=8,
    ),
}
_NAMES = ", ".join(RECIPES)


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`; CamrenderError (field "recipe") listing the recipes otherwise."""
    if name not in RECIPES:
        raise CamrenderError(f"unknown recipe {name!r}; recipes: {_NAMES}", field="recipe")
    return RECIPES[name]


def segment_bounds(num_frames: int, chunk_frames: int = 3) -> list:
    """Half-open latent-frame ranges of the chunks, the official layout
    (`create_autoregressive_segments`): `n = F // c`, `rem = F % c`, bounds `0, c + rem, 2c + rem, ...`,
    so the first chunk holds the conditioning frame and absorbs the remainder.

    F = 16 -> (0,4),(4,7),(7,10),(10,13),(13,16); F = 17 -> (0,5),(5,8),...; F = 18 -> (0,3),(3,6),...
    Fewer than `chunk_frames + 1` frames make one chunk.
    """
    if num_frames < 1:
        raise ValueError(f"need at least one latent frame, got {num_frames}")
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
    if num_frames <= chunk_frames:
        return [(0, num_frames)]
    first = chunk_frames + num_frames % chunk_frames
    starts = [0] + list(range(first, num_frames, chunk_frames))
    return list(zip(starts, starts[1:] + [num_frames]))


# ----------------------------------------------------------------------------- detection
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


def unreadable_weights(path, error: Exception) -> CamrenderError:
    """The one-line error for a weights file safetensors or torch.load(weights_only=True) cannot read:
    what kind of file was expected, and the library's first sentence (its messages run long)."""
    expected = ("a safetensors file" if Path(path).suffix == ".safetensors"
                else "a torch weights file (a .pt of tensors saved with torch.save)")
    detail = " ".join(str(error).split()).split(". ")[0][:120]
    return CamrenderError(f"not {expected}: {type(error).__name__}: {detail} (expected original-format DiT weights: "
                          f".safetensors or .pt)", path=path, field="transformer-weights")


def _file_evidence(path: Path) -> Optional[str]:
    """Recipe the weights file itself names, or None: safetensors metadata `recipe`, the
    distillation trainer's `{"generator": ..., "denoising_step_list": ...}` wrapper (streaming)."""
    if path.suffix == ".safetensors":
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
        except Exception as error:
            raise unreadable_weights(path, error) from None
        named = metadata.get("recipe")
        if named is None and "sampler_config" in metadata:
            named = json.loads(metadata["sampler_config"]).get("recipe")
        return named if named in RECIPES else None
    import torch

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as error:
            raise unreadable_weights(path, error) from None
    if isinstance(state, dict) and isinstance(state.get("generator"), dict) and "denoising_step_list" in state:
        return "streaming"
    return None


def _name_evidence(path: Path) -> Optional[str]:
    """Recipe the file or folder names say (last resort): `...streaming...`, `...chunk_causal...`."""
    text = str(path).lower().replace("-", "_")
    if "chunk_causal" in text:
        return "chunk-causal"
    if "streaming" in text:
        return "streaming"
    if "bidirectional" in text:
        return "bidirectional"
    return None


def detect_recipe(weights) -> Optional[str]:
    """Recipe of an original-format DiT file (file evidence first, then its name), or None."""
    path = Path(weights)
    if not path.is_file():
        raise CamrenderError("weights file not found", path=path, field="transformer-weights")
    return _file_evidence(path) or _name_evidence(path)


def resolve_recipe(requested: Optional[str], weights=None, model: str = "") -> Recipe:
    """The recipe of a render: `requested` (`--recipe`, may be None) checked against the checkpoint.

    Without `weights` the transformer is the pipeline's (the bidirectional diffusers checkpoint;
    the offline "tiny" model takes any recipe). Raises CamrenderError (field "recipe") for an
    unknown name, a recipe that does not fit the checkpoint, or a checkpoint whose recipe
    cannot be told with no `requested`.
    """
    if requested is not None:
        get_recipe(requested)
    if weights is None:
        if requested is None or requested == "bidirectional" or model == "tiny":
            return get_recipe(requested or "bidirectional")
        raise CamrenderError(f"recipe {requested!r} needs its original-format DiT (--transformer-weights); "
                             f"the pipeline's own transformer is the bidirectional checkpoint", field="recipe")
    path = Path(weights)
    if not path.is_file():
        raise CamrenderError("weights file not found", path=path, field="transformer-weights")
    stated = _file_evidence(path)
    if requested is None:
        detected = stated or _name_evidence(path)
        if detected is None:
            raise CamrenderError(f"cannot tell which recipe this checkpoint uses; pass --recipe ({_NAMES})",
                                 path=weights, field="recipe")
        return get_recipe(detected)
    if stated is not None and stated != requested:  # the file name alone does not overrule --recipe
        raise CamrenderError(f"--recipe {requested} does not fit this checkpoint "
                             f"(its keys are a {stated} checkpoint's)",
                             path=weights, field="recipe")
    return get_recipe(requested)
