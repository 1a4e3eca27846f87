"""Swap the attention of SANA-WM's blocks for modules that run the fused Triton kernels.

`patch_transformer(transformer)` walks `transformer.blocks` and replaces each block's
attention by a patched module that adopts the original's parameters, buffers and
sub-modules: the transformer's `state_dict()` keys and tensors are unchanged (same storage),
so weights load, save and offload exactly as before.

GDN blocks (`BidirectionalGDNUCPESinglePathLiteLA`) become `PatchedGDNAttention`, whose
forward is split into `_gates`, `_main_branch` (`kernels.short_conv` + `kernels.main_branch`),
`_camera_branch` (`kernels.camera_branch`) and `_combine`. Softmax blocks become
`camrender.model.softmax_attention.PatchedSoftmaxAttention`. The blocks themselves become
`camrender.model.block.PatchedBlock` (adaLN glue and cross-attention; FFN via `camrender.model.ffn`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_sana_wm import (
    BidirectionalGDNUCPESinglePathLiteLA,
    GLUMBConvTemp,
    _prepare_ucpe_ray_transforms,
    _SoftmaxUCPESinglePathLiteLA,
)

KERNEL_CHOICES = ("fused", "torch")
PRECISION_CHOICES = ("tf32", "ieee")


def gdn_gates(attn, x: torch.Tensor, frames: int, spatial: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The GDN gates of block attention `attn`, shared by its main and camera branches.

    x (B, N, C), N = frames * spatial. Returns beta (B, H, T, S) = sigmoid(beta_proj(x)) in x's
    dtype, and the per-frame decay (B, H, T) fp32 =
    exp(-exp(A_log) * softplus(gate_proj(mean_s x) + dt_bias)).
    """
    batch, _, channels = x.shape
    beta = attn.beta_proj(x).sigmoid().reshape(batch, frames, spatial, attn.heads).permute(0, 3, 1, 2)
    frame_mean = x.reshape(batch, frames, spatial, channels).mean(dim=2)
    gate = attn.gate_proj(frame_mean).float()
    rate = attn.A_log.float().exp().view(1, 1, -1)
    decay = (-rate * F.softplus(gate + attn.dt_bias.float().view(1, 1, -1))).exp().transpose(1, 2)
    return beta, decay


def combine_branches(attn, x, main, camera, backend: str) -> torch.Tensor:
    """proj((main + camera) * silu(output_gate(x))) of block attention `attn`; camera is already
    through out_proj_cam (or None). backend "torch": the stock computation (bf16 sum, fp32 gate);
    otherwise the sum and gate in one pass (`kernels.block_glue.silu_gate`, stock rounding, that backend)."""
    gated = attn.use_output_gate and attn.output_gate is not None
    if backend != "torch" and gated:
        from camrender.kernels.block_glue import silu_gate

        return attn.proj(silu_gate(main, attn.output_gate(x), b=camera, backend=backend))
    out = main if camera is None else main + camera
    if gated:
        out = out * F.silu(attn.output_gate(x).to(torch.float32))
    return attn.proj(out.to(x.dtype))


def adopt_module(cls, stock: torch.nn.Module, **settings) -> torch.nn.Module:
    """An instance of `cls` that takes over `stock`'s parameters, buffers, sub-modules and
    attributes (the same tensors, no copies), with `settings` set as attributes."""
    patched = cls.__new__(cls)
    state = dict(stock.__dict__)
    # Fresh containers holding the same tensors/modules, so the two objects never alias dicts.
    for container in ("_parameters", "_buffers", "_modules"):
        state[container] = type(state[container])(state[container])
    state["_non_persistent_buffers_set"] = set(state["_non_persistent_buffers_set"])
    patched.__dict__.update(state)
    for name, value in settings.items():
        setattr(patched, name, value)
    return patched


# `kernels` choice -> the kernels' `backend` argument (and segment mode's). "auto" runs Triton on
# CUDA and under TRITON_INTERPRET=1, and the PyTorch references otherwise (the CPU rendering path).
KERNEL_BACKENDS = {"fused": "auto", "torch": "torch"}


