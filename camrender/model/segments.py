"""Chunk-causal, state-cached forward of `SanaWMTransformer3DModel`, one segment of latent frames at a time.

A *segment* is a run of latent frames (`segment_bounds`). Information only flows forward across
segment boundaries, through a per-block cache (`BlockCache`) that the extra timestep-0 pass on a
finished segment writes (`write_cache=True`) and every denoising pass only reads:

- GDN blocks: the forward scans start from the final states of the previous segment (main KV state,
  main Z state, camera KV state); reverse scans stay inside the segment. The causal halves of the main
  and camera K short convs see the last `K - 1` raw K frames of earlier segments; their anti-causal
  halves stay inside the segment (zero-padded).
- Softmax blocks: queries attend to the cached K/V (main K after RoPE, camera K/V after UCPE) of the
  first segment (the sink) and of the `cached_segments` most recent segments (all with None), plus
  their own segment. `SegmentOptions.for_recipe` sets the window, scale and camera arithmetic of a
  checkpoint's recipe (`camrender.model.recipes`).
- FFN temporal conv (kernel 3): the first frame of a segment sees the last frame of the previous
  segment, the last frame sees zero.

`segment_forward` runs the model on a call holding one segment (with a cache) or several segments
(with no cache): the latter, `dense_reference_forward`, is the whole-sequence forward with the same
attention pattern, expressed with reverse-scan restarts and attention masks instead of caches.

The model is read, never modified: every layer call uses the transformer's own submodules.
Shapes: B batch, T latent frames of the call, S = h * w tokens per frame, N = T * S, C channels,
H heads, D head dim. Frame indices are absolute latent-frame indices (RoPE and camera inputs keep
their whole-trajectory positions).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
from diffusers.models.transformers.transformer_sana_wm import _SoftmaxUCPESinglePathLiteLA

from camrender.model.patch import combine_branches, gdn_gates
from camrender.model.block import glue_forward
from camrender.model.softmax_attention import (camera_decode, camera_encode, padded_sdpa_scale, sdpa, sdpa_operand_dtype,
                                     softmax_qkv)
from camrender.model.recipes import segment_bounds
from camrender.model.conditioning import ray_transforms
from camrender.kernels._validate import BACKENDS, check_choice
from camrender.kernels.camera_branch import camera_branch
from camrender.kernels.main_branch import main_branch
from camrender.kernels.short_conv import short_conv, short_conv_context, use_triton

__all__ = [
    "BlockCache",
    "SegmentCache",
    "SegmentOptions",
    "segment_bounds",
    "segment_forward",
    "prepare_conditioning",
    "SegmentConditioning",
    "dense_reference_forward",
]


SOFTMAX_SCALES = ("head", "diffusers")


@dataclasses.dataclass(frozen=True)
class SegmentOptions:
    """How the segment forward computes.

    Attributes:
        cached_segments: recent segments (besides the sink) softmax blocks attend to; None: all.
            The official `num_cached_blocks` n is n - 1 here (`Recipe.recent_chunks`).
        softmax_scale: "head": 1/sqrt(head dim) in the main and camera softmax attention (the
            original streaming code); "diffusers": the camera attention at 1/sqrt(its head dim
            zero-padded to 128), as diffusers' model does (`Recipe.softmax_scale`; docs/recipes.md).
        camera_downscale: scale each UCPE-encoded camera q/k/v back to its pre-UCPE RMS, as
            diffusers' model does; the original code does not (`Recipe.camera_downscale`).
        sdpa_dtype: dtype of the softmax attention; None -> bfloat16 for fp32 activations (as
            diffusers does), the activation dtype otherwise.
        backend: the kernels' `backend`: "torch" (the PyTorch references), "auto" (the Triton
            kernels on CUDA and under TRITON_INTERPRET=1, the references otherwise) or "triton".
        precision: matrix-product precision of the fused kernels, "tf32" or "ieee" (exact fp32).
    """

    cached_segments: Optional[int] = 1
    softmax_scale: str = "head"
    camera_downscale: bool = False
    sdpa_dtype: Optional[torch.dtype] = None
    backend: str = "torch"
    precision: str = "tf32"

    @classmethod
    def for_recipe(cls, recipe, **fields) -> "SegmentOptions":
        """The options of a `camrender.model.recipes.Recipe` (its window, softmax scale and camera
        arithmetic), with `fields` (backend, precision, ...) set or overridden."""
        return cls(**{**dict(cached_segments=recipe.recent_chunks, softmax_scale=recipe.softmax_scale,
                             camera_downscale=recipe.camera_downscale), **fields})


@dataclasses.dataclass
class SoftmaxKV:
    """Keys and values of one segment for a softmax block, (B, H, n, D) each, in the SDPA dtype
    (main K after RoPE, camera K and V after UCPE and RMS downscale)."""

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
    """

    kv_state: Optional[torch.Tensor] = None
    z_state: Optional[torch.Tensor] = None
    cam_state: Optional[torch.Tensor] = None
    key_tail: Optional[torch.Tensor] = None
    cam_key_tail: Optional[torch.Tensor] = None
    sink: Optional[SoftmaxKV] = None
    recent: list = dataclasses.field(default_factory=list)
    ffn_tail: Optional[torch.Tensor] = None

    def softmax_context(self) -> list:
        """Cached segments a new segment's queries attend to: the sink, then the recent ones."""
        return ([self.sink] if self.sink is not None else []) + list(self.recent)

    def nbytes(self) -> int:
        """Memory held by this cache, in bytes."""
        tensors = [self.kv_state, self.z_state, self.cam_state, self.key_tail, self.cam_key_tail, self.ffn_tail]
        for kv in self.softmax_context():
            tensors += [kv.key, kv.value, kv.cam_key, kv.cam_value]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


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


