"""What one call of the patched transformer holds (`SegmentCall`) and what its blocks carry from
finished segments to the next one (`BlockCache`, `SegmentCache`).

Full mode is a call of one segment with no state (`SegmentCall.whole`, with the options the
patched attentions hold, `camrender.model.stage1.patch.set_full_options`); segment mode passes a
`SegmentCall` built from `SegmentOptions` (a recipe's rules) and one `BlockCache` per block. The
caches live in the `SegmentCache` the caller passes in, never on the modules, so a CUDA-graph
replay of `segment_forward` reads only its arguments. Once a cache tensor exists, later writes of
the same shape go into its storage (`store`; a softmax block's full window of recent segments slides
inside its `BlockCache.window`): a graph reads the cache where it lies, never a copy.

Shapes: B batch, T latent frames of the call, S = h * w tokens per frame, N = T * S, C channels,
H heads, D head dim.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

SOFTMAX_SCALES = ("head", "padded")


@dataclasses.dataclass(frozen=True)
class SegmentOptions:
    """The rules of a segment-mode render (a checkpoint's recipe; the kernels' backend and
    matmul precision are the model's `KernelSettings`).

    Attributes:
        cached_segments: recent segments (besides the sink) softmax blocks attend to; None: all.
            The official `num_cached_blocks` n is n - 1 here (`Recipe.recent_chunks`).
        softmax_scale: "head": 1/sqrt(head dim) in the main and camera softmax attention (NVlabs'
            code today); "padded": the main attention at SDPA's default scale (1/sqrt(head dim)),
            the camera attention at 1/sqrt(its head dim zero-padded to 128), as NVlabs' initial
            release 40151c8 and diffusers' model (`Recipe.softmax_scale`, docs/recipes.md).
        gdn_camera_downscale: GDN blocks scale each UCPE-encoded camera q/k/v back to its pre-UCPE
            RMS (diffusers' model only; no NVlabs production path does).
        softmax_camera_downscale: the same in the softmax blocks (diffusers and NVlabs 40151c8).
        sdpa_dtype: dtype of the softmax attention; None -> bfloat16 for fp32 activations (as
            diffusers does), the activation dtype otherwise.
        key_slot: softmax blocks keep a slot for a call's keys after the cached ones (`BlockCache.window`):
            a call copies its keys there instead of concatenating all of them, for one segment's keys
            more in the cache (0.24 GiB at the release size). The same results either way; renders beside
            the refiner, where memory is short, go without.
        plucker_once: a sampler projects a call's post-attention Plucker maps for every block once
            (`camrender.model.stage1.segments.plucker_projections`, kept by `camrender.render.denoise.Denoiser`
            for all the passes over those frames) instead of every block in every pass: 20 of a segment's 100
            (N x C) @ (C x C) GEMMs, for one (B, N, C) tensor per block (0.24 GiB at the release size). The same
            results either way; segment-mode renders beside the refiner go without, as without the key slot, and
            so does any render under model CPU offload.
    """

    cached_segments: Optional[int] = 1
    softmax_scale: str = "head"
    gdn_camera_downscale: bool = False
    softmax_camera_downscale: bool = False
    sdpa_dtype: Optional[torch.dtype] = None
    key_slot: bool = True
    plucker_once: bool = False

    def __post_init__(self):
        if self.softmax_scale not in SOFTMAX_SCALES:
            raise ValueError(f"softmax_scale must be one of {SOFTMAX_SCALES}, got {self.softmax_scale!r}")

    @classmethod
    def for_recipe(cls, recipe, **fields) -> "SegmentOptions":
        """The options of a `camrender.model.stage1.recipes.Recipe` (its window, softmax scale and camera
        arithmetic), with `fields` set or overridden."""
        return cls(**{**dict(cached_segments=recipe.recent_chunks, softmax_scale=recipe.softmax_scale,
                             gdn_camera_downscale=recipe.gdn_camera_downscale,
                             softmax_camera_downscale=recipe.softmax_camera_downscale), **fields})

    @classmethod
    def full_mode(cls, recipe, **fields) -> "SegmentOptions":
        """Full mode's options under `recipe`: its arithmetic, one segment over the whole clip."""
        return cls.for_recipe(recipe, **{"cached_segments": None, **fields})

    @property
    def softmax_as_diffusers(self) -> bool:
        """Whether the softmax blocks' rules are diffusers' (so its stock softmax attention computes them)."""
        return self.softmax_scale == "padded" and self.softmax_camera_downscale


# Full mode's rules without a recipe set: the default `bidirectional` recipe's (NVlabs 40151c8).
FULL_MODE = SegmentOptions(cached_segments=None, softmax_scale="padded", gdn_camera_downscale=False,
                           softmax_camera_downscale=True)


@dataclasses.dataclass(frozen=True)
class SegmentCall:
    """Layout of one forward call: `segments` are (start, stop) frame ranges relative to the call,
    tiling [0, num_frames); `write`: the call stores its states in the blocks' caches (the
    timestep-0 pass on a finished segment); `options`: the rules it computes with."""

    num_frames: int
    height: int
    width: int
    segments: tuple
    write: bool = False
    options: SegmentOptions = FULL_MODE

    @classmethod
    def whole(cls, grid, options: SegmentOptions = FULL_MODE) -> "SegmentCall":
        """Full mode: one segment over the grid (T, h, w), nothing cached, `options`' rules."""
        if grid is None:
            raise ValueError("HW (T, h, w) must be provided for a call without a segment")
        frames, height, width = grid
        return cls(frames, height, width, ((0, frames),), options=options)

    @property
    def grid(self) -> tuple:
        return self.num_frames, self.height, self.width

    @property
    def spatial(self) -> int:
        return self.height * self.width

    def stateless(self, state: Optional["BlockCache"]) -> bool:
        """Whether the call reads and writes no state: one segment, no write, `state` None or empty
        (full mode, or a render's first segment before its cache pass)."""
        return len(self.segments) == 1 and not self.write and (state is None or state.is_empty())

    def segment_starts(self, device) -> Optional[torch.Tensor]:
        """Bool (T,) marking frames that open a segment (None for a single segment)."""
        if len(self.segments) == 1:
            return None
        starts = torch.zeros(self.num_frames, dtype=torch.bool, device=device)
        for start, _ in self.segments:
            starts[start] = True
        return starts

    def segment_index(self, device) -> torch.Tensor:
        """Long (T,) segment number of every frame of the call."""
        index = torch.empty(self.num_frames, dtype=torch.long, device=device)
        for i, (start, stop) in enumerate(self.segments):
            index[start:stop] = i
        return index


def compact(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A cache-owned copy: never a view that would keep a whole projection buffer alive."""
    return None if t is None else t.detach().clone(memory_format=torch.contiguous_format)


def store(current: Optional[torch.Tensor], new: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """`new`'s values kept in the cache: written into `current`'s storage when it has new's shape, dtype and
    device, else a cache-owned copy (`compact`). Written in place, a cache tensor keeps its address for the
    render, so a CUDA graph that reads the cache where it lies (`camrender.model.graphs`) stays valid."""
    if new is None:
        return None
    new = new.detach()
    if current is None or current.shape != new.shape or current.dtype != new.dtype or current.device != new.device:
        return compact(new)
    if new.untyped_storage().data_ptr() == current.untyped_storage().data_ptr():
        new = new.clone()  # overlapping memory: copy_ would read what it already wrote
    return current.copy_(new)


@dataclasses.dataclass
class SoftmaxKV:
    """Keys and values of one segment for a softmax block, (B, H, n, D) each, in the SDPA dtype
    (main K after RoPE, camera K and V after UCPE and, where the rules have it, RMS downscale)."""

    key: torch.Tensor
    value: torch.Tensor
    cam_key: Optional[torch.Tensor]
    cam_value: Optional[torch.Tensor]


@dataclasses.dataclass
class BlockCache:
    """What one block carries from finished segments to the next one (None before the first write).

    GDN blocks: `kv_state` (B, H, D, D) and `z_state` (B, H, D, 1) main forward-scan states, fp32;
    `cam_state` (B, H, D, D) camera forward-scan state, fp32; `key_tail` / `cam_key_tail`
    (B, <= K-1, S, C) raw main / camera K (before their short convs) of the latest frames.
    Softmax blocks: `sink` (first segment) and
    `recent` (at most `cached_segments` later segments, oldest first). Both: `ffn_tail` (B, 1, S, C),
    the last frame of the FFN's spatial output y (token-major), read by the next segment's temporal conv.

    `window` (not a field: never saved, rebuilt by the next write) is a `SoftmaxKV` of buffers (B, H, n + m, D)
    whose first n tokens are the context (`sink` and `recent` are views of them) and whose last m tokens
    are a slot for a call of m tokens: such a call writes its keys there and attends over the whole buffer
    (`window_slot`), where it would otherwise concatenate the context with its keys on every call.
    """

    window = None  # SoftmaxKV of (B, H, context + slot tokens, D) buffers, or None; see the docstring

    kv_state: Optional[torch.Tensor] = None
    z_state: Optional[torch.Tensor] = None
    cam_state: Optional[torch.Tensor] = None
    key_tail: Optional[torch.Tensor] = None
    cam_key_tail: Optional[torch.Tensor] = None
    sink: Optional[SoftmaxKV] = None
    recent: list = dataclasses.field(default_factory=list)
    ffn_tail: Optional[torch.Tensor] = None

    def is_empty(self) -> bool:
        """Whether nothing has been written yet."""
        return self.sink is None and self.ffn_tail is None and self.key_tail is None and self.kv_state is None \
            and self.cam_state is None and self.cam_key_tail is None

    def softmax_context(self) -> list:
        """Cached segments a new segment's queries attend to: the sink, then the recent ones."""
        return ([self.sink] if self.sink is not None else []) + list(self.recent)

    def keep_softmax(self, entry: SoftmaxKV, cached_segments: Optional[int], slot: bool = True) -> None:
        """Store a finished segment's keys and values (any views: they are copied): the first becomes
        the sink, later ones the recent window (at most `cached_segments`, all with None). A full window
        of same-shaped entries slides in place in `window` (each recent segment copied into the tokens of
        the one before it), so the cache keeps its addresses; otherwise `window` is laid out anew, with
        (`slot`) a slot for a next call of entry's size or none."""
        slot_tokens = entry.key.shape[2] if slot else 0
        if self.sink is None:
            context = [entry]
        elif cached_segments is None:
            if not slot:  # a growing context read without a slot: append a copy, never copy the whole context
                self.recent.append(SoftmaxKV(*(compact(getattr(entry, name)) for name in _KV_FIELDS)))
                self.window = None  # the context is no longer one buffer
                return
            context = self.softmax_context() + [entry]
        elif cached_segments > 0:
            if len(self.recent) == cached_segments and all(_shapes(kv) == _shapes(entry) for kv in self.recent) \
                    and self._slides_in_place(entry, slot_tokens):
                for kv, source in zip(self.recent, self.recent[1:] + [entry]):  # oldest first
                    for name in _KV_FIELDS:
                        if getattr(kv, name) is not None:
                            getattr(kv, name).copy_(getattr(source, name))
                return
            context = [self.sink] + (self.recent + [entry])[-cached_segments:]
        else:
            return  # the sink only
        self._lay_out(context, slot=slot_tokens)

    def _slides_in_place(self, entry: SoftmaxKV, slot_tokens: int) -> bool:
        """Whether `window` holds the context followed by `slot_tokens` free tokens (the steady state)."""
        if self.window is None or self.window.key.shape[2] != self.context_tokens() + slot_tokens:
            return False
        return all((getattr(self.window, name) is None) == (getattr(entry, name) is None) for name in _KV_FIELDS)

    def _lay_out(self, context: list, slot: int) -> None:
        """New `window` buffers holding `context` (SoftmaxKVs, any views) then `slot` free tokens; the sink
        and recent entries become views of them."""
        window, offsets, start = {}, [], 0
        for kv in context:
            offsets.append((start, start + kv.key.shape[2]))
            start += kv.key.shape[2]
        for name in _KV_FIELDS:
            first = getattr(context[0], name)
            if first is None:
                window[name] = None
                continue
            batch, heads, _, dim = first.shape
            buffer = first.new_empty(batch, heads, start + slot, dim)
            for kv, (a, b) in zip(context, offsets):
                buffer[:, :, a:b].copy_(getattr(kv, name))
            window[name] = buffer
        self.window = SoftmaxKV(**window)
        views = [SoftmaxKV(*(None if window[name] is None else window[name][:, :, a:b] for name in _KV_FIELDS))
                 for a, b in offsets]
        self.sink, self.recent = views[0], views[1:]

    def context_tokens(self) -> int:
        """Tokens of the cached segments a new segment attends to."""
        return sum(kv.key.shape[2] for kv in self.softmax_context())

    def window_slot(self, tokens: int) -> Optional[SoftmaxKV]:
        """`window` if its slot takes a call of `tokens` tokens (keys written at `context_tokens()`), else None."""
        if self.window is None or self.window.key.shape[2] != self.context_tokens() + tokens:
            return None
        return self.window

    def keep_ffn_tail(self, spatial: Optional[torch.Tensor], call: SegmentCall) -> None:
        """Cache the last frame of the FFN's spatial output y (B, N, C), (B, 1, S, C): the next
        segment's temporal conv reads it on the left. No-op for FFNs without one (spatial None)."""
        if spatial is not None:
            last = spatial.view(spatial.shape[0], call.num_frames, call.spatial, -1)[:, -1:]
            self.ffn_tail = store(self.ffn_tail, last)

    def nbytes(self) -> int:
        """Memory held by this cache, in bytes."""
        tensors = [self.kv_state, self.z_state, self.cam_state, self.key_tail, self.cam_key_tail, self.ffn_tail]
        for kv in [self.window] if self.window is not None else self.softmax_context():
            tensors += [kv.key, kv.value, kv.cam_key, kv.cam_value]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


_KV_FIELDS = ("key", "value", "cam_key", "cam_value")


def _shapes(kv: SoftmaxKV) -> tuple:
    return tuple(None if t is None else (t.shape, t.dtype) for t in (getattr(kv, name) for name in _KV_FIELDS))


@dataclasses.dataclass
class SegmentCache:
    """Per-block caches of one render, plus the next latent frame the cache expects."""

    blocks: list
    next_frame: int = 0

    @classmethod
    def empty(cls, model) -> "SegmentCache":
        return cls(blocks=[BlockCache() for _ in model.blocks])

    def nbytes(self) -> int:
        return sum(block.nbytes() for block in self.blocks)
