"""GDN block attention (`BidirectionalGDNUCPESinglePathLiteLA`) on the fused kernels, with state passing.

`PatchedGDNAttention` adopts a stock module's parameters, buffers and sub-modules (no copies: the
transformer's `state_dict()` is unchanged). Its forward is split into `gdn_gates` (shared by both
branches), `_main_branch` (`kernels.short_conv` + `kernels.main_branch`), `_camera_branch`
(`kernels.camera_branch`) and `combine_branches`. Under FP8 the input linears read x quantized once
(`input_rows`; the block's adaLN glue hands the rows over), and the output gate writes `proj`'s input quantized.

One forward for both modes (settings backend "torch": the kernels' PyTorch references):
- full mode: one segment over the clip, no state (`SegmentCall.whole`, also when called without a
  `segment` as diffusers' block calls it); a block layout the kernels do not cover runs diffusers'
  own code for the main branch and short convs;
- segment mode (`segment`, a `SegmentCall`, and `state`, the block's `BlockCache`): the forward
  scans start from the cached states, reverse scans stay inside each segment of the call; the
  causal halves of the main and camera K short convs read the last K - 1 raw K frames cached
  (their anti-causal halves stay inside the segment). A writing call stores its final states.
Shapes: B batch, T frames of the call, S = h * w, N = T * S tokens, C channels, H heads.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_sana_wm import (
    BidirectionalGDNUCPESinglePathLiteLA,
    _prepare_ucpe_ray_transforms,
)

from camrender.kernels.block_glue import silu_gate
from camrender.kernels.camera_branch import camera_branch
from camrender.kernels.gdn_gates import gdn_gates as fused_gdn_gates
from camrender.kernels.main_branch import main_branch
from camrender.kernels.short_conv import short_conv
from camrender.model.adopt import adopt_module
from camrender.model.fp8 import QuantizedRows, shared_input, takes_quantized
from camrender.model.settings import KernelSettings
from camrender.model.stage1.conditioning import stock_rays
from camrender.model.stage1.state import FULL_MODE, BlockCache, SegmentCall, SegmentOptions, store


# Calls of at most this many frames compute the gates on `kernels.gdn_gates`; longer ones on stock's ops. Measured
# on an H100 (bench/results/2026-12-05_block_glue_gdn_gates_sweep_h100.json): a 3-frame segment 18.6 µs against
# stock's 51.9; the full clip (B=2, 21 frames) was slower on the kernels' first launch (451 µs against 192) and the
# tuned launch is not yet timed there.
FUSED_GATES_MAX_FRAMES = 8


def gdn_gates(attn, x: torch.Tensor, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The GDN gates of block attention `attn`, shared by its main and camera branches (`kernels.gdn_gates`, on
    `attn.settings`' backend and matmul precision; a stock module's `KernelSettings()` otherwise).

    x (B, N, C), N = frames * S. Returns beta (B, H, T, S) = sigmoid(beta_proj(x)) in x's
    dtype, and the per-frame decay (B, H, T) fp32 =
    exp(-exp(A_log) * softplus(gate_proj(mean_s x) + dt_bias)).
    """
    settings = getattr(attn, "settings", KernelSettings())
    negative_rate, dt_bias = decay_constants(attn)
    backend = settings.backend if frames <= FUSED_GATES_MAX_FRAMES else "torch"
    return fused_gdn_gates(x, frames, attn.beta_proj.weight, attn.beta_proj.bias, attn.gate_proj.weight,
                           attn.gate_proj.bias, negative_rate.view(-1), dt_bias.view(-1), backend=backend,
                           matmul_precision=settings.matmul_precision)


def decay_constants(attn) -> tuple:
    """(-exp(A_log), dt_bias) of block attention `attn`, fp32 (1, 1, H) each, as `gdn_gates` computes with them:
    made once per version of the two parameters (kept on the module, out of its state dict), not in every pass.
    Parameters made under inference mode keep no version, and a CUDA-graph capture only records the ops (their
    results exist once it replays): those calls make their own."""
    try:
        key = tuple((p.device, p.data_ptr(), p._version) for p in (attn.A_log, attn.dt_bias))
    except RuntimeError:  # inference tensors
        key = None
    held = attn.__dict__.get("_decay_constants")
    if key is not None and held is not None and held[0] == key:
        return held[1:]
    constants = (-attn.A_log.float().exp().view(1, 1, -1), attn.dt_bias.float().view(1, 1, -1))
    if key is not None and not (attn.A_log.is_cuda and torch.cuda.is_current_stream_capturing()):
        attn.__dict__["_decay_constants"] = (key, *constants)
    return constants