# ---------------------------------------------------------------------------------------------
# Call context: which segments one forward call holds and what it reads from / writes to
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Call:
    """Layout of one forward call. `segments` are (start, stop) frame ranges relative to the call;
    `backend` the kernels' backend argument (`SegmentOptions.backend`)."""

    num_frames: int
    height: int
    width: int
    segments: list
    write: bool
    backend: str = "torch"

    @property
    def spatial(self) -> int:
        return self.height * self.width

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


# ---------------------------------------------------------------------------------------------
# Small shared operations
# ---------------------------------------------------------------------------------------------


def _has_weights(*norms) -> bool:
    """Whether every norm is an RMSNorm with a weight (the layout the fused prep kernels take)."""
    return all(getattr(norm, "weight", None) is not None for norm in norms)


def _rope_for_frames(rope_module, frame_start: int, num_frames: int, height: int, width: int, device):
    """Complex RoPE table (1, 1, N, D/2) of latent frames [frame_start, frame_start + num_frames),
    equal to the matching rows of the whole-trajectory table `rope_module((T, h, w))`."""
    head_dim = rope_module.attention_head_dim
    if frame_start + num_frames > rope_module.max_seq_len:
        raise ValueError(
            f"latent frame {frame_start + num_frames - 1} is past the model's RoPE table "
            f"({rope_module.max_seq_len} frames)"
        )
    freqs_t, freqs_h, freqs_w = rope_module.freqs.to(device).split_with_sizes(
        [head_dim // 2 - 2 * (head_dim // 6), head_dim // 6, head_dim // 6], dim=1
    )
    shape = (num_frames, height, width)
    freqs = torch.cat(
        [
            freqs_t[frame_start : frame_start + num_frames].view(num_frames, 1, 1, -1).expand(*shape, -1),
            freqs_h[:height].view(1, height, 1, -1).expand(*shape, -1),
            freqs_w[:width].view(1, 1, width, -1).expand(*shape, -1),
        ],
        dim=-1,
    )
    return freqs.reshape(1, 1, num_frames * height * width, -1)


# ---------------------------------------------------------------------------------------------
# Temporal convolutions
# ---------------------------------------------------------------------------------------------


def _short_conv(conv, x: torch.Tensor, call: _Call, *, carry: bool, left: Optional[torch.Tensor] = None):
    """SANA-WM's bidirectional depthwise short conv over frames (diffusers
    `SanaWMTemporalShortConvolution`, here `kernels.short_conv`), chunk-causal.

    The anti-causal half stops at the end of each segment of the call. With `carry` (main K) the
    causal half reads `left`, the raw frames before the call, and the earlier segments of the call;
    without (camera K) each segment is zero-padded on both sides.

    Args:
        conv: the block's `SanaWMTemporalShortConvolution` (weight (C, 1, K)).
        x: (B, N, C) raw projections of the call (channel stride 1; a slice of the qkv output is fine).
        left: (B, L*S, C), L <= K - 1, raw frames right before the call, or None.
    Returns (B, N, C).
    """
    spatial = call.spatial
    pieces = []
    for index, (start, stop) in enumerate(call.segments):
        piece = x[:, start * spatial : stop * spatial]
        pieces.append(short_conv(piece, conv.weight, stop - start, left_context=left if carry else None,
                                 backend=call.backend))
        if carry and index + 1 < len(call.segments):
            left = short_conv_context(piece, stop - start, left, frames=conv.kernel_size - 1)
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
    if conv.bias is not None:
        out = out + 2 * conv.bias.to(out.dtype)  # both halves carry the bias in diffusers
    return out


def _carried_short_conv(conv, raw, call: _Call, cache: "BlockCache", tail_name: str) -> torch.Tensor:
    """`_short_conv` whose causal half reads the raw frames cached in `cache.<tail_name>`
    ((B, <= K-1, S, C)); a cache-writing call stores its own last K - 1 raw frames there."""
    tail = getattr(cache, tail_name)
    tail = None if tail is None else tail.flatten(1, 2)
    out = _short_conv(conv, raw, call, carry=True, left=tail)
    if call.write:
        context = short_conv_context(raw, call.num_frames, tail, frames=conv.kernel_size - 1)
        setattr(cache, tail_name, _compact(context).unflatten(1, (-1, call.spatial)))
    return out


# ---------------------------------------------------------------------------------------------
# Attention: GDN block (main + camera branch) and softmax block
# ---------------------------------------------------------------------------------------------


def _gdn_main(attn, x, beta, decay, rope, call: _Call, cache: BlockCache, precision) -> torch.Tensor:
    """Main GDN branch -> (B, N, C) before the output gate: RoPE'd numerator (KV) and unrotated
    denominator (Z) streams, forward from the cached states, reverse inside each segment."""
    channels = x.shape[-1]
    frames, spatial = call.num_frames, call.spatial
    if attn.conv_q is not None or attn.conv_v is not None:
        raise NotImplementedError("segment mode supports k_conv_only models (the released ones)")
    qkv = attn.qkv(x)
    query, key, value = qkv[..., :channels], qkv[..., channels:2 * channels], qkv[..., 2 * channels:]
    if attn.conv_k is not None:
        key = _carried_short_conv(attn.conv_k, key, call, cache, "key_tail")

    if rope is None or not _has_weights(attn.q_norm, attn.k_norm):
        raise NotImplementedError("segment mode supports GDN blocks with RoPE and RMSNorm weights (the released ones)")
    initial = None if cache.kv_state is None else (cache.kv_state, cache.z_state)
    out, (kv_state, z_state) = main_branch(
        query, key, value, beta, decay, rope,
        q_norm_weight=attn.q_norm.weight, k_norm_weight=attn.k_norm.weight, norm_eps=attn.q_norm.eps,
        eps=attn.attn.eps, initial_state=initial, segment_starts=call.segment_starts(x.device), precision=precision,
        backend=call.backend, return_final_state=True,
    )
    if call.write:
        cache.kv_state, cache.z_state = kv_state.detach(), z_state.detach()
    return out


def _gdn_camera(attn, x, beta, decay, rays, call: _Call, cache: BlockCache, options: SegmentOptions) -> torch.Tensor:
    """UCPE camera branch of a GDN block -> (B, N, C) before `out_proj_cam` (`kernels.camera_branch`):
    numerator-only delta rule in ray space, forward from the cached camera state, reverse inside
    each segment. The camera short conv is segment-local."""
    if attn.conv_q_cam is not None or attn.conv_v_cam is not None:
        raise NotImplementedError("segment mode supports k_conv_only models (the released ones)")
    batch, tokens, _ = x.shape
    shape = (batch, tokens, attn.cam_heads, attn.cam_head_dim)
    query, key, value = attn.q_proj_cam(x), attn.k_proj_cam(x), attn.v_proj_cam(x)
    if attn.conv_k_cam is not None:
        key = _carried_short_conv(attn.conv_k_cam, key, call, cache, "cam_key_tail")
    out, cam_state = camera_branch(
        query.reshape(shape),
        key.reshape(shape),
        value.reshape(shape),
        beta,
        decay,
        rays,
        q_norm_weight=getattr(attn.q_norm_cam, "weight", None),
        k_norm_weight=getattr(attn.k_norm_cam, "weight", None),
        norm_eps=getattr(attn.q_norm_cam, "eps", 1e-5),
        initial_state=cache.cam_state,
        segment_starts=call.segment_starts(x.device),
        downscale=options.camera_downscale,
        precision=options.precision,
        backend=call.backend,
        return_final_state=True,
    )
    if call.write:
        cache.cam_state = cam_state.detach()
    return out


def _gdn_attention(attn, x, rope, rays, call: _Call, cache: BlockCache, options: SegmentOptions):
    """`BidirectionalGDNUCPESinglePathLiteLA.forward`, chunk-causal. x (B, N, C) -> (B, N, C)."""
    beta, decay = gdn_gates(attn, x, call.num_frames, call.spatial)
    out = _gdn_main(attn, x, beta, decay, rope, call, cache, options.precision)
    camera = None
    if rays is not None:
        camera = attn.out_proj_cam(_gdn_camera(attn, x, beta, decay, rays, call, cache, options))
    return combine_branches(attn, x, out, camera, call.backend)


def _softmax_mask(call: _Call, options: SegmentOptions, device) -> Optional[torch.Tensor]:
    """Bool (N, N) attention pattern of a multi-segment call: a query of segment i sees segment 0,
    segments i - cached_segments .. i - 1, and its own segment. None for a single segment."""
    if len(call.segments) == 1:
        return None
    seg = call.segment_index(device)
    q_seg, k_seg = seg[:, None], seg[None, :]
    allowed = (k_seg <= q_seg) if options.cached_segments is None else (
        (k_seg == q_seg) | (k_seg == 0) | ((k_seg < q_seg) & (k_seg >= q_seg - options.cached_segments)))
    return allowed.repeat_interleave(call.spatial, 0).repeat_interleave(call.spatial, 1)


def _softmax_scale(head_dim: int, options: SegmentOptions, camera: bool = False) -> float:
    """SDPA scale of the main (or camera) attention under `options.softmax_scale`."""
    check_choice("softmax_scale", options.softmax_scale, SOFTMAX_SCALES)
    return padded_sdpa_scale(head_dim) if camera and options.softmax_scale == "diffusers" else head_dim ** -0.5


def _attend(query, key, value, cached: list, scale: float, mask, prefixes=None) -> torch.Tensor:
    """SDPA of the call's queries (B, H, n, D) over the cached (key, value) pairs of earlier
    segments followed by the call's own keys and values; with `prefixes` (`_prefix_rows`), each
    query row range attends to a prefix of those keys instead (no mask)."""
    keys = torch.cat([k for k, _ in cached] + [key], dim=2)
    values = torch.cat([v for _, v in cached] + [value], dim=2)
    if prefixes is None:
        return sdpa(query, keys, values, scale=scale, mask=mask)
    return torch.cat([sdpa(query[:, :, q0:q1], keys[:, :, :k1], values[:, :, :k1], scale=scale)
                      for q0, q1, k1 in prefixes], dim=2)


def _prefix_rows(call: _Call, options: SegmentOptions, context: list) -> Optional[list]:
    """With an unbounded window (cached_segments None) a multi-segment call is block-causal: the
    queries of call segment (a, b) see every cached key and the call's keys up to frame b. Returns
    (query start, query stop, key stop) token ranges, one per segment, or None (one segment / a window)."""
    if options.cached_segments is not None or len(call.segments) == 1:
        return None
    cached_tokens = sum(kv.key.shape[2] for kv in context)
    return [(a * call.spatial, b * call.spatial, cached_tokens + b * call.spatial) for a, b in call.segments]


def _softmax_attention(attn, x, rope, rays, call: _Call, cache: BlockCache, options: SegmentOptions):
    """`_SoftmaxUCPESinglePathLiteLA.forward`, chunk-causal: queries of the call attend to the cached
    sink / recent segments and to the call's own keys (masked per segment). x (B, N, C) -> (B, N, C)."""
    batch, tokens, channels = x.shape
    if not _has_weights(attn.q_norm, attn.k_norm, attn.q_norm_cam, attn.k_norm_cam):
        raise NotImplementedError("segment mode supports softmax blocks with RMSNorm weights (the released ones)")
    sdpa_dtype = sdpa_operand_dtype(x.dtype, options.sdpa_dtype)
    triton = use_triton(x, call.backend)
    context = cache.softmax_context()
    prefixes = _prefix_rows(call, options, context)
    if context and len(call.segments) > 1 and prefixes is None:
        raise ValueError("a call with several segments starts from a cache only with cached_segments=None")
    mask = None if prefixes is not None else _softmax_mask(call, options, x.device)

    query, key, value = softmax_qkv(attn, x, rope, sdpa_dtype, triton)
    out = _attend(query, key, value, [(kv.key, kv.value) for kv in context],
                  _softmax_scale(attn.dim, options), mask, prefixes)
    out = out.transpose(1, 2).reshape(batch, tokens, channels).to(x.dtype)

    cam_out = cam_key = cam_value = None
    if rays is not None:
        cam_query, cam_key, cam_value = camera_encode(attn, x, rays, sdpa_dtype, triton, options.camera_downscale)
        cam_out = _attend(cam_query, cam_key, cam_value, [(kv.cam_key, kv.cam_value) for kv in context],
                          _softmax_scale(attn.cam_head_dim, options, camera=True), mask, prefixes)
        cam_out = attn.out_proj_cam(camera_decode(attn, cam_out, rays, x.dtype, triton))

    if call.write:
        entry = SoftmaxKV(*(_compact(t) for t in (key, value, cam_key, cam_value)))
        if cache.sink is None:
            cache.sink = entry
        elif options.cached_segments is None:
            cache.recent.append(entry)
        elif options.cached_segments > 0:
            cache.recent = (cache.recent + [entry])[-options.cached_segments :]

    return combine_branches(attn, x, out, cam_out, call.backend)


def _compact(t):
    """A cache-owned copy: never a view that would keep a whole projection buffer alive."""
    return None if t is None else t.detach().clone(memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------------------------------
# Block and model
# ---------------------------------------------------------------------------------------------


def _block_forward(block, x, y, y_mask, modulation, rope, rays, plucker, call, cache, options):
    """`SanaVideoMSCamCtrlBlock.forward` (no frame-valid mask), chunk-causal.

    x (B, N, C); y (B, 1, L, C) text; modulation (B, 1, T, 6C) per-frame adaLN input.
    """
    if isinstance(block.attn, _SoftmaxUCPESinglePathLiteLA):
        def attend(attn_in):
            return _softmax_attention(block.attn, attn_in, rope, rays, call, cache, options)
    else:
        def attend(attn_in):
            return _gdn_attention(block.attn, attn_in, rope, rays, call, cache, options)
    # the glue kernels run wherever the branch kernels do
    x, spatial = glue_forward(block, x, y, y_mask, modulation, (call.num_frames, call.height, call.width), attend,
                              plucker, call.backend, left=cache.ffn_tail, segments=call.segments)
    if call.write:
        _keep_ffn_tail(cache, spatial, call)
    return x


def _keep_ffn_tail(cache: BlockCache, spatial, call: _Call) -> None:
    """Cache the last frame of the FFN's spatial output y (B, N, C), (B, 1, S, C): the next
    segment's temporal conv reads it on the left. No-op for FFNs without one (spatial None)."""
    if spatial is not None:
        cache.ffn_tail = spatial.view(spatial.shape[0], call.num_frames, call.spatial, -1)[:, -1:].detach().clone()


@dataclasses.dataclass
class SegmentConditioning:
    """Inputs of a call that stay fixed over its denoising steps (compute once per segment).

    rope: complex (1, 1, N, D/2) RoPE rows of the call's absolute frames, or None; rays:
    (P, P_T, P_inv, RoPE_cam) UCPE transforms, or None (no camera); raymap: (B, N, C) absmap
    embedding added to the input (models without Plucker inputs), or None; plucker: (B, N, C)
    embedded Plucker maps for the blocks, or None; plucker_input: the same when added to the input;
    text: (B, 1, L, C) embedded, normed text; text_mask: (B, L) int16.
    """

    frame_start: int
    num_frames: int
    rope: Optional[torch.Tensor]
    rays: Optional[tuple]
    raymap: Optional[torch.Tensor]
    plucker: Optional[torch.Tensor]
    plucker_input: Optional[torch.Tensor]
    text: torch.Tensor
    text_mask: torch.Tensor


def prepare_conditioning(
    model,
    grid: tuple,
    encoder_hidden_states: torch.Tensor,
    encoder_attention_mask: torch.Tensor,
    *,
    camera_conditions: Optional[torch.Tensor] = None,
    chunk_plucker: Optional[torch.Tensor] = None,
    frame_start: int = 0,
) -> SegmentConditioning:
    """Embed the text, camera and positions of latent frames [frame_start, frame_start + T).

    grid: (T, h, w) after patching; other arguments as `segment_forward`.
    """
    frames, height, width = grid
    dtype = model.dtype
    device = encoder_hidden_states.device
    rope = _rope_for_frames(model.rope, frame_start, frames, height, width, device) if model.use_pe else None
    rays = raymap = plucker = plucker_input = None
    if camera_conditions is not None:
        rays, absmap = ray_transforms(model, camera_conditions, grid, rope)
        if not (model.use_chunk_plucker_input or model.use_chunk_plucker_post_attn):
            raymap = model.raymap_embedder(absmap.permute(0, 4, 1, 2, 3).to(dtype))
    if chunk_plucker is not None and (model.use_chunk_plucker_input or model.use_chunk_plucker_post_attn):
        embedded = model.plucker_embedder(chunk_plucker.to(dtype))
        plucker_input = embedded if model.use_chunk_plucker_input else None
        plucker = embedded if model.use_chunk_plucker_post_attn else None

    text = model.y_embedder(encoder_hidden_states.to(dtype))
    if model.y_norm:
        text = model.attention_y_norm(text)
    text_mask = encoder_attention_mask.to(torch.int16)
    if text_mask.shape[0] != text.shape[0]:
        text_mask = text_mask.repeat(text.shape[0] // text_mask.shape[0], 1)
    text_mask = text_mask.squeeze(1).squeeze(1)
    return SegmentConditioning(frame_start, frames, rope, rays, raymap, plucker, plucker_input, text, text_mask)


def segment_forward(
    model,
    hidden_states: torch.Tensor,
    timestep: torch.Tensor,
    encoder_hidden_states: Optional[torch.Tensor] = None,
    encoder_attention_mask: Optional[torch.Tensor] = None,
    *,
    camera_conditions: Optional[torch.Tensor] = None,
    chunk_plucker: Optional[torch.Tensor] = None,
    frame_start: int = 0,
    cache: Optional[SegmentCache] = None,
    write_cache: bool = False,
    segments: Optional[Sequence[tuple]] = None,
    options: SegmentOptions = SegmentOptions(),
    conditioning: Optional[SegmentConditioning] = None,
) -> torch.Tensor:
    """Run `model` (a `SanaWMTransformer3DModel`) on latent frames [frame_start, frame_start + T).

    Args:
        hidden_states: (B, C_lat, T, h, w) latents of the call.
        timestep: (B, 1, T) or (B, T) per-frame timesteps in [0, 1000] (truncated to integers).
        encoder_hidden_states: (B, 1, L, C_text) text embeddings; encoder_attention_mask (B, L).
        camera_conditions: (B, T, 20) rows [frame_start, frame_start + T) of the whole trajectory's
            conditions (poses relative to global frame 0), or None (no camera branch).
        chunk_plucker: (B, 48, T, h, w) rows of the whole trajectory's Plucker maps, or None.
        frame_start: absolute index of the first latent frame (RoPE positions).
        cache: the render's `SegmentCache` (None: start from nothing, write nothing).
        write_cache: store this call's states / keys / tails in `cache` (the timestep-0 pass on a
            finished segment). Requires a single-segment call.
        segments: (start, stop) frame ranges relative to the call; default one segment.
        options: `SegmentOptions`.
        conditioning: `prepare_conditioning`'s result for this call, reused across denoising
            steps; when given, the text / camera / Plucker arguments are not read.

    Returns:
        (B, C_lat, T, h, w) model output (flow prediction), in the model's dtype.
    """
    if getattr(model, "pack_latents", False):
        raise NotImplementedError("packed latents are not supported in segment mode")
    if model.timestep_norm_scale_factor != 1.0:
        raise NotImplementedError("timestep_norm_scale_factor != 1 is not used by SANA-WM")
    dtype = model.dtype
    batch = hidden_states.shape[0]
    p_t, p_h, p_w = model.patch_size
    grid = (hidden_states.shape[2] // p_t, hidden_states.shape[3] // p_h, hidden_states.shape[4] // p_w)
    frames, height, width = grid
    segments = [tuple(s) for s in (segments or [(0, frames)])]
    if segments[0][0] != 0 or segments[-1][1] != frames or any(a[1] != b[0] for a, b in zip(segments, segments[1:])):
        raise ValueError(f"segments {segments} must tile the {frames} frames of the call")
    if write_cache and (cache is None or len(segments) != 1):
        raise ValueError("write_cache needs a cache and a single-segment call")
    if cache is not None and cache.next_frame != frame_start:
        raise ValueError(f"cache expects latent frame {cache.next_frame}, call starts at {frame_start}")
    if conditioning is None:
        conditioning = prepare_conditioning(
            model, grid, encoder_hidden_states, encoder_attention_mask,
            camera_conditions=camera_conditions, chunk_plucker=chunk_plucker, frame_start=frame_start,
        )
    elif (conditioning.frame_start, conditioning.num_frames) != (frame_start, frames):
        raise ValueError("conditioning was prepared for other frames")
    check_choice("backend", options.backend, BACKENDS)
    call = _Call(frames, height, width, segments, write_cache, options.backend)
    block_caches = cache.blocks if cache is not None else [BlockCache() for _ in model.blocks]

    x = model.x_embedder(hidden_states.to(dtype))
    if conditioning.raymap is not None:
        x = x + conditioning.raymap
    if conditioning.plucker_input is not None:
        x = x + conditioning.plucker_input

    timestep = timestep.reshape(batch, 1, -1).long().to(torch.float32)
    t = model.t_embedder(model.time_proj(timestep.flatten()).to(dtype))
    modulation = model.t_block(t).unflatten(0, timestep.shape)
    t = t.unflatten(0, timestep.shape)

    for block, block_cache in zip(model.blocks, block_caches):
        x = _block_forward(block, x, conditioning.text, conditioning.text_mask, modulation, conditioning.rope,
                           conditioning.rays, conditioning.plucker, call, block_cache, options)

    x = model.final_layer(x, t)
    if write_cache:
        cache.next_frame = frame_start + frames
    return model.unpatchify(x, frames, height, width)


def dense_reference_forward(
    model,
    hidden_states: torch.Tensor,
    timestep: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    encoder_attention_mask: torch.Tensor,
    *,
    segments: Sequence[tuple],
    camera_conditions: Optional[torch.Tensor] = None,
    chunk_plucker: Optional[torch.Tensor] = None,
    options: SegmentOptions = SegmentOptions(),
) -> torch.Tensor:
    """Whole-sequence forward with the chunk-causal pattern and no cache (the reference the cached
    segment-by-segment forward must equal): reverse scans restart at every segment, the short conv's
    anti-causal half and the FFN temporal conv stop at segment ends, and softmax attention is masked
    so that segment i sees segment 0, the `cached_segments` segments before it, and itself.

    Pass timestep 0 on the frames of finished segments to reproduce what their cache passes saw.
    Shapes as `segment_forward` with T the whole sequence; `segments` tile [0, T).
    """
    return segment_forward(
        model,
        hidden_states,
        timestep,
        encoder_hidden_states,
        encoder_attention_mask,
        camera_conditions=camera_conditions,
        chunk_plucker=chunk_plucker,
        frame_start=0,
        cache=None,
        segments=segments,
        options=options,
    )
