"""The refiner's self-attention with fewer launches and memory passes (a drop-in attention processor).

`FusedRefinerAttnProcessor` replaces diffusers' `SanaWMLTX2RefinerAttnProcessor` on each refiner
block's `attn1` (`use_refiner_kernels`). It runs the same projections (the module's own `to_q`,
`to_k`, `to_v`, `to_out` and gate), and instead of the stock chain

    RMSNorm(q), RMSNorm(k)            ~8 elementwise kernels each (fp32 up-cast, pow, mean, rsqrt, ...)
    RoPE(q), RoPE(k) in fp32          ~8 kernels each
    RoPE(sink K) every pass           ~8 kernels, though the sink's position is fixed for the block
    cat([sink, history, current])     for K and for V: a copy of the whole window every pass

it does

    one `kernels.rms_rope.rms_rope_qk` launch (norm + RoPE of q and k), the sink's RoPE once per block
    (`kernels.rms_rope.rope_rows`), and attention over [the window's prefix ; the pass's own K/V] as two
    attention calls merged by their log-sum-exp (`camrender.model.refiner.lse_attention`): nothing concatenated;
    the block's cache pass appends its K/V to the window's history (`WindowLayerCache.append`),

with a `camrender.model.refiner.window.WindowKVCache`. With its `BLOCK_SLOT` layout instead, k is written
into the window's block slot by the same launch, V copied beside it, and SDPA reads the window in one call.
With diffusers' own `SanaWMRefinerKVCache` (diffusers' pipeline, a window of the sink alone) it keeps that
cache's contract (concatenation, captured K/V) and still fuses the norm and RoPE. The result equals the
stock processor's up to the fused norm's fp32 sum order and the merge's rounding
(tests/model/test_refiner_attention.py).

Under FP8 the attentions hand their output projection its input already quantized: the heads' merge (and
LTX-2's optional per-head output gate) runs inside the row-wise quantization
(`kernels.fp8_quant.merge_heads_quantize_rows`, `attention_output`), and the block's prompt cross-attention,
whose query input the adaLN glue quantizes, runs as `cross_attention` (the stock processor's ops on a
`camrender.model.fp8.QuantizedRows`).
"""
from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_sana_wm_refiner import (
    SanaWMLTX2AudioVideoAttnProcessor,
    SanaWMLTX2RefinerAttnProcessor,
)

from camrender.kernels.fp8_quant import merge_heads_quantize_rows
from camrender.kernels.rms_rope import ROPE_TYPES, rms_rope_qk, rope_rows
from camrender.model.fp8 import one_input_linears, takes_quantized
from camrender.model.refiner.lse_attention import attend_parts
from camrender.model.refiner.window import WindowLayerCache

INJECT_MODES = ("inject", "inject_and_capture_post_rope")


def fusable(attn) -> bool:
    """Whether `attn` (a `SanaWMLTX2Attention`) has what the fused processor computes: full-width
    RMSNorms on q and k with one epsilon, a RoPE layout the kernel knows, as many K/V heads as Q heads."""
    norms = (attn.norm_q, attn.norm_k)
    return (all(type(norm) is torch.nn.RMSNorm for norm in norms) and attn.norm_q.eps == attn.norm_k.eps
            and attn.rope_type in ROPE_TYPES and attn.inner_kv_dim == attn.inner_dim
            and (attn.norm_q.weight is None) == (attn.norm_k.weight is None))


