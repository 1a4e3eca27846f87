"""The refiner blocks' fused path: `use_refiner_kernels(transformer, "fused" | "torch")`.

"fused" sets `camrender.model.refiner.attention.FusedRefinerAttnProcessor` on every block's self-attention
and runs each block's adaLN glue as single passes of `kernels.block_glue` (norm="rms"), in place of
diffusers' `SanaWMLTX2RefinerTransformerBlock.forward`:

    h = ada_norm(x, shift_msa, scale_msa)                RMSNorm(x) * (1 + scale) + shift   (stock: ~9 kernels)
    x = gated_residual(x, attn1(h), gate_msa)            x + attn * gate                    (2)
    h = ada_norm(x)                                      RMSNorm(x)                         (~6)
    x, h = residual_ada_norm(x, attn2(h), shift_mlp, scale_mlp)   x + attn2; RMSNorm * (1 + scale) + shift (~10)
    x = gated_residual(x, ff(h), gate_mlp)                                                  (2)

Under FP8 (the blocks' linears `Fp8Linear`s) each activation a linear reads is quantized by the kernel that
writes it, the same bits as quantizing it after: the three adaLN norms write their rows in e4m3 with their
scales (`ada_norm(..., quantize=True)`, a `camrender.model.fp8.QuantizedRows`), the attentions' head merge
runs inside their output projection's quantization (`attention.attention_output`), the prompt
cross-attention then runs as `attention.cross_attention`, and the FFN's GELU inside its output linear's
quantization (`camrender.model.fp8.feed_forward`): one quantizing pass per block left on its own.

rounded where the stock forward writes its intermediate tensors (see `kernels/block_glue.py`), so
only the norms' fp32 sum order differs. The modules and weights are diffusers' (nothing is copied);
"torch" (`--kernels torch`) puts diffusers' processor and forward back. A block whose `forward` something else already
wraps (e.g. an offloading hook) keeps it and only gets the attention processor.
"""
from __future__ import annotations

import types

from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMLTX2RefinerAttnProcessor

from camrender.kernels.block_glue import ada_norm, gated_residual
from camrender.model.fp8 import QuantizedRows, feed_forward, ff_input_linear, takes_quantized
from camrender.model.refiner.attention import (FusedRefinerAttnProcessor, cross_attention, cross_fusable, fusable,
                                               input_linears)
from camrender.vocabulary import KERNELS

REFINER_KERNELS = KERNELS.values  # "torch": diffusers' own block code


def use_refiner_kernels(transformer, kernels: str = "fused", backend: str = "auto") -> bool:
    """Put the refiner transformer's blocks on the fused (or diffusers' stock) path; idempotent.
    backend: the kernels' ("auto": Triton on CUDA or under TRITON_INTERPRET=1, "triton", or "torch": their
    PyTorch references, which still write K/V into the window). Returns whether every block's
    self-attention now runs the fused processor."""
    if kernels not in REFINER_KERNELS:
        raise ValueError(f"refiner kernels must be one of {', '.join(REFINER_KERNELS)}, got {kernels!r}")
    fused = kernels == "fused"
    every = True
    for block in transformer.transformer_blocks:
        attention = fused and fusable(block.attn1)
        every = every and attention
        current = block.attn1.processor
        if attention and not (isinstance(current, FusedRefinerAttnProcessor) and current.backend == backend):
            block.attn1.set_processor(FusedRefinerAttnProcessor(backend))
        elif not attention and isinstance(current, FusedRefinerAttnProcessor):
            block.attn1.set_processor(SanaWMLTX2RefinerAttnProcessor())
        forward = block.__dict__.get("forward")
        ours = getattr(forward, "__func__", None) is fused_block_forward
        if fused and attention and forward is None and _glue_fusable(block):
            block.forward = types.MethodType(fused_block_forward, block)
        elif not fused and ours:
            del block.forward
    return every


def _glue_fusable(block) -> bool:
    norms = (block.norm1, block.norm2, block.norm3)
    return all(type(norm) is RMSNorm and norm.weight is None for norm in norms) and not block.cross_attn_adaln


def fused_block_forward(self, hidden_states, encoder_hidden_states, temb, video_rotary_emb,
                        encoder_attention_mask=None, sink_rotary_emb=None, kv_cache=None, kv_cache_mode=None):
    """`SanaWMLTX2RefinerTransformerBlock.forward` with the glue fused (module docstring); same arguments."""
    backend = self.attn1.processor.backend  # the glue runs where the fused attention runs
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.get_mod_params(
        self.scale_shift_table, temb, hidden_states.size(0))
    hidden_states = hidden_states.contiguous()
    quantized = takes_quantized(input_linears(self.attn1))
    norm = _ada_norm_for(quantized, hidden_states, shift_msa, scale_msa, self.norm1.eps, backend)
    # the processors are called directly: `SanaWMLTX2Attention.forward` only filters keyword arguments, with an
    # `inspect.signature` per call (host time in a launch-bound model)
    attention = self.attn1.processor(self.attn1, norm, query_rotary_emb=video_rotary_emb,
                                     sink_rotary_emb=sink_rotary_emb, kv_cache=kv_cache, kv_cache_mode=kv_cache_mode)
    hidden_states = gated_residual(hidden_states, attention, gate_msa, backend=backend)
    cross = cross_fusable(self.attn2)  # FP8 query projections: they take the norm quantized
    norm = _ada_norm_for(cross, hidden_states, None, None, self.norm2.eps, backend)
    attend = cross_attention if cross else self.attn2.processor
    attention = attend(self.attn2, norm, encoder_hidden_states, encoder_attention_mask)
    quantized = takes_quantized([ff_input_linear(self.ff)])
    hidden_states, norm = _ada_norm_for(quantized, hidden_states, shift_mlp, scale_mlp, self.norm3.eps, backend,
                                        residual=attention)
    return gated_residual(hidden_states, feed_forward(self.ff, norm), gate_mlp, backend=backend)


def _ada_norm_for(quantize: bool, x, shift, scale, eps, backend, residual=None):
    """`ada_norm(x [+ residual], shift, scale)` (norm="rms") as the next linears' input: quantized in the same
    pass (a `QuantizedRows`) when they all take one (`quantize`: `takes_quantized` of them), else x's dtype. With
    `residual`, the pair (x + residual, that input)."""
    out = ada_norm(x, shift, scale, eps=eps, residual=residual, norm="rms", backend=backend, quantize=quantize)
    if not quantize:
        return out
    updated, (q, q_scale) = out if residual is not None else (None, out)
    rows = QuantizedRows(q, q_scale, tuple(x.shape[:-1]), x.dtype)
    return rows if residual is None else (updated, rows)
