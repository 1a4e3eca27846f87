"""Chunk-causal, state-cached forward of `SanaWMTransformer3DModel`, one segment of latent frames at a time.

A *segment* is a run of latent frames (`segment_bounds`). Information only flows forward across
segment boundaries, through a per-block cache (`BlockCache`, `camrender.model.stage1.state`) that the
extra timestep-0 pass on a finished segment writes (`write_cache=True`) and every denoising pass
only reads. `segment_forward` embeds the inputs, calls the patched blocks (the same modules full
mode runs, `camrender.model.stage1.block.PatchedBlock`) with each block's cache and a `SegmentCall`
describing the call, and applies the final layer; what each block carries is described in
`gdn_attention`, `softmax_attention` and `ffn` (the FFN temporal conv's first frame sees the
last frame of the previous segment). `SegmentOptions.for_recipe` sets the window, scale and
camera arithmetic of a checkpoint's recipe (`camrender.model.stage1.recipes`); the kernels' backend and
matmul precision are the model's own (`patch_transformer`).

`segment_forward` runs the model on a call holding one segment (with a cache) or several segments
(with no cache): the latter, `dense_reference_forward`, is the whole-sequence forward with the same
attention pattern, expressed with reverse-scan restarts and attention masks instead of caches.

Shapes: B batch, T latent frames of the call, S = h * w tokens per frame, N = T * S, C channels,
H heads, D head dim. Frame indices are absolute latent-frame indices (RoPE and camera inputs keep
their whole-trajectory positions).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

from camrender.model.device import to_device
from camrender.model.stage1.block import PatchedBlock, plucker_projections
from camrender.model.stage1.conditioning import ray_transforms
from camrender.model.stage1.recipes import segment_bounds
from camrender.model.stage1.state import BlockCache, SegmentCache, SegmentCall, SegmentOptions, SoftmaxKV

__all__ = [
    "BlockCache",
    "SoftmaxKV",
    "SegmentCache",
    "SegmentOptions",
    "segment_bounds",
    "segment_forward",
    "prepare_conditioning",
    "plucker_projections",
    "SegmentConditioning",
    "dense_reference_forward",
]


def _rope_for_frames(rope_module, frame_start: int, num_frames: int, height: int, width: int, device):
    """Complex RoPE table (1, 1, N, D/2) of latent frames [frame_start, frame_start + num_frames),
    equal to the matching rows of the whole-trajectory table `rope_module((T, h, w))`."""
    head_dim = rope_module.attention_head_dim
    if frame_start + num_frames > rope_module.max_seq_len:
        raise ValueError(
            f"latent frame {frame_start + num_frames - 1} is past the model's RoPE table "
            f"({rope_module.max_seq_len} frames)"
        )
    freqs_t, freqs_h, freqs_w = _freqs_on(rope_module, device).split_with_sizes(
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


def _freqs_on(rope_module, device) -> torch.Tensor:
    """The RoPE module's frequency table (a plain attribute, which diffusers leaves on the CPU when the model
    moves) on `device`, copied once per device and kept on the module (`to_device`: the copy does not wait for
    the GPU's queue)."""
    device = torch.device(device)
    freqs = rope_module.freqs
    if freqs.device == device:
        return freqs
    held = getattr(rope_module, "_camrender_freqs", None)  # (source table, device, copy)
    if held is None or held[0] is not freqs or held[1] != device:
        held = (freqs, device, to_device(freqs, device))
        rope_module._camrender_freqs = held
    return held[2]


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
        embeds_absmap = not (model.use_chunk_plucker_input or model.use_chunk_plucker_post_attn)
        rays, absmap = ray_transforms(model, camera_conditions, grid, rope, absmap=embeds_absmap)
        if embeds_absmap:
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
    text_keys: Optional[list] = None,
    projected_plucker: Optional[list] = None,
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
        options: `SegmentOptions` (the recipe's rules; backend and matmul precision are the model's
            `KernelSettings`, set by `patch_transformer`).
        conditioning: `prepare_conditioning`'s result for this call, reused across denoising
            steps; when given, the text / camera / Plucker arguments are not read.
        text_keys: each block's cross-attention keys of the conditioning's text
            (`camrender.model.stage1.block.prepared_text`, None for a block that computes its own), reused
            over a render; None: every block computes them from the text.
        projected_plucker: each block's Plucker projection of the conditioning's maps (`plucker_projections`),
            reused over the passes on the same frames; None: every block projects them itself.

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
    if not all(isinstance(block, PatchedBlock) for block in model.blocks):
        raise ValueError("segment mode runs the patched blocks: patch the transformer first "
                         "(camrender.patch_transformer)")
    call = SegmentCall(frames, height, width, tuple(segments), write_cache, options)
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

    text_keys = text_keys or [None] * len(model.blocks)
    projected_plucker = projected_plucker or [None] * len(model.blocks)
    for block, block_cache, keys, projected in zip(model.blocks, block_caches, text_keys, projected_plucker,
                                                   strict=True):
        x = block(x, conditioning.text, modulation, conditioning.text_mask, rotary_emb=conditioning.rope,
                  ucpe_ray_transforms=conditioning.rays, plucker_emb=conditioning.plucker,
                  state=block_cache, segment=call, text_keys=keys, projected_plucker=projected)

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