class FusedRefinerAttnProcessor:
    """See the module docstring. `backend` as the kernels' ("auto": Triton on CUDA or under
    TRITON_INTERPRET=1, else their PyTorch references, which still skip the per-pass copies)."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, backend: str = "auto"):
        self.backend = backend
        self.stock = SanaWMLTX2RefinerAttnProcessor()

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, query_rotary_emb=None,
                 key_rotary_emb=None, sink_rotary_emb=None, kv_cache=None, kv_cache_mode=None):
        if query_rotary_emb is None or not fusable(attn):
            return self.stock(attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                              key_rotary_emb, sink_rotary_emb=sink_rotary_emb, kv_cache=kv_cache,
                              kv_cache_mode=kv_cache_mode)
        query, key, value, *gate = one_input_linears(hidden_states, input_linears(attn))
        gate_logits = gate[0] if gate else None  # FP8: the four projections quantize their input once
        eps = attn.norm_q.eps if attn.norm_q.eps is not None else torch.finfo(query.dtype).eps
        prep = dict(eps=eps, head_dim=attn.head_dim, rope_type=attn.rope_type, backend=self.backend)
        weights = (attn.norm_q.weight, attn.norm_k.weight)
        cos, sin = query_rotary_emb

        heads = attn.heads
        window = isinstance(kv_cache, WindowLayerCache) and kv_cache_mode in INJECT_MODES
        if window and not kv_cache.block_slot:
            query, key = rms_rope_qk(query, key, *weights, cos, sin, **prep)
            self._rope_sink_once(kv_cache, sink_rotary_emb, attn)
            parts = [kv_cache.prefix(), (key, value)]
            out = attend_parts(_heads_first(query, heads), [tuple(_heads_first(t, heads) for t in part)
                                                            for part in parts]).transpose(1, 2)
            if kv_cache_mode == "inject_and_capture_post_rope":
                kv_cache.append(key, value)  # after the attention read the window
            return attention_output(attn, out, gate_logits, query.dtype)
        if window:
            start, end = kv_cache.place(hidden_states.shape[1])
            kv_cache.value[:, start:end].copy_(value)
            query, _ = rms_rope_qk(query, key, *weights, cos, sin, k_out=kv_cache.key[:, start:end], **prep)
            self._rope_sink_once(kv_cache, sink_rotary_emb, attn)
            key, value = kv_cache.key[:, :end], kv_cache.value[:, :end]
        else:
            capture = kv_cache_mode == "capture_pre_rope"
            query, key, *pre = rms_rope_qk(query, key, *weights, cos, sin, return_k_pre=capture, **prep)
            if capture:
                kv_cache.store_captured_pre_rope(pre[0], value)
            if kv_cache_mode == "inject_and_capture_post_rope":
                kv_cache.store_captured_post_rope(key, value)
            if kv_cache_mode in INJECT_MODES:
                key, value = _stock_window(kv_cache, key, value, sink_rotary_emb, attn, self.backend)

        out = dispatch_attention_fn(query.unflatten(2, (heads, -1)), key.unflatten(2, (heads, -1)),
                                    value.unflatten(2, (heads, -1)), attn_mask=None, dropout_p=0.0, is_causal=False,
                                    backend=self._attention_backend, parallel_config=self._parallel_config)
        return attention_output(attn, out, gate_logits, query.dtype)

    def _rope_sink_once(self, kv_cache, sink_rotary_emb, attn) -> None:
        """RoPE the window's sink keys into its sink slot, on the block's first pass (its position is fixed)."""
        if kv_cache.sink_stale:
            sink_slot = kv_cache.key[:, :kv_cache.sink_tokens]
            _rope_sink(kv_cache.sink_k_pre, sink_rotary_emb, attn, self.backend, out=sink_slot)
            kv_cache.sink_stale = False


def input_linears(attn, cross: bool = False) -> list:
    """The projections that read a `SanaWMLTX2Attention`'s (query side) input: to_q, to_k, to_v [, to_gate_logits];
    of a cross-attention (cross=True) to_q [, to_gate_logits]."""
    gate = [attn.to_gate_logits] if attn.to_gate_logits is not None else []
    return [attn.to_q] + ([] if cross else [attn.to_k, attn.to_v]) + gate


def attention_output(attn, out, gate_logits, dtype):
    """Attention output (B, n, H, D) -> the module's output (B, n, C): the stock per-head gate, to_out. Under
    FP8 the merge and gate run inside to_out's input quantization (module docstring)."""
    project = attn.to_out[0]
    if takes_quantized([project]):
        q, scale = merge_heads_quantize_rows(out.to(dtype), gate_logits, backend=project.backend)
        return attn.to_out[1](project.matmul(q, scale, tuple(out.shape[:2]), dtype))
    if gate_logits is not None:
        out = out * (2.0 * torch.sigmoid(gate_logits)).unsqueeze(-1)
    out = out.flatten(2, 3).to(dtype)
    return attn.to_out[1](project(out))


def cross_fusable(attn) -> bool:
    """Whether `cross_attention` computes what `attn` (a block's prompt cross-attention) runs: diffusers' stock
    LTX-2 processor with RMS norms, and FP8 query projections that take their input quantized."""
    return (type(attn.processor) is SanaWMLTX2AudioVideoAttnProcessor and type(attn.norm_q) is torch.nn.RMSNorm
            and takes_quantized(input_linears(attn, cross=True)))


def cross_attention(attn, hidden_states, context, attention_mask=None):
    """The stock `SanaWMLTX2AudioVideoAttnProcessor` on a prompt cross-attention without RoPE, its query input
    (B, n, C) a tensor or a `QuantizedRows`; context (B, L, C_text); attention_mask as the stock processor takes it.
    The keys and values are the module's own calls (the refiner's prompt memo serves them once per render)."""
    query, *gate = one_input_linears(hidden_states, input_linears(attn, cross=True))
    key = attn.norm_k(attn.to_k(context))
    value = attn.to_v(context)
    query = attn.norm_q(query)
    batch, length = context.shape[:2]
    if attention_mask is not None:
        attention_mask = attn.prepare_attention_mask(attention_mask, length, batch)
        attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
    processor = attn.processor
    out = dispatch_attention_fn(query.unflatten(2, (attn.heads, -1)), key.unflatten(2, (attn.heads, -1)),
                                value.unflatten(2, (attn.heads, -1)), attn_mask=attention_mask, dropout_p=0.0,
                                is_causal=False, backend=processor._attention_backend,
                                parallel_config=processor._parallel_config)
    return attention_output(attn, out, gate[0] if gate else None, query.dtype)


def _heads_first(tokens: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, n, H * D) -> a (B, H, n, D) view."""
    return tokens.unflatten(2, (heads, -1)).transpose(1, 2)


def _rope_sink(sink_k_pre, sink_rotary_emb, attn, backend, out=None):
    if sink_rotary_emb is None:
        raise ValueError("Injecting the attention sink requires the `sink_pe` RoPE tuple on the KV cache.")
    return rope_rows(sink_k_pre, *sink_rotary_emb, head_dim=attn.head_dim, rope_type=attn.rope_type, out=out,
                     backend=backend)


def _stock_window(kv_cache, key, value, sink_rotary_emb, attn, backend):
    """[sink, history, current] K and V concatenated from a stock `SanaWMRefinerKVLayerCache`."""
    keys, values = [], []
    sink = kv_cache.get_sink()
    if sink is not None:
        keys.append(_rope_sink(sink[0].to(key.dtype), sink_rotary_emb, attn, backend))
        values.append(sink[1].to(value.dtype))
    history = kv_cache.get_history()
    if history is not None:
        keys.append(history[0].to(key.dtype))
        values.append(history[1].to(value.dtype))
    if not keys:
        return key, value
    return torch.cat([*keys, key], dim=1), torch.cat([*values, value], dim=1)
