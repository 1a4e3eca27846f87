"""Swap SANA-WM's blocks, attentions and FFNs for modules that run the fused Triton kernels.

`patch_transformer(transformer)` resolves the kernel settings once (`KernelSettings`: backend, matmul
precision, linear precision) and walks `transformer.blocks`: each block becomes a
`camrender.model.stage1.block.PatchedBlock`,
its attention a `gdn_attention.PatchedGDNAttention` (GDN blocks) or a
`softmax_attention.PatchedSoftmaxAttention` (softmax blocks), its FFN a `ffn.PatchedGLUMBConvTemp`,
every one holding the same settings. The attentions also hold full mode's rules (`full_options`, a
`SegmentOptions` of the recipe, `set_full_options`): diffusers' model is one recipe among several. Each adopts the original's parameters, buffers and
sub-modules: the transformer's `state_dict()` keys and tensors are unchanged (same storage), so
weights load, save and offload exactly as before. The patched blocks run both full mode and
segment mode (`camrender.model.stage1.segments`).
"""
from __future__ import annotations

from typing import Optional

from diffusers.models.transformers.transformer_sana_wm import (
    BidirectionalGDNUCPESinglePathLiteLA,
    GLUMBConvTemp,
    _SoftmaxUCPESinglePathLiteLA,
)

from camrender.kernels._validate import MATMUL_PRECISIONS
from camrender.model.settings import KernelSettings
from camrender.model.stage1.block import patch_block
from camrender.model.stage1.ffn import patch_ffn
from camrender.model.stage1.gdn_attention import PatchedGDNAttention
from camrender.model.stage1.recipes import get_recipe
from camrender.model.stage1.softmax_attention import PatchedSoftmaxAttention
from camrender.model.stage1.state import SegmentOptions

__all__ = ["patch_transformer", "patch_attention", "set_full_options", "KernelSettings", "MATMUL_PRECISIONS"]


def patch_attention(attention, settings: KernelSettings):
    """The patched attention for `attention` (its settings updated in place if already patched)."""
    if isinstance(attention, (PatchedGDNAttention, PatchedSoftmaxAttention)):
        attention.settings = settings
        return attention
    if isinstance(attention, BidirectionalGDNUCPESinglePathLiteLA):
        return PatchedGDNAttention.adopt(attention, settings)
    if isinstance(attention, _SoftmaxUCPESinglePathLiteLA):
        return PatchedSoftmaxAttention.adopt(attention, settings)
    raise TypeError(f"unexpected attention module {type(attention).__name__} in a SANA-WM block")


def set_full_options(transformer, options: SegmentOptions):
    """Make full mode of a patched transformer compute under `options` (`SegmentOptions.full_mode(recipe)`).

    Raises ValueError on an unpatched transformer (diffusers' own blocks know only diffusers' rules)."""
    attentions = [block.attn for block in transformer.blocks
                  if isinstance(block.attn, (PatchedGDNAttention, PatchedSoftmaxAttention))]
    if len(attentions) != len(transformer.blocks):
        raise ValueError("set_full_options needs a patched transformer "
                         "(camrender.model.stage1.patch.patch_transformer)")
    for attention in attentions:
        attention.full_options = options


def patch_transformer(transformer, kernels: str = "fused", matmul_precision: str = "tf32", *,
                      settings: Optional[KernelSettings] = None, recipe: Optional[str] = None):
    """Patch every block of a `SanaWMTransformer3DModel` in place; returns the transformer.

    Args:
        transformer: the diffusers SANA-WM transformer (its `state_dict()` is unchanged).
        kernels: "fused" (Triton kernels; PyTorch references on CPU without TRITON_INTERPRET=1)
            or "torch" (the PyTorch references of the same structure).
        matmul_precision: matmul precision inside the Triton kernels, "tf32" or "ieee".
        settings: a `KernelSettings` used instead of `kernels` / `matmul_precision` (e.g. backend
            "triton" to run the kernels under the interpreter, for tests and replays).
        recipe: name of the recipe whose rules full mode computes with (`set_full_options`);
            None: the default recipe on a first patch, unchanged on a re-patch.

    Patching again only replaces the settings (and the rules, with a `recipe`).
    """
    if settings is None:
        settings = KernelSettings.from_kernels(kernels, matmul_precision)
    for index, block in enumerate(transformer.blocks):
        block = transformer.blocks[index] = patch_block(block, settings)
        if isinstance(block.mlp, GLUMBConvTemp):
            block.mlp = patch_ffn(block.mlp, settings)
        block.attn = patch_attention(block.attn, settings)
    if recipe is not None:
        set_full_options(transformer, SegmentOptions.full_mode(get_recipe(recipe)))
    return transformer
