"""Fused attention for SANA-WM's softmax blocks (every 4th block: 3, 7, 11, 15, 19).

`PatchedSoftmaxAttention.adopt(stock, kernels=..., precision=...)` takes over a stock
`_SoftmaxUCPESinglePathLiteLA`'s parameters, buffers and sub-modules (no copies: the
transformer's `state_dict()` is unchanged). With kernels="fused":
- main branch: qkv -> `kernels.main_prep` (full-C RMSNorm + RoPE, written straight in the SDPA
  dtype) -> SDPA over all N tokens at head dim D (bf16 on CUDA; cuDNN attention first, then
  flash, see SDPA_BACKENDS); V is read in place from the qkv output.
- camera branch: q/k/v_proj_cam -> `kernels.softmax_cam.cam_softmax_encode` (RMSNorm, UCPE,
  RoPE, RMS downscale, zero-padded to 128, SDPA dtype) -> SDPA (scale 1/sqrt(128), as stock) ->
  `cam_softmax_decode` (P, inverse RoPE) -> out_proj_cam.
- combine: proj((main + cam) * silu(output_gate(x))) in one pass (`camrender.model.patch.combine_branches`).
kernels="torch" (or a padded-frame mask, or a block without RMSNorm) runs the stock forward.
Off CUDA and without TRITON_INTERPRET=1 the same fused structure runs on the PyTorch references.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_sana_wm import _prepare_ucpe_ray_transforms, _SoftmaxUCPESinglePathLiteLA

from camrender.model.patch import adopt_module, combine_branches
from camrender.kernels.short_conv import use_triton as kernel_backend_is_triton


# SDPA backends in priority order on CUDA (names of torch.nn.attention.SDPBackend), or None for
# PyTorch's own choice. H200, torch 2.11, B=2 N=18480 H=20 bf16: cuDNN attention 12.3 ms vs flash
# 19.4 ms per call at head dim 128; unsupported inputs fall through to the next backend.
SDPA_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def sdpa(q, k, v, *, scale=None, mask=None, backends=SDPA_BACKENDS):
    """F.scaled_dot_product_attention on (B, H, n, D) tensors, on CUDA under the backend priority
    list `backends` (None: PyTorch's own choice). mask: optional bool, True = attend."""
    if backends is None or not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, name) for name in backends], set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def padded_sdpa_scale(head_dim: int) -> float:
    """1 / sqrt(padded head dim), the scale of diffusers' camera SDPA: it zero-pads head dims other
    than FlashAttention's 32/64/128/256 to 128 (or 256) and attends at the padded size's default
    scale. Segment mode's cached attention scales both branches this way."""
    padded = head_dim if head_dim in (32, 64, 128) or head_dim >= 256 else (128 if head_dim <= 128 else 256)
    return padded ** -0.5


def softmax_qkv(attn, x, rope, attn_dtype, use_triton: bool):
    """Main-branch q, k (full-C RMSNorm, RoPE) and v of softmax-block attention `attn`, each
    (B, H, N, D) in `attn_dtype`. x (B, N, C); rope: diffusers' complex table or None.
    use_triton: `kernels.main_prep` writes q and k straight in `attn_dtype`, else its reference."""
    from camrender.kernels.main_prep import main_prep
    from camrender.kernels.main_reference import main_prep_ref

    batch, tokens, channels = x.shape
    heads, dim = attn.heads, attn.dim
    qkv = attn.qkv(x)
    prepped = []
    for raw, norm in ((qkv[..., :channels], attn.q_norm), (qkv[..., channels:2 * channels], attn.k_norm)):
        if use_triton:
            out = torch.empty(batch, tokens, channels, device=x.device, dtype=attn_dtype)
            prepped.append(main_prep(raw, norm.weight, heads, norm_eps=norm.eps, relu=False, rope=rope, out=out))
        else:
            prepped.append(main_prep_ref(raw, norm.weight, heads, norm_eps=norm.eps, relu=False,
                                         rope=rope).to(attn_dtype))
    value = qkv[..., 2 * channels:].to(attn_dtype)
    return tuple(t.reshape(batch, tokens, heads, dim).transpose(1, 2) for t in (*prepped, value))


def camera_encode(attn, x, ray_transforms, attn_dtype, use_triton: bool, downscale: bool = True):
    """Camera q, k, v of softmax-block attention `attn` after RMSNorm, UCPE and (diffusers; not
    the original streaming code) RMS downscale, each (B, H, N, DPAD) in `attn_dtype` (head dim
    zero-padded, `kernels.softmax_cam`)."""
    if use_triton:
        from camrender.kernels.softmax_cam import cam_softmax_encode
    else:
        from camrender.kernels.main_reference import cam_softmax_encode_ref as cam_softmax_encode
    encoded = cam_softmax_encode(
        attn.q_proj_cam(x), attn.k_proj_cam(x), attn.v_proj_cam(x), ray_transforms,
        q_norm_weight=attn.q_norm_cam.weight, k_norm_weight=attn.k_norm_cam.weight,
        norm_eps=attn.q_norm_cam.eps, heads=attn.cam_heads, downscale=downscale, out_dtype=attn_dtype)
    return tuple(t.transpose(1, 2) for t in encoded)


