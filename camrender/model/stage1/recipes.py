"""Checkpoint recipes: how each released SANA-WM checkpoint is sampled.

A recipe is everything about a render that follows from which checkpoint is loaded rather
than from the user's path: the mode, the chunk layout of segment mode, the softmax window and
scale, the camera-branch arithmetic, the sampler and its default steps / timestep list / shift and
guidance, and the frame-count stride. `RECIPES` holds one or more per checkpoint (`Recipe.checkpoint`):
bidirectional (three recipes: NVlabs 40151c8, NVlabs today, diffusers 0.42.1), streaming and chunk-causal.

`RECIPES` is the one source of these defaults: `recipe_table()` writes the README's recipe table
(a test keeps them equal) and `per_recipe` the defaults in `camrender render --help`.

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
from camrender.vocabulary import DEFAULT_RECIPE, TINY

__all__ = ["Recipe", "RECIPES", "DEFAULT_RECIPE", "get_recipe", "recipes_of", "detect_recipe", "resolve_recipe",
           "segment_bounds", "recipe_table", "per_recipe"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How one checkpoint is sampled.

    Attributes:
        name: the `--recipe` word.
        mode: default render mode, "full" or "segments".
        chunk_frames: latent frames per chunk after the first (segment mode).
        cached_chunks: softmax window, the official `num_cached_blocks` n: chunk i attends to the
            sink (chunk 0), chunks max(i - n + 1, 0) .. i-1, and itself; None: every earlier chunk.
        checkpoint: the checkpoint (weights layout) the recipe fits: "bidirectional", "streaming"
            or "chunk-causal"; recipes of one checkpoint differ only in arithmetic.
        softmax_scale: "head" (1/sqrt(head dim) in the main and camera softmax attention, NVlabs'
            code today) or "padded" (the camera attention at 1/sqrt(128), its head dim padded, as
            NVlabs 40151c8 and diffusers).
        gdn_camera_downscale: whether the GDN blocks scale their UCPE-encoded camera q/k/v back to
            the pre-UCPE RMS (diffusers' model only).
        softmax_camera_downscale: the same in the softmax blocks (diffusers, NVlabs 40151c8).
        sampler: "euler" (full clip, CFG), "self-forcing" (per chunk: a short timestep list, then a
            timestep-0 cache pass), "chunk-flow-euler" (the chunk-causal teacher's staggered sampler).
        timesteps: default per-chunk timestep list (self-forcing), or None.
        steps: default number of denoising steps (None: the timestep list).
        guidance: default classifier-free guidance (<= 1: off).
        frame_stride: video frame counts are `frame_stride * k + 1`.
        flow_shift: full mode's scheduler is diffusers' `FlowMatchEulerDiscreteScheduler(shift=flow_shift)`
            (NVlabs' `LTXFlowEuler`); None: the pipeline's own scheduler, as diffusers' pipeline.
    """

    name: str
    checkpoint: str
    mode: str
    chunk_frames: int
    cached_chunks: Optional[int]
    softmax_scale: str
    gdn_camera_downscale: bool
    softmax_camera_downscale: bool
    sampler: str
    timesteps: Optional[tuple]
    steps: Optional[int]
    guidance: float
    frame_stride: int
    flow_shift: Optional[float] = None

    @property
    def recent_chunks(self) -> Optional[int]:
        """Chunks besides the sink a chunk's softmax queries attend to (n - 1; None: all)."""
        return None if self.cached_chunks is None else max(self.cached_chunks - 1, 0)


STREAMING_TIMESTEPS = (1000.0, 960.0, 889.0, 727.0)

# NVlabs' bidirectional sampler (`LTXFlowEuler` as `SanaWMPipeline._sample_stage1` sets it up):
# YAML scheduler.inference_flow_shift, cfg_scale 5, 60 steps.
BIDIRECTIONAL_SHIFT = 9.8


def _bidirectional(name: str, softmax_scale: str, gdn_downscale: bool, softmax_downscale: bool,
                   flow_shift: Optional[float]) -> Recipe:
    return Recipe(name=name, checkpoint="bidirectional", mode="full", chunk_frames=3, cached_chunks=2,
                  softmax_scale=softmax_scale, gdn_camera_downscale=gdn_downscale,
                  softmax_camera_downscale=softmax_downscale, sampler="euler", timesteps=None, steps=60,
                  guidance=5.0, frame_stride=8, flow_shift=flow_shift)