def input_linears(attn) -> list:
    """The linears of block attention `attn` that read its input and may run in FP8: qkv and the output gate.
    (The per-head beta / gate projections and the camera branch's stay bf16: `camrender.model.fp8`.)"""
    gated = attn.use_output_gate and attn.output_gate is not None
    return [attn.qkv] + ([attn.output_gate] if gated else [])


def combine_branches(attn, x, main, camera, backend: str, x_rows=None) -> torch.Tensor:
    """proj((main + camera) * silu(output_gate(x))) of block attention `attn`; camera is already
    through out_proj_cam (or None). backend "torch": the stock computation (bf16 sum, fp32 gate);
    otherwise the sum and gate in one pass (`kernels.block_glue.silu_gate`, stock rounding, that backend), which
    writes the FP8 rows of an FP8 `proj` itself. x_rows: x as the output gate reads it (a `QuantizedRows` under
    FP8, `input_rows`), else x."""
    gated = attn.use_output_gate and attn.output_gate is not None
    x_rows = x if x_rows is None else x_rows
    if backend != "torch" and gated:
        if takes_quantized([attn.proj]):
            q, scale = silu_gate(main, attn.output_gate(x_rows), b=camera, backend=backend, quantize=True)
            return attn.proj(QuantizedRows(q, scale, tuple(main.shape[:-1]), main.dtype))
        return attn.proj(silu_gate(main, attn.output_gate(x_rows), b=camera, backend=backend))
    out = main if camera is None else main + camera
    if gated:
        out = out * F.silu(attn.output_gate(x_rows).to(torch.float32))
    return attn.proj(out.to(x.dtype))


def input_rows(attn, x, x_rows=None):
    """What block attention `attn`'s FP8-able input linears read: `x_rows` (the adaLN glue's quantized rows of x,
    `camrender.model.stage1.block.glue_forward`) when given, else x as `camrender.model.fp8.shared_input` gives
    it to them (quantized once under FP8)."""
    return x_rows if x_rows is not None else shared_input(x, input_linears(attn))


def norm_inv_rms(norm, x: torch.Tensor):
    """(B, N) fp32 1 / RMS per token of x (B, N, ...) for a norm that spans more channels than x
    holds (the head split's `camrender.parallel.heads.SplitRMSNorm`), else None: the kernels then
    take the RMS over x's own channels, as the stock RMSNorm does."""
    inv_rms = getattr(norm, "inv_rms", None)
    return None if inv_rms is None else inv_rms(x)


# ---------------------------------------------------------------------------------------------
# Temporal short convolution, chunk-causal
# ---------------------------------------------------------------------------------------------


def segment_short_conv(conv, x: torch.Tensor, call: SegmentCall, backend: str, *, carry: bool,
                       left: Optional[torch.Tensor] = None, output_final_state: bool = False) -> tuple:
    """SANA-WM's bidirectional depthwise short conv over frames (diffusers
    `SanaWMTemporalShortConvolution`, here `kernels.short_conv`), chunk-causal.

    The anti-causal half stops at the end of each segment of the call. With `carry` the causal
    half reads `left`, the raw frames before the call, and the earlier segments of the call;
    without, each segment is zero-padded on both sides.

    Args:
        conv: the block's `SanaWMTemporalShortConvolution` (weight (C, 1, K)).
        x: (B, N, C) raw projections of the call (channel stride 1; a slice of the qkv output is fine).
        left: (B, L*S, C), L <= K - 1, raw frames right before the call, or None.
        output_final_state: with `carry`, also return the raw frames the next call's causal half reads.
    Returns (out (B, N, C), the last <= K - 1 raw frames (B, L'*S, C) of `left` then x, or None unless
    `carry` and output_final_state).
    """
    spatial = call.spatial
    pieces = []
    for index, (start, stop) in enumerate(call.segments):
        piece = x[:, start * spatial : stop * spatial]
        carried = carry and (output_final_state or index + 1 < len(call.segments))
        out, left = short_conv(piece, conv.weight, stop - start, initial_state=left if carry else None,
                               output_final_state=carried, backend=backend)
        pieces.append(out)
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
    if conv.bias is not None:
        out = out + 2 * conv.bias.to(out.dtype)  # both halves carry the bias in diffusers
    return out, left


def carried_short_conv(conv, raw: torch.Tensor, call: SegmentCall, state: Optional[BlockCache], tail_name: str,
                       backend: str) -> torch.Tensor:
    """`segment_short_conv` whose causal half reads the raw frames cached in `state.<tail_name>`
    ((B, <= K-1, S, C); none without a state); a cache-writing call stores its own last K - 1
    raw frames there."""
    tail = None if state is None else getattr(state, tail_name)
    tail = None if tail is None else tail.flatten(1, 2)
    out, context = segment_short_conv(conv, raw, call, backend, carry=True, left=tail, output_final_state=call.write)
    if call.write:
        setattr(state, tail_name, store(getattr(state, tail_name), context.unflatten(1, (-1, call.spatial))))
    return out