def camera_decode(attn, o, ray_transforms, dtype, use_triton: bool):
    """Camera SDPA output (B, H, N, DPAD) -> world space (B, N, C) in `dtype` (P, inverse RoPE)."""
    if use_triton:
        from camrender.kernels.softmax_cam import cam_softmax_decode
    else:
        from camrender.kernels.main_reference import cam_softmax_decode_ref as cam_softmax_decode
    return cam_softmax_decode(o, ray_transforms, dim=attn.cam_head_dim, out_dtype=dtype)


def sdpa_operand_dtype(dtype, override):
    """SDPA operand dtype: the override, else the stock rule (fp32 -> bf16, other dtypes unchanged)."""
    if override is not None:
        return override
    return torch.bfloat16 if dtype == torch.float32 else dtype


class PatchedSoftmaxAttention(_SoftmaxUCPESinglePathLiteLA):
    """Softmax-block attention on the fused prep / UCPE kernels; x (B, N, C) -> (B, N, C).

    Attributes:
        kernels: "fused" or "torch" (stock forward).
        precision: kept for symmetry with the GDN blocks (SDPA has no tf32/ieee switch).
        sdpa_dtype: None (stock rule: fp32 inputs attend in bf16) or a dtype to attend in.
        sdpa_backends: SDPA backend priority (see SDPA_BACKENDS).
    """

    kernels: str = "fused"
    precision: str = "tf32"
    sdpa_dtype = None
    sdpa_backends = SDPA_BACKENDS

    @classmethod
    def adopt(cls, stock: _SoftmaxUCPESinglePathLiteLA, *, kernels: str = "fused", precision: str = "tf32"):
        return adopt_module(cls, stock, kernels=kernels, precision=precision)

    def _fusable(self, frame_valid_mask) -> bool:
        return (
            self.kernels == "fused"
            and frame_valid_mask is None
            and all(getattr(norm, "weight", None) is not None
                    for norm in (self.q_norm, self.k_norm, self.q_norm_cam, self.k_norm_cam))
            and self.dim % 2 == 0
            and self.cam_head_dim % 8 == 0
        )

    def forward(self, x, mask=None, HW=None, rotary_emb=None, block_mask=None, camera_conditions=None,
                chunk_size=None, *, frame_valid_mask=None, ucpe_ray_transforms=None):
        if HW is None:
            raise ValueError("HW (T, H, W) must be provided for softmax attention.")
        if not self._fusable(frame_valid_mask):
            return super().forward(x, mask, HW, rotary_emb, block_mask, camera_conditions, chunk_size,
                                   frame_valid_mask=frame_valid_mask, ucpe_ray_transforms=ucpe_ray_transforms)
        use_triton = kernel_backend_is_triton(x)
        attn_dtype = sdpa_operand_dtype(x.dtype, self.sdpa_dtype)
        out = self._main_softmax(x, rotary_emb, attn_dtype, use_triton)
        if camera_conditions is not None:
            ray_transforms = ucpe_ray_transforms
            if ray_transforms is None:
                ray_transforms = _prepare_ucpe_ray_transforms(
                    head_dim=self.cam_head_dim, camera_conditions=camera_conditions, HW=HW,
                    patch_size=self.patch_size, rotary_emb=rotary_emb)
            camera = self.out_proj_cam(self._camera_softmax(x, ray_transforms, attn_dtype, use_triton))
        else:
            camera = None
        return combine_branches(self, x, out, camera, backend="auto" if use_triton else "torch")

    def _main_softmax(self, x, rotary_emb, attn_dtype, use_triton):
        """Main branch up to (not including) the gate: (B, N, C) in x.dtype."""
        o = sdpa(*softmax_qkv(self, x, rotary_emb, attn_dtype, use_triton), backends=self.sdpa_backends)
        return o.transpose(1, 2).reshape(x.shape).to(x.dtype)

    def _camera_softmax(self, x, ray_transforms, attn_dtype, use_triton):
        """Camera branch up to (not including) out_proj_cam: (B, N, C) in x.dtype, world space."""
        # Our encode pads every head dim to 128 or 256 (zeros, no effect on the scores): the scale is stock's.
        o = sdpa(*camera_encode(self, x, ray_transforms, attn_dtype, use_triton),
                 scale=padded_sdpa_scale(self.cam_head_dim), backends=self.sdpa_backends)
        return camera_decode(self, o, ray_transforms, x.dtype, use_triton)


def patch_softmax_block(attention, *, kernels: str = "fused", precision: str = "tf32"):
    """Return the patched softmax attention for `attention` (updates it in place if already patched)."""
    if isinstance(attention, PatchedSoftmaxAttention):
        attention.kernels, attention.precision = kernels, precision
        return attention
    if not isinstance(attention, _SoftmaxUCPESinglePathLiteLA):
        raise TypeError(f"expected a softmax-block attention, got {type(attention).__name__}")
    return PatchedSoftmaxAttention.adopt(attention, kernels=kernels, precision=precision)