RECIPES = {
    # NVlabs 40151c8, the release that shipped the bidirectional weights (docs/recipes.md).
    "bidirectional": _bidirectional("bidirectional", "padded", False, True, BIDIRECTIONAL_SHIFT),
    # NVlabs today (5498e5b): no camera rescale anywhere, camera softmax at 1/sqrt(head dim).
    "bidirectional-nvlabs-latest": _bidirectional("bidirectional-nvlabs-latest", "head", False, False,
                                                  BIDIRECTIONAL_SHIFT),
    # diffusers 0.42.1's SanaWMTransformer3DModel and SanaWMPipeline exactly.
    "bidirectional-diffusers": _bidirectional("bidirectional-diffusers", "padded", True, True, None),
    "streaming": Recipe(
        # inference_sana_wm_streaming.py defaults: num_frame_per_block=3, num_cached_blocks=2,
        # sink on, denoising_step_list [1000, 960, 889, 727, 0], cfg_scale 1, frames snapped to 24k+1.
        name="streaming", checkpoint="streaming", mode="segments", chunk_frames=3, cached_chunks=2,
        softmax_scale="head", gdn_camera_downscale=False, softmax_camera_downscale=False, sampler="self-forcing",
        timesteps=STREAMING_TIMESTEPS, steps=None, guidance=1.0, frame_stride=24,
    ),
    "chunk-causal": Recipe(
        name="chunk-causal", checkpoint="chunk-causal", mode="segments", chunk_frames=3, cached_chunks=None,
        softmax_scale="head", gdn_camera_downscale=False, softmax_camera_downscale=False, sampler="chunk-flow-euler",
        timesteps=None, steps=60, guidance=5.0, frame_stride=8,
    ),
}
_NAMES = ", ".join(RECIPES)


# ----------------------------------------------------------------------------- the table in words
# What the README's recipe table says besides the numbers: where each checkpoint is and what it reproduces.
# The numbers (mode, steps, guidance, shift, window, frame counts) come from `RECIPES` alone.
RECIPE_CHECKPOINTS = {
    "bidirectional": "`Efficient-Large-Model/SANA-WM_bidirectional-diffusers` (the default `--model`, no "
                     "`--transformer-weights`)",
    "bidirectional-nvlabs-latest": "the same",
    "bidirectional-diffusers": "the same",
    "streaming": "`Efficient-Large-Model/SANA-WM_streaming`: `--transformer-weights sana_dit/model.pt` (causal VAE: "
                 "`--vae ltx2_causal_vae`)",
    "chunk-causal": "`Efficient-Large-Model/SANA-WM_chunk_causal`: `--transformer-weights "
                    "dit/sana_wm_chunk_causal_1600m_720p.safetensors`",
}
RECIPE_NOTES = {
    "bidirectional": "NVlabs' own arithmetic and sampler of the release that shipped these weights (40151c8); "
                     "trained on 161 frames, memory grows with the length",
    "bidirectional-nvlabs-latest": "as `bidirectional`, with NVlabs' code of today (5498e5b): no camera RMS rescale "
                                   "in the softmax blocks, camera softmax at 1/sqrt(112)",
    "bidirectional-diffusers": "diffusers 0.42.1's `SanaWMTransformer3DModel` and pipeline exactly (the checkpoint's "
                               "scheduler config); deviates from NVlabs' model by 25% per forward when a camera is "
                               "given",
    "streaming": "the distilled self-forcing sampler of `inference_sana_wm_streaming.py`",
    "chunk-causal": "the chunk-causal teacher (ChunkFlowEuler at flow shift 9.8); finished segments are cached, but "
                    "the segments in flight (all of them with the official schedule) and the softmax keys of all "
                    "earlier ones grow with the path ([docs/chunk-causal.md](docs/chunk-causal.md))",
}
_SAMPLERS = {"euler": "flow-match Euler", "self-forcing": "self-forcing",
             "chunk-flow-euler": "ChunkFlowEuler (staggered per-chunk schedule)"}


def _number(value) -> str:
    return f"{value:g}"


def steps_words(recipe: Recipe) -> str:
    """The recipe's default denoising, e.g. "60 steps" or "the 4-step list 1000, 960, 889, 727"."""
    if recipe.steps is not None:
        return f"{recipe.steps} steps"
    return f"the {len(recipe.timesteps)}-step list {', '.join(_number(t) for t in recipe.timesteps)}"


