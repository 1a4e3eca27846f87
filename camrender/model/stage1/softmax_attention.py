"""Softmax-block attention of SANA-WM (every 4th block: 3, 7, 11, 15, 19) on the fused kernels, with state passing.

`PatchedSoftmaxAttention.adopt(stock, settings)` takes over a stock `_SoftmaxUCPESinglePathLiteLA`'s
parameters, buffers and sub-modules (no copies: the transformer's `state_dict()` is unchanged):
- main branch: qkv -> `kernels.main_prep` (full-C RMSNorm + RoPE, written straight in the SDPA
  dtype) -> SDPA at head dim D (bf16 on CUDA; cuDNN attention first, then flash, see
  SDPA_BACKENDS); V is read in place from the qkv output.
- camera branch: q/k/v_proj_cam -> `kernels.softmax_cam.cam_softmax_encode` (RMSNorm, UCPE,
  RoPE, RMS downscale, zero-padded to 128, SDPA dtype) -> SDPA -> `cam_softmax_decode` (P,
  inverse RoPE) -> out_proj_cam.
- combine: proj((main + cam) * silu(output_gate(x))) in one pass (`gdn_attention.combine_branches`).
Off CUDA and without TRITON_INTERPRET=1, or under settings backend "torch", the same structure runs on
the PyTorch references.

Full mode (one whole-clip `SegmentCall`, also when called without a `segment`): all N tokens attend
to each other, under the rules of `full_options` (the recipe's, `camrender.model.stage1.patch.set_full_options`).
A block without RMSNorm weights runs the stock forward when those rules are diffusers' (camera scale
1/sqrt(128), camera RMS downscale); a padded-frame mask always runs it. Segment mode
(`segment`, `state`): queries attend to the cached K/V of the first segment (the sink) and of the
`cached_segments` most recent segments, plus their own segment (masked per segment in a call of
several); a writing call stores its K/V in the state.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_sana_wm import _prepare_ucpe_ray_transforms, _SoftmaxUCPESinglePathLiteLA
from torch.nn.attention import SDPBackend, sdpa_kernel

from camrender.kernels.main_prep import main_prep
from camrender.kernels.softmax_cam import cam_softmax_decode, cam_softmax_encode
from camrender.model.adopt import adopt_module
from camrender.model.fp8 import QuantizedRows
from camrender.model.settings import KernelSettings
from camrender.model.stage1.conditioning import stock_rays
from camrender.model.stage1.gdn_attention import combine_branches, input_rows, norm_inv_rms
from camrender.model.stage1.state import FULL_MODE, BlockCache, SegmentCall, SegmentOptions, SoftmaxKV

# SDPA backends in priority order on CUDA (names of torch.nn.attention.SDPBackend), or None for
# PyTorch's own choice. H200, torch 2.11, B=2 N=18480 H=20 bf16: cuDNN attention 12.3 ms vs flash
# 19.4 ms per call at head dim 128; unsupported inputs fall through to the next backend.
SDPA_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def sdpa(q, k, v, *, scale=None, mask=None, backends=SDPA_BACKENDS):
    """F.scaled_dot_product_attention on (B, H, n, D) tensors, on CUDA under the backend priority
    list `backends` (None: PyTorch's own choice). mask: optional bool, True = attend."""
    if backends is None or not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    with sdpa_kernel([getattr(SDPBackend, name) for name in backends], set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def padded_sdpa_scale(head_dim: int) -> float:
    """1 / sqrt(padded head dim), the scale of diffusers' camera SDPA: it zero-pads head dims other
    than FlashAttention's 32/64/128/256 to 128 (or 256) and attends at the padded size's default scale."""
    padded = head_dim if head_dim in (32, 64, 128) or head_dim >= 256 else (128 if head_dim <= 128 else 256)
    return padded ** -0.5


def sdpa_operand_dtype(dtype, override):
    """SDPA operand dtype: the override, else the stock rule (fp32 -> bf16, other dtypes unchanged)."""
    if override is not None:
        return override
    return torch.bfloat16 if dtype == torch.float32 else dtype


def softmax_qkv(attn, x, rope, attn_dtype, backend: str, x_rows=None, key_out=None):
    """Main-branch q, k (full-C RMSNorm, RoPE) and v of softmax-block attention `attn`, each
    (B, H, N, D) in `attn_dtype`. x (B, N, C); rope: diffusers' complex table or None.
    `kernels.main_prep` on `backend` writes q and k straight in `attn_dtype`.
    x_rows: x as qkv reads it (`gdn_attention.input_rows`), or None (x). key_out: a (B, H, N, D) view (a window's
    slot, `window_slots`) k is written into, returned as k."""
    batch, tokens = x.shape[:2]
    heads, dim = attn.heads, attn.dim
    channels = heads * dim  # this rank's heads under the head split, else x's C
    qkv = attn.qkv(x if x_rows is None else x_rows)
    prepped = []
    for raw, norm, into in ((qkv[..., :channels], attn.q_norm, None),
                            (qkv[..., channels:2 * channels], attn.k_norm, key_out)):
        out = torch.empty(batch, tokens, channels, device=x.device, dtype=attn_dtype) if into is None \
            else into.transpose(1, 2)
        prepped.append(main_prep(raw, norm.weight, heads, norm_eps=norm.eps, relu=False, rope=rope, out=out,
                                 inv_rms=norm_inv_rms(norm, raw), backend=backend))
    value = qkv[..., 2 * channels:].to(attn_dtype)
    return tuple(t.reshape(batch, tokens, heads, dim).transpose(1, 2) for t in (*prepped, value))


def camera_encode(attn, x, ray_transforms, attn_dtype, backend: str, downscale: bool = True, kv_out=None):
    """Camera q, k, v of softmax-block attention `attn` after RMSNorm, UCPE and (`downscale`:
    diffusers, NVlabs 40151c8; not NVlabs today) RMS downscale, each (B, H, N, DPAD) in `attn_dtype` (head dim
    zero-padded, `kernels.softmax_cam` on `backend`). kv_out: (B, H, N, DPAD) views (a window's slots,
    `window_slots`) k and v are written into, returned as k and v."""
    query, key = attn.q_proj_cam(x), attn.k_proj_cam(x)
    into = {} if kv_out is None else {"kv_out": tuple(t.transpose(1, 2) for t in kv_out)}
    encoded = cam_softmax_encode(
        query, key, attn.v_proj_cam(x), ray_transforms,
        q_norm_weight=attn.q_norm_cam.weight, k_norm_weight=attn.k_norm_cam.weight,
        norm_eps=attn.q_norm_cam.eps, heads=attn.cam_heads, downscale=downscale, out_dtype=attn_dtype,
        q_inv_rms=norm_inv_rms(attn.q_norm_cam, query), k_inv_rms=norm_inv_rms(attn.k_norm_cam, key),
        backend=backend, **into)
    return tuple(t.transpose(1, 2) for t in encoded)


def camera_decode(attn, o, ray_transforms, dtype, backend: str):
    """Camera SDPA output (B, H, N, DPAD) -> world space (B, N, C) in `dtype` (P, inverse RoPE; `backend`)."""
    return cam_softmax_decode(o, ray_transforms, dim=attn.cam_head_dim, out_dtype=dtype, backend=backend)


def softmax_scale(head_dim: int, rule: str, camera: bool = False) -> Optional[float]:
    """SDPA scale of the main (or camera) attention under a `SegmentOptions.softmax_scale` rule:
    "padded" as NVlabs 40151c8 and diffusers' model (main: SDPA's default, None; camera:
    `padded_sdpa_scale`), "head" 1/sqrt(head dim) in both."""
    if rule == "padded":
        return padded_sdpa_scale(head_dim) if camera else None
    return head_dim ** -0.5


def softmax_mask(call: SegmentCall, device) -> Optional[torch.Tensor]:
    """Bool (N, N) attention pattern of a multi-segment call: a query of segment i sees segment 0,
    segments i - cached_segments .. i - 1, and its own segment. None for a single segment."""
    if len(call.segments) == 1:
        return None
    window = call.options.cached_segments
    seg = call.segment_index(device)
    q_seg, k_seg = seg[:, None], seg[None, :]
    allowed = (k_seg <= q_seg) if window is None else (
        (k_seg == q_seg) | (k_seg == 0) | ((k_seg < q_seg) & (k_seg >= q_seg - window)))
    return allowed.repeat_interleave(call.spatial, 0).repeat_interleave(call.spatial, 1)


def prefix_rows(call: SegmentCall, context: list) -> Optional[list]:
    """With an unbounded window (cached_segments None) a multi-segment call is block-causal: the
    queries of call segment (a, b) see every cached key and the call's keys up to frame b. Returns
    (query start, query stop, key stop) token ranges, one per segment, or None (one segment / a window)."""
    if call.options.cached_segments is not None or len(call.segments) == 1:
        return None
    cached_tokens = sum(kv.key.shape[2] for kv in context)
    return [(a * call.spatial, b * call.spatial, cached_tokens + b * call.spatial) for a, b in call.segments]


def window_slots(window: SoftmaxKV, tokens: int) -> SoftmaxKV:
    """The slots of a window (`BlockCache.window_slot`) for a call of `tokens` tokens: its buffers' last `tokens`
    tokens, (B, H, tokens, D) views (None where the window has no such buffer)."""
    return SoftmaxKV(*(None if buffer is None else buffer[:, :, buffer.shape[2] - tokens:]
                       for buffer in (window.key, window.value, window.cam_key, window.cam_value)))


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are the same view of the same memory (the strides of size-1 dims aside)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and all(
        size == 1 or sa == sb for size, sa, sb in zip(a.shape, a.stride(), b.stride()))


def attend(query, key, value, cached: list, scale, mask, prefixes=None, backends=SDPA_BACKENDS,
           window: Optional[tuple] = None) -> torch.Tensor:
    """SDPA of the call's queries (B, H, n, D) over the cached (key, value) pairs of earlier
    segments followed by the call's own keys and values; with `prefixes` (`prefix_rows`), each
    query row range attends to a prefix of those keys instead (no mask).

    window: (keys, values) buffers (B, H, c + n, D) holding the c cached tokens then a slot for the
    call's n (`BlockCache.window_slot`): the call's keys are written into the slot (unless a kernel wrote them
    there already: `window_slots`) and the buffers attended as they are, in place of concatenating `cached` with
    them."""
    if window is not None:
        for buffer, written in zip(window, (key, value)):
            slot = buffer[:, :, buffer.shape[2] - written.shape[2]:]
            if not _same_view(slot, written):
                slot.copy_(written)
        key, value = window
    elif cached:
        key = torch.cat([k for k, _ in cached] + [key], dim=2)
        value = torch.cat([v for _, v in cached] + [value], dim=2)
    if prefixes is None:
        return sdpa(query, key, value, scale=scale, mask=mask, backends=backends)
    return torch.cat([sdpa(query[:, :, q0:q1], key[:, :, :k1], value[:, :, :k1], scale=scale, backends=backends)
                      for q0, q1, k1 in prefixes], dim=2)


class PatchedSoftmaxAttention(_SoftmaxUCPESinglePathLiteLA):
    """Softmax-block attention on the fused prep / UCPE kernels; x (B, N, C) -> (B, N, C).

    Attributes:
        settings: the model's `KernelSettings` (backend "torch": stock forward in full mode under
            diffusers' rules).
        full_options: full mode's `SegmentOptions` (the recipe's; set by `patch.set_full_options`).
        sdpa_dtype: full mode's SDPA dtype, None (stock rule: fp32 inputs attend in bf16) or a dtype;
            in segment mode `SegmentOptions.sdpa_dtype` takes precedence.
        sdpa_backends: SDPA backend priority (see SDPA_BACKENDS).
    """

    settings: KernelSettings = KernelSettings()
    full_options: SegmentOptions = FULL_MODE
    sdpa_dtype = None
    sdpa_backends = SDPA_BACKENDS

    @classmethod
    def adopt(cls, stock: _SoftmaxUCPESinglePathLiteLA, settings: KernelSettings = KernelSettings()):
        return adopt_module(cls, stock, settings=settings)

    def _on_kernels(self) -> bool:
        """Whether the fused structure computes this block (RMSNorm weights, even head dims)."""
        return (all(getattr(norm, "weight", None) is not None
                    for norm in (self.q_norm, self.k_norm, self.q_norm_cam, self.k_norm_cam))
                and self.dim % 2 == 0 and self.cam_head_dim % 8 == 0)

    def forward(self, x, mask=None, HW=None, rotary_emb=None, block_mask=None, camera_conditions=None,
                chunk_size=None, *, frame_valid_mask=None, ucpe_ray_transforms=None,
                state: Optional[BlockCache] = None, segment: Optional[SegmentCall] = None,
                x_rows: Optional[QuantizedRows] = None):
        call = segment if segment is not None else SegmentCall.whole(HW, self.full_options)
        on_kernels = self._on_kernels()
        # padded-frame masks (training-time batching), and in a call without state a block layout the
        # kernels do not cover under diffusers' rules at diffusers' SDPA dtype: diffusers' own code
        if frame_valid_mask is not None or (not on_kernels and call.stateless(state) and self.sdpa_dtype is None
                                            and call.options.softmax_as_diffusers and call.options.sdpa_dtype is None):
            return super().forward(x, mask, call.grid, rotary_emb, block_mask, camera_conditions, chunk_size,
                                   frame_valid_mask=frame_valid_mask,
                                   ucpe_ray_transforms=stock_rays(ucpe_ray_transforms, x.dtype))
        if not on_kernels:
            raise NotImplementedError("segment mode and recipes other than diffusers' support softmax blocks with "
                                      "RMSNorm weights (the released ones)")
        options = call.options
        rays = ucpe_ray_transforms
        if rays is None and camera_conditions is not None:
            rays = _prepare_ucpe_ray_transforms(head_dim=self.cam_head_dim, camera_conditions=camera_conditions,
                                                HW=call.grid, patch_size=self.patch_size, rotary_emb=rotary_emb)
        backend = self.settings.backend if self.settings.use_triton(x) else "torch"
        attn_dtype = sdpa_operand_dtype(x.dtype, options.sdpa_dtype if options.sdpa_dtype is not None
                                        else self.sdpa_dtype)
        context = [] if state is None else state.softmax_context()
        prefixes = prefix_rows(call, context)
        if context and len(call.segments) > 1 and prefixes is None:
            raise ValueError("a call with several segments starts from a cache only with cached_segments=None")
        attn_mask = None if prefixes is not None else softmax_mask(call, x.device)

        # a single segment after cached ones attends over the cache's window (keys written into its slot)
        window = state.window_slot(x.shape[1]) if context and len(call.segments) == 1 else None
        slots = None if window is None else window_slots(window, x.shape[1])  # the kernels write keys there
        x_rows = input_rows(self, x, x_rows)  # x as qkv and the output gate read it
        query, key, value = softmax_qkv(self, x, rotary_emb, attn_dtype, backend, x_rows,
                                        key_out=None if slots is None else slots.key)
        out = attend(query, key, value, [(kv.key, kv.value) for kv in context],
                     softmax_scale(self.dim, options.softmax_scale), attn_mask, prefixes, self.sdpa_backends,
                     window=None if window is None else (window.key, window.value))
        out = out.transpose(1, 2).reshape(*x.shape[:2], -1).to(x.dtype)  # this rank's heads under the head split

        camera = cam_key = cam_value = None
        if rays is not None:
            cam_slots = None if slots is None or slots.cam_key is None else (slots.cam_key, slots.cam_value)
            cam_query, cam_key, cam_value = camera_encode(self, x, rays, attn_dtype, backend,
                                                          options.softmax_camera_downscale, kv_out=cam_slots)
            cam_window = None if window is None or window.cam_key is None else (window.cam_key, window.cam_value)
            cam_out = attend(cam_query, cam_key, cam_value, [(kv.cam_key, kv.cam_value) for kv in context],
                             softmax_scale(self.cam_head_dim, options.softmax_scale, camera=True), attn_mask,
                             prefixes, self.sdpa_backends, window=cam_window)
            camera = self.out_proj_cam(camera_decode(self, cam_out, rays, x.dtype, backend))

        if call.write:
            state.keep_softmax(SoftmaxKV(key, value, cam_key, cam_value), options.cached_segments, options.key_slot)
        return combine_branches(self, x, out, camera, backend, x_rows)