class PatchedGDNAttention(BidirectionalGDNUCPESinglePathLiteLA):
    """GDN block attention on the fused kernels (main branch and camera branch).

    Built only by `adopt(stock, ...)`: it takes over the stock module's parameters, buffers,
    sub-modules and configuration attributes (no copies), so it is a drop-in replacement
    whose `state_dict()` equals the stock one. Input/output as the stock forward:
    x (B, N, C) -> (B, N, C), N = T * h * w tokens, HW = (T, h, w).
    """

    kernels: str = "fused"
    precision: str = "tf32"

    @classmethod
    def adopt(cls, stock: BidirectionalGDNUCPESinglePathLiteLA, *, kernels: str, precision: str):
        return adopt_module(cls, stock, kernels=kernels, precision=precision)

    # ---------------------------------------------------------------- forward
    def forward(
        self,
        x: torch.Tensor,
        mask=None,
        HW=None,
        rotary_emb=None,
        block_mask=None,
        camera_conditions=None,
        chunk_size=None,
        *,
        frame_valid_mask=None,
        ucpe_ray_transforms=None,
    ) -> torch.Tensor:
        if HW is None:
            raise ValueError("HW (T, h, w) must be provided for GDN attention.")
        if frame_valid_mask is not None:
            # Padded-frame masking is only used by training-time batching; keep diffusers' path for it.
            return super().forward(
                x, mask, HW, rotary_emb, block_mask, camera_conditions, chunk_size,
                frame_valid_mask=frame_valid_mask, ucpe_ray_transforms=ucpe_ray_transforms,
            )
        beta, decay = self._gates(x, HW)
        main = self._main_branch(x, beta, decay, HW, rotary_emb)
        camera = None
        if camera_conditions is not None:
            ray_transforms = ucpe_ray_transforms
            if ray_transforms is None:
                ray_transforms = _prepare_ucpe_ray_transforms(
                    head_dim=self.cam_head_dim, camera_conditions=camera_conditions, HW=HW,
                    patch_size=self.patch_size, rotary_emb=rotary_emb,
                )
            camera = self._camera_branch(x, beta, decay, HW, ray_transforms)
        return self._combine(x, main, camera)

    def _gates(self, x: torch.Tensor, HW) -> tuple[torch.Tensor, torch.Tensor]:
        """Gates shared by both branches; see `gdn_gates`."""
        frames, height, width = HW
        return gdn_gates(self, x, frames, height * width)

    def _main_branch(self, x, beta, decay, HW, rotary_emb) -> torch.Tensor:
        """Main branch: qkv -> short conv on K -> RMSNorm -> ReLU -> bidirectional GDN; (B, N, C) in x's dtype.

        kernels="fused": `kernels.short_conv` reads K in place from the qkv output, then
        `kernels.main_branch` (prep, KV + Z scans, division). Otherwise (or for a block layout
        the fused path does not cover) the diffusers computation (`self.attn`).
        """
        batch, tokens, channels = x.shape
        frames = HW[0]
        fusable = (
            self.kernels == "fused" and rotary_emb is not None and self.conv_k is not None
            and self.conv_k.bias is None and self.conv_q is None and self.conv_v is None
            and getattr(self.q_norm, "weight", None) is not None and getattr(self.k_norm, "weight", None) is not None
        )
        if fusable:
            from camrender.kernels.main_branch import main_branch
            from camrender.kernels.short_conv import short_conv

            backend = KERNEL_BACKENDS[self.kernels]
            qkv = self.qkv(x)
            key = short_conv(qkv[..., channels:2 * channels], self.conv_k.weight, frames, backend=backend)
            return main_branch(
                qkv[..., :channels], key, qkv[..., 2 * channels:], beta, decay, rotary_emb,
                q_norm_weight=self.q_norm.weight, k_norm_weight=self.k_norm.weight, norm_eps=self.q_norm.eps,
                eps=self.attn.eps, precision=self.precision, backend=backend,
            )
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

    def _camera_branch(self, x, beta, decay, HW, ray_transforms) -> torch.Tensor:
        """Camera branch up to (not including) out_proj_cam: (B, N, C) in x's dtype.

        The projections and short convolutions run here; RMSNorm, ReLU, k-scale, UCPE encode,
        RMS downscale, beta discount, both scans and UCPE decode run in `kernels.camera_branch`.
        """
        from camrender import kernels

        batch, tokens, _ = x.shape
        frames = HW[0]
        query = self.q_proj_cam(x)
        key = self.k_proj_cam(x)
        value = self.v_proj_cam(x)
        if self.conv_q_cam is not None:
            query = self.conv_q_cam(query, frames)
        if self.conv_k_cam is not None and self.conv_k_cam.bias is None and self.kernels == "fused":
            from camrender.kernels.short_conv import short_conv

            key = short_conv(key, self.conv_k_cam.weight, frames, backend=KERNEL_BACKENDS[self.kernels])
        elif self.conv_k_cam is not None:
            key = self.conv_k_cam(key, frames)
        if self.conv_v_cam is not None:
            value = self.conv_v_cam(value, frames)
        shape = (batch, tokens, self.cam_heads, self.cam_head_dim)
        q_norm, k_norm = self.q_norm_cam, self.k_norm_cam
        return kernels.camera_branch(
            query.reshape(shape),
            key.reshape(shape),
            value.reshape(shape),
            beta,
            decay,
            ray_transforms,
            q_norm_weight=getattr(q_norm, "weight", None),
            k_norm_weight=getattr(k_norm, "weight", None),
            norm_eps=getattr(q_norm, "eps", 1e-5),
            precision=self.precision,
            backend=KERNEL_BACKENDS[self.kernels],
        )

    def _combine(self, x, main, camera) -> torch.Tensor:
        """out = proj((main + out_proj_cam(camera)) * silu(output_gate(x))), gate in fp32; (B, N, C) in x's dtype."""
        camera = None if camera is None else self.out_proj_cam(camera)
        return combine_branches(self, x, main, camera, KERNEL_BACKENDS[self.kernels])