def guidance_words(recipe: Recipe) -> str:
    """"guidance 5", or "no guidance" (<= 1)."""
    return f"guidance {_number(recipe.guidance)}" if recipe.guidance > 1 else "no guidance"


def window_words(recipe: Recipe) -> str:
    """What a segment's softmax queries see: the first segment + n recent ones, or every earlier segment."""
    if recipe.recent_chunks is None:
        return "every earlier segment"
    return f"the first segment + {recipe.recent_chunks} recent"


def recent_words(recipe: Recipe) -> str:
    """The recent segments besides the first a recipe's softmax queries see: "1", or "all"."""
    return "all" if recipe.recent_chunks is None else str(recipe.recent_chunks)


def recipe_defaults(recipe: Recipe) -> str:
    """The README table's "defaults" cell of one recipe, from its fields only."""
    words = [_SAMPLERS[recipe.sampler], steps_words(recipe)]
    if recipe.sampler == "self-forcing":
        words[-1] = f"per segment {words[-1]} then a timestep-0 cache pass"
    words.append(guidance_words(recipe))
    if recipe.sampler == "euler":
        words.append(f"flow shift {_number(recipe.flow_shift)}" if recipe.flow_shift is not None
                     else "the scheduler's own shift")
    if recipe.mode == "segments":
        words.append(f"{recipe.chunk_frames} latent frames per segment, softmax window: {window_words(recipe)}")
    words.append(f"{recipe.frame_stride}k+1 frames")
    return ", ".join(words)


def recipe_table() -> str:
    """The README's recipe table (markdown, one row per recipe of `RECIPES`); a test keeps the README equal."""
    rows = ["| recipe | checkpoint | mode | defaults | notes |", "|---|---|---|---|---|"]
    for name, recipe in RECIPES.items():
        rows.append(f"| `{name}` | {RECIPE_CHECKPOINTS[name]} | `{recipe.mode}` | {recipe_defaults(recipe)} | "
                    f"{RECIPE_NOTES[name]} |")
    return "\n".join(rows) + "\n"


def _short_names(names: list) -> list:
    """`names` with every recipe of a checkpoint that has several written once as "CHECKPOINT*"."""
    short = []
    for name in names:
        kind = RECIPES[name].checkpoint
        family = recipes_of(kind)
        if len(family) > 1 and set(family) <= set(names):
            name = f"{kind}*"
        if name not in short:
            short.append(name)
    return short


def per_recipe(words) -> str:
    """`words(recipe)` of every recipe, recipes that share a value grouped: "60 steps (bidirectional*,
    chunk-causal); the 4-step list ... (streaming)"; the click help's defaults."""
    groups = {}
    for name, recipe in RECIPES.items():
        groups.setdefault(words(recipe), []).append(name)
    return "; ".join(f"{value} ({', '.join(_short_names(names))})" for value, names in groups.items())


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`; CamrenderError (field "recipe") listing the recipes otherwise."""
    if name not in RECIPES:
        raise CamrenderError(f"unknown recipe {name!r}; recipes: {_NAMES}", field="recipe")
    return RECIPES[name]


def recipes_of(checkpoint: str) -> list:
    """Names of the recipes that fit a checkpoint kind (`Recipe.checkpoint`), default first."""
    return [name for name, recipe in RECIPES.items() if recipe.checkpoint == checkpoint]


def _misfit(requested: str, checkpoint: str, path=None) -> CamrenderError:
    """The one-line error of a `--recipe` that does not fit a `checkpoint`-kind checkpoint."""
    return CamrenderError(f"--recipe {requested} does not fit this {checkpoint} checkpoint; recipes that fit: "
                          f"{', '.join(recipes_of(checkpoint))}", path=path, field="recipe")


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
    # lazy: keeps `camrender --help` free of torch
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
        if requested is None or model == TINY:
            return get_recipe(requested or DEFAULT_RECIPE)
        if get_recipe(requested).checkpoint != "bidirectional":
            raise CamrenderError(f"--recipe {requested} needs its original-format DiT (--transformer-weights); "
                                 f"the pipeline's own transformer is the bidirectional checkpoint; recipes that "
                                 f"fit: {', '.join(recipes_of('bidirectional'))}", field="recipe")
        return get_recipe(requested)
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
    # the file name alone does not overrule --recipe
    if stated is not None and get_recipe(stated).checkpoint != get_recipe(requested).checkpoint:
        raise _misfit(requested, get_recipe(stated).checkpoint, weights)
    return get_recipe(requested)