class PatchedGDNAttention(BidirectionalGDNUCPESinglePathLiteLA):
    """GDN block attention on the fused kernels (main branch and camera branch).

    Built only by `adopt(stock, settings)`: it takes over the stock module's parameters, buffers,
    sub-modules and configuration attributes (no copies), so it is a drop-in replacement whose
    `state_dict()` equals the stock one. Input/output as the stock forward: x (B, N, C) -> (B, N, C),
    N = T * h * w tokens, HW = (T, h, w); plus the segment-mode `state` and `segment` (module docstring).
    Full mode computes under `full_options` (the recipe's `SegmentOptions`, `patch.set_full_options`):
    its camera branch always runs `kernels.camera_branch` (the fused kernels or, backend "torch",
    the PyTorch references), which rescales the camera q/k/v only under `gdn_camera_downscale`.
    """

    settings: KernelSettings = KernelSettings()
    full_options: SegmentOptions = FULL_MODE

    @classmethod
    def adopt(cls, stock: BidirectionalGDNUCPESinglePathLiteLA, settings: KernelSettings = KernelSettings()):
        return adopt_module(cls, stock, settings=settings)

    def forward(self, x: torch.Tensor, mask=None, HW=None, rotary_emb=None, block_mask=None, camera_conditions=None,
                chunk_size=None, *, frame_valid_mask=None, ucpe_ray_transforms=None,
                state: Optional[BlockCache] = None, segment: Optional[SegmentCall] = None,
                x_rows: Optional[QuantizedRows] = None) -> torch.Tensor:
        if frame_valid_mask is not None:
            # Padded-frame masking is only used by training-time batching; keep diffusers' path for it.
            return super().forward(x, mask, HW, rotary_emb, block_mask, camera_conditions, chunk_size,
                                   frame_valid_mask=frame_valid_mask,
                                   ucpe_ray_transforms=stock_rays(ucpe_ray_transforms, x.dtype))
        call = segment if segment is not None else SegmentCall.whole(HW, self.full_options)
        x_rows = input_rows(self, x, x_rows)  # x as qkv and the output gate read it
        beta, decay = gdn_gates(self, x, call.num_frames)
        main = self._main_branch(x, beta, decay, rotary_emb, call, state, x_rows)
        rays = ucpe_ray_transforms
        if rays is None and camera_conditions is not None:
            rays = _prepare_ucpe_ray_transforms(head_dim=self.cam_head_dim, camera_conditions=camera_conditions,
                                                HW=call.grid, patch_size=self.patch_size, rotary_emb=rotary_emb)
        camera = None
        if rays is not None:
            camera = self.out_proj_cam(self._camera_branch(x, beta, decay, rays, call, state))
        return self._combine(x, main, camera, x_rows)

    def _combine(self, x, main, camera, x_rows=None) -> torch.Tensor:
        """proj((main + camera) * silu(output_gate(x))), camera through out_proj_cam; `combine_branches`."""
        return combine_branches(self, x, main, camera, self.settings.backend, x_rows)

    def _main_on_kernels(self, rotary_emb) -> bool:
        """Whether the kernels compute this block's main branch: RoPE, RMSNorm weights, no q / v
        short convs (the released layout)."""
        return (rotary_emb is not None and self.conv_q is None and self.conv_v is None
                and getattr(self.q_norm, "weight", None) is not None
                and getattr(self.k_norm, "weight", None) is not None)

    def _main_branch(self, x, beta, decay, rotary_emb, call: SegmentCall, state, x_rows=None) -> torch.Tensor:
        """Main branch: qkv -> short conv on K -> RMSNorm -> ReLU -> bidirectional GDN; (B, N, C) in x's dtype.

        On the kernels: `kernels.short_conv` reads K in place from the qkv output (carrying the
        cached K tail), then `kernels.main_branch` (prep, KV + Z scans from the cached states,
        division); backend "torch": their PyTorch references. A layout the kernels do not cover (or a
        biased K conv) computes on diffusers' code (`self.attn`), in calls that carry no state only.
        """
        on_kernels = self._main_on_kernels(rotary_emb)
        if not (on_kernels and self.conv_k is not None and self.conv_k.bias is None) and call.stateless(state):
            return self._main_branch_stock(x, beta, decay, call.num_frames, rotary_emb)
        if not on_kernels:
            raise NotImplementedError("segment mode supports k_conv_only GDN blocks with RoPE and RMSNorm "
                                      "weights (the released ones)")
        channels = self.heads * self.dim  # this rank's heads under the head split, else x's C
        backend = self.settings.backend
        qkv = self.qkv(x if x_rows is None else x_rows)
        query, key, value = qkv[..., :channels], qkv[..., channels:2 * channels], qkv[..., 2 * channels:]
        if self.conv_k is not None:
            key = carried_short_conv(self.conv_k, key, call, state, "key_tail", backend)
        initial = None if state is None or state.kv_state is None else (state.kv_state, state.z_state)
        out, final_state = main_branch(
            query, key, value, beta, decay, rotary_emb,
            q_norm_weight=self.q_norm.weight, k_norm_weight=self.k_norm.weight, norm_eps=self.q_norm.eps,
            eps=self.attn.eps, initial_state=initial, segment_starts=call.segment_starts(x.device),
            matmul_precision=self.settings.matmul_precision, backend=backend, output_final_state=call.write,
            q_inv_rms=norm_inv_rms(self.q_norm, query), k_inv_rms=norm_inv_rms(self.k_norm, key),
        )
        if call.write:
            state.kv_state, state.z_state = store(state.kv_state, final_state[0]), store(state.z_state, final_state[1])
        return out

    def _main_branch_stock(self, x, beta, decay, frames: int, rotary_emb) -> torch.Tensor:
        """The diffusers main branch (any block layout), (B, N, C) in x's dtype."""
        batch, tokens, channels = x.shape
        shape = (batch, tokens, self.heads, self.dim)
        query, key, value = self.qkv(x).reshape(batch, tokens, 3, self.heads, self.dim).unbind(2)
        if self.conv_q is not None:
            query = self.conv_q(query.reshape(batch, tokens, channels), frames).reshape(shape)
        if self.conv_k is not None:
            key = self.conv_k(key.reshape(batch, tokens, channels), frames).reshape(shape)
        if self.conv_v is not None:
            value = self.conv_v(value.reshape(batch, tokens, channels), frames).reshape(shape)
        query = self.kernel_func(self.q_norm(query.reshape(batch, tokens, channels)).reshape(shape))
        key = self.kernel_func(self.k_norm(key.reshape(batch, tokens, channels)).reshape(shape))
        return self.attn(query, key, value, beta, decay, self.recall_gate, frames, rotary_emb=rotary_emb)

    def _camera_branch(self, x, beta, decay, rays, call: SegmentCall, state) -> torch.Tensor:
        """Camera branch up to (not including) out_proj_cam: (B, N, C) in x's dtype.

        The projections and short convolutions run here; RMSNorm, ReLU, k-scale, UCPE encode,
        RMS downscale (`options.gdn_camera_downscale`), beta discount, both scans (the forward one from
        the cached camera state) and UCPE decode run in `kernels.camera_branch`.
        """
        stateless = call.stateless(state)
        if not stateless and (self.conv_q_cam is not None or self.conv_v_cam is not None):
            raise NotImplementedError("segment mode supports k_conv_only models (the released ones)")
        batch, tokens, _ = x.shape
        frames = call.num_frames
        query, key, value = self.q_proj_cam(x), self.k_proj_cam(x), self.v_proj_cam(x)
        if self.conv_q_cam is not None:
            query = self.conv_q_cam(query, frames)
        if self.conv_k_cam is not None:
            if stateless and self.conv_k_cam.bias is not None:
                key = self.conv_k_cam(key, frames)
            else:
                key = carried_short_conv(self.conv_k_cam, key, call, state, "cam_key_tail", self.settings.backend)
        if self.conv_v_cam is not None:
            value = self.conv_v_cam(value, frames)
        shape = (batch, tokens, self.cam_heads, self.cam_head_dim)
        q_norm, k_norm = self.q_norm_cam, self.k_norm_cam
        out, cam_state = camera_branch(
            query.reshape(shape), key.reshape(shape), value.reshape(shape), beta, decay, rays,
            q_norm_weight=getattr(q_norm, "weight", None), k_norm_weight=getattr(k_norm, "weight", None),
            norm_eps=getattr(q_norm, "eps", 1e-5), initial_state=None if state is None else state.cam_state,
            segment_starts=call.segment_starts(x.device), downscale=call.options.gdn_camera_downscale,
            matmul_precision=self.settings.matmul_precision, backend=self.settings.backend,
            output_final_state=call.write,
            q_inv_rms=norm_inv_rms(q_norm, query), k_inv_rms=norm_inv_rms(k_norm, key),
        )
        if call.write:
            state.cam_state = store(state.cam_state, cam_state)
        return out