def patch_transformer(transformer, kernels: str = "fused", precision: str = "tf32"):
    """Patch every block of a `SanaWMTransformer3DModel` in place; returns the transformer.

    Args:
        transformer: the diffusers SANA-WM transformer (its `state_dict()` is unchanged).
        kernels: "fused" (Triton kernels; PyTorch reference on CPU without TRITON_INTERPRET=1)
            or "torch" (PyTorch references everywhere).
        precision: matmul precision inside the Triton kernels, "tf32" or "ieee".

    Patching twice only updates `kernels` / `precision`.
    """
    if kernels not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {kernels!r}")
    if precision not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {PRECISION_CHOICES}, got {precision!r}")
    from camrender.model.block import patch_block
    from camrender.model.ffn import patch_ffn

    for index, block in enumerate(transformer.blocks):
        block = transformer.blocks[index] = patch_block(block, kernels=kernels)
        if isinstance(block.mlp, GLUMBConvTemp):
            block.mlp = patch_ffn(block.mlp, kernels=kernels)
        attention = block.attn
        if isinstance(attention, PatchedGDNAttention):
            attention.kernels, attention.precision = kernels, precision
        elif isinstance(attention, BidirectionalGDNUCPESinglePathLiteLA):
            # --- GDN blocks: fused camera branch ---
            block.attn = PatchedGDNAttention.adopt(attention, kernels=kernels, precision=precision)
        elif isinstance(attention, _SoftmaxUCPESinglePathLiteLA):
            # --- Softmax blocks: flash SDPA + fused prep / UCPE encode-decode (camrender.model.softmax_attention) ---
            from camrender.model.softmax_attention import patch_softmax_block

            block.attn = patch_softmax_block(attention, kernels=kernels, precision=precision)
        else:
            raise TypeError(f"unexpected attention module {type(attention).__name__} in a SANA-WM block")
    return transformer
