"""A SANA-WM block (`SanaVideoMSCamCtrlBlock`) on the fused kernels: adaLN glue and cross-attention
around the patched attention and FFN, with state passing.

`PatchedBlock.adopt(stock, settings)` takes over a `SanaVideoMSCamCtrlBlock`'s parameters and
sub-modules (no copies: the transformer's `state_dict()` is unchanged). On the kernels its
forward is the stock block's, with each adaLN step one pass of `kernels.block_glue` (rounded
where the stock block writes its intermediate tensors, so the glue itself matches it bit for bit):

    h = ada_norm(x, shift_msa, scale_msa)              LayerNorm + modulation
    x = gated_residual(x, attn(h), gate_msa, extra=p, extra_bias=b)   x + gate * attn + plucker_proj(P)
    x, h = residual_ada_norm(x, cross_attn(x), shift_mlp, scale_mlp)
    x = gated_residual(x, y, gate_mlp, y2=z)           FFN output y + z (temporal conv), see model/stage1/ffn.py

and the cross-attention's query RMSNorm runs as one kernel (`kernels.main_prep`) instead of five
fp32 passes. The residual stream leaves every block contiguous: the stock model carries it in the
patch embedder's transposed layout, which sends every later elementwise op down PyTorch's slow
strided path. Under FP8 (`camrender.model.fp8`) the glue kernels write the activations the block's FP8 linears
read already quantized (`Fp8Inputs`), and so do the output gate and the head merge before the output projections:
the FFN's point conv is the one linear left that quantizes its own input. Settings backend "torch" runs the same structure on the kernels' PyTorch references; only
a padded-frame mask (training-time batching) runs the stock block forward.

Segment mode is the same forward with a `segment` (`SegmentCall`) and the block's `state`
(`BlockCache`): the attention reads / writes its part of the state, the FFN's temporal conv sees
the cached last frame of the previous segment on the left and zero after each segment's end.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_sana_wm import (
    GLUMBConvTemp,
    MultiHeadCrossAttention,
    SanaVideoMSCamCtrlBlock,
    SanaWMCrossAttnProcessor,
)

from camrender.kernels._validate import use_triton
from camrender.kernels.block_glue import ada_norm, gated_residual, merge_heads, residual_ada_norm
from camrender.kernels.fp8_quant import merge_heads_quantize_rows
from camrender.kernels.main_prep import main_prep
from camrender.model.adopt import adopt_module
from camrender.model.fp8 import QuantizedRows, has_hooks, takes_quantized
from camrender.model.parking import park_all
from camrender.model.settings import KernelSettings
from camrender.model.stage1.ffn import ffn_input_linear, ffn_parts
from camrender.model.stage1.gdn_attention import PatchedGDNAttention, input_linears, norm_inv_rms
from camrender.model.stage1.softmax_attention import PatchedSoftmaxAttention
from camrender.model.stage1.state import BlockCache, SegmentCall


@dataclasses.dataclass
class TextKeys:
    """A cross-attention's keys and values of the text, (B, L, H, D) each (keys after its RMSNorm), and the
    padding mask (B, 1, 1, L) bool (True = attend) or None. The text is fixed over a render, so a sampler
    prepares these once (`prepared_text`) instead of once per block call."""

    key: torch.Tensor
    value: torch.Tensor
    mask: Optional[torch.Tensor]


class FusedCrossAttnProcessor(SanaWMCrossAttnProcessor):
    """`SanaWMCrossAttnProcessor` with the (B, N, C) query RMSNorm as one `kernels.main_prep` pass
    and the attention output's head merge as one tiled copy (`kernels.block_glue.merge_heads`).

    `backend` as the kernels' ("auto": Triton on CUDA / under TRITON_INTERPRET=1, else the stock code).
    `encoder_hidden_states` is the text (B, 1, L, C) or, on the kernels, its `TextKeys` (`text_keys`).
    """

    def __init__(self, backend: str = "auto"):
        self.backend = backend

    def fused(self, attn: MultiHeadCrossAttention, hidden_states) -> bool:
        """Whether calls on tensors like `hidden_states` run the fused path (and so take `TextKeys`)."""
        return getattr(attn.q_norm, "weight", None) is not None and use_triton(hidden_states, self.backend)

    def text_keys(self, attn: MultiHeadCrossAttention, encoder_hidden_states, attention_mask=None) -> TextKeys:
        """The keys, values and mask of text (B, 1, L, C), as a call computes them."""
        batch = encoder_hidden_states.shape[0]
        channels = attn.heads * attn.head_dim  # this rank's heads under the head split
        key, value = attn.kv_linear(encoder_hidden_states).view(batch, -1, 2, channels).unbind(2)
        key = attn.k_norm(key).view(batch, -1, attn.heads, attn.head_dim)
        value = value.view(batch, -1, attn.heads, attn.head_dim)
        if attention_mask is not None and attention_mask.ndim == 2:
            attention_mask = attention_mask.bool()[:, None, None, :]
        return TextKeys(key, value, attention_mask)

    def takes_query_rows(self, attn: MultiHeadCrossAttention, hidden_states) -> bool:
        """Whether a fused call takes its query input quantized (`query_rows`): an FP8 `q_linear`."""
        return self.fused(attn, hidden_states) and takes_quantized([attn.q_linear])

    def __call__(self, attn: MultiHeadCrossAttention, hidden_states, encoder_hidden_states, attention_mask=None,
                 query_rows: Optional[QuantizedRows] = None):
        """query_rows: hidden_states quantized for an FP8 `q_linear` (`takes_query_rows`), or None."""
        fused = self.fused(attn, hidden_states)
        batch = hidden_states.shape[0]
        channels = attn.heads * attn.head_dim  # this rank's heads under the head split, else x's C
        text = encoder_hidden_states
        if isinstance(text, TextKeys) and not fused:
            raise ValueError("prepared text keys are taken on the fused path only")
        if not fused and channels == hidden_states.shape[-1]:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask)

        query = attn.q_linear(hidden_states if query_rows is None else query_rows)
        if fused:
            query = main_prep(query, attn.q_norm.weight, attn.heads, norm_eps=attn.q_norm.eps, relu=False,
                              inv_rms=norm_inv_rms(attn.q_norm, query))
        else:  # the head split on the PyTorch path: the stock code on this rank's heads
            query = attn.q_norm(query)
        if not isinstance(text, TextKeys):
            text = self.text_keys(attn, text, attention_mask)
        out = dispatch_attention_fn(query.view(batch, -1, attn.heads, attn.head_dim), text.key, text.value,
                                    attn_mask=text.mask, backend=self._attention_backend,
                                    parallel_config=self._parallel_config)
        if fused and takes_quantized([attn.proj]):  # the head merge inside proj's input quantization
            q, scale = merge_heads_quantize_rows(out.type_as(query), backend=self.backend)
            return attn.proj(QuantizedRows(q, scale, tuple(out.shape[:2]), query.dtype))
        if fused:
            return attn.proj(merge_heads(out.type_as(query), backend=self.backend))
        return attn.proj(out.reshape(batch, -1, channels).type_as(query))


def prepared_text(transformer, text: torch.Tensor, mask: Optional[torch.Tensor]) -> Optional[list]:
    """Each block's `TextKeys` of the embedded text (B, 1, L, C) and its mask (B, L), or None for a block
    whose cross-attention computes them itself (not patched, or off the kernels); None if no block takes
    them. A render's calls then pass these instead of repeating the text GEMM and norm per block call.

    A mask that attends to every token is left out (the keys' mask is None): the attention then skips the mask.
    A render's text has no all-masked columns at its end (`camrender.render.inputs.drop_text_padding`), so with one
    prompt, or two of one length, this is the common case. Asking costs one wait for the GPU, once per render (a
    sampler keeps the keys), and only when some block takes them."""
    takes = [_takes_text_keys(block, text) for block in transformer.blocks]
    if not any(takes):
        return None
    if mask is not None and bool(mask.bool().all()):
        mask = None
    return [block.cross_attn.processor.text_keys(block.cross_attn, text, mask) if taken else None
            for block, taken in zip(transformer.blocks, takes)]


def park_text_projections(transformer, device) -> None:
    """Send to CPU memory (`camrender.model.parking`) the text projection of every block that takes prepared
    keys (`prepared_text`) on `device`: a render's calls read those keys, and the projection runs once per
    render, to make them. Idempotent; a loader does it first, so the copy to page-locked memory is part of
    loading."""
    like = torch.empty(0, device=device)
    park_all([block.cross_attn.kv_linear for block in transformer.blocks if _takes_text_keys(block, like)])


def _takes_text_keys(block, like: torch.Tensor) -> bool:
    """Whether the block's cross-attention takes `TextKeys` on tensors like `like`."""
    processor = getattr(block.cross_attn, "processor", None)
    return isinstance(block, PatchedBlock) and isinstance(processor, FusedCrossAttnProcessor) \
        and processor.fused(block.cross_attn, like)


def modulation_rows(block, modulation: torch.Tensor) -> tuple:
    """The block's six per-frame adaLN rows, each (B, T, C): shift, scale, gate for the attention,
    then for the FFN. modulation: the transformer's (B, 1, T, 6C) timestep embedding."""
    batch, _, frames, _ = modulation.shape
    rows = block.scale_shift_table[None, None] + modulation.reshape(batch, frames, 6, -1)
    return rows.unbind(2)


def plucker_projection(block, plucker_emb: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """plucker_emb @ block.plucker_proj.weight^T (no bias) -> (B, N, C) contiguous (written into `out` when
    given). The embedder hands over a transposed (B, N, C) view; one GEMM per batch item reads it in place. The
    bias is left to `attention_residual`, which adds it as the stock Linear does on that view (a separate add on
    the rounded GEMM output)."""
    weight = block.plucker_proj.weight
    if out is None:
        out = plucker_emb.new_empty(*plucker_emb.shape[:2], weight.shape[0])
    for index in range(plucker_emb.shape[0]):
        torch.mm(plucker_emb[index], weight.t(), out=out[index])
    return out


def plucker_projections(model, plucker: Optional[torch.Tensor], out: Optional[list] = None) -> Optional[list]:
    """Every block's post-attention Plucker projection of a call, without bias (`plucker_projection`):
    a list with a (B_p, N, C) tensor for each block that has one (None for the others), or None when the call
    has no Plucker maps. plucker: the call's embedded maps (B_p, N, C) (`SegmentConditioning.plucker`).
    out: a list this function returned before: its tensors are written in place where their shapes still fit
    (stable addresses for a CUDA graph that reads them where they are)."""
    if plucker is None:
        return None
    projections = []
    for index, block in enumerate(model.blocks):
        if not (isinstance(block, PatchedBlock) and hasattr(block, "plucker_proj")):
            projections.append(None)
            continue
        shape = (*plucker.shape[:2], block.plucker_proj.weight.shape[0])
        held = out[index] if out is not None and len(out) == len(model.blocks) else None
        fits = held is not None and held.shape == shape and held.dtype == plucker.dtype and held.device == plucker.device
        projections.append(plucker_projection(block, plucker, out=held if fits else None))
    return projections


def attention_residual(block, x, attn_out, gate, plucker_emb, backend, quantize=False, projected=None):
    """x + gate * attn_out (+ plucker_proj(plucker_emb) if given and the block has one), one pass.
    Inside `fixed_plucker` the block's projection computed there is used instead of plucker_emb's, and so is
    `projected` (the call's, `camrender.model.stage1.segments.plucker_projections`) when given.
    quantize: also return the result's rows quantized for an FP8 linear, (out, (q, scale)) (`gated_residual`)."""
    projected = getattr(block, "fixed_plucker", None) if projected is None else projected
    if projected is None and plucker_emb is not None and hasattr(block, "plucker_proj"):
        projected = plucker_projection(block, plucker_emb)
    extra = {} if projected is None else {"extra": projected, "extra_bias": block.plucker_proj.bias}
    return gated_residual(x, attn_out, gate, backend=backend, quantize=quantize, **extra)


@contextlib.contextmanager
def fixed_plucker(transformer, chunk_plucker):
    """Project the post-attention Plucker embedding of `chunk_plucker` once for every patched block
    (`plucker_projections`), and have those blocks add that projection on every call inside the context.

    For calls through diffusers' own transformer forward, which hands each block the embedding: the blocks
    otherwise repeat one (N x C) @ (C x C) GEMM each per step (camrender's samplers pass the projections to
    `segment_forward` instead, `SegmentOptions.plucker_once`). Every call inside the context must pass this
    `chunk_plucker`. Memory: one (B_p, N, C) tensor per block (B_p = chunk_plucker's batch, 1 for a render: the
    guidance rows share it). No-op without Plucker inputs.
    """
    if chunk_plucker is None or not getattr(transformer, "use_chunk_plucker_post_attn", False):
        yield
        return
    with torch.no_grad():
        embedded = transformer.plucker_embedder(chunk_plucker.to(transformer.dtype))
        held = [(block, projected) for block, projected in zip(transformer.blocks,
                                                                plucker_projections(transformer, embedded))
                if projected is not None]
    for block, projected in held:
        block.fixed_plucker = projected
    try:
        yield
    finally:
        for block, _ in held:
            block.fixed_plucker = None


def ffn_residual(block, x, mlp_in, grid, gate, backend, *, left=None, segments=None):
    """x + gate * FFN(mlp_in) in one pass after the FFN's GEMMs: the patched `GLUMBConvTemp` hands
    over its two terms (y, temporal conv z) unsummed. grid = (T, h, w). Returns (x', y) with y the
    FFN's pre-temporal output (segment mode caches its last frame), or None for other FFNs."""
    frames, height, width = grid
    if isinstance(block.mlp, GLUMBConvTemp):
        y, z = ffn_parts(block.mlp, mlp_in, frames, height, width, left=left, segments=segments, backend=backend)
        return gated_residual(x, y, gate, y2=z, backend=backend), y
    return gated_residual(x, block.mlp(mlp_in), gate, backend=backend), None


def glue_forward(block, x, y, mask, modulation, grid, attend, plucker_emb, backend, *, left=None, segments=None,
                 projected_plucker=None):
    """A SANA-WM block's forward on the fused adaLN glue, with its self-attention given as
    attend(h, h_rows) -> (B, N, C) (`PatchedBlock.forward`; h_rows: h quantized for its FP8 linears, or None).

    x (B, N, C) (any layout with channel stride 1); y (B, 1, L, C) text, mask its padding mask (or y the
    block's `TextKeys`, which hold the mask);
    modulation (B, 1, T, 6C); grid (T, h, w); left / segments: the FFN's segment-mode inputs (see
    `ffn_residual`); projected_plucker: the block's projection of plucker_emb, if made already
    (`attention_residual`). Returns (x', y_ffn) as `ffn_residual`.
    """
    if x.stride(-1) != 1:
        x = x.contiguous()  # block 0 receives the patch embedder's transposed view
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation_rows(block, modulation)
    fp8 = fp8_inputs(block, x)
    attn_in = ada_norm(x, shift_msa, scale_msa, eps=block.norm1.eps, backend=backend, quantize=fp8.attention,
                       keep=True)
    attn_in, attn_rows = attn_in if fp8.attention else (attn_in, None)
    attn_out = attend(attn_in, _rows(attn_rows, x))
    x = attention_residual(block, x, attn_out, gate_msa, plucker_emb, backend, quantize=fp8.cross_query,
                           projected=projected_plucker)
    if fp8.cross_query:  # the processor itself: the module's forward takes no query rows
        x, query_rows = x
        cross = block.cross_attn.processor(block.cross_attn, x, y, attention_mask=mask, query_rows=_rows(query_rows, x))
    else:
        cross = block.cross_attn(x, y, mask=mask)
    x, mlp_in = residual_ada_norm(x, cross, shift_mlp, scale_mlp, eps=block.norm2.eps, backend=backend,
                                  quantize=fp8.ffn)
    mlp_in = _rows(mlp_in, x) if fp8.ffn else mlp_in
    return ffn_residual(block, x, mlp_in, grid, gate_mlp, backend, left=left, segments=segments)


@dataclasses.dataclass(frozen=True)
class Fp8Inputs:
    """Which of a block's activations its glue kernels write quantized for the FP8 linears that read them (the
    bits of quantizing the written tensor, `camrender.model.fp8.QuantizedRows`): the attention's input (written
    in bf16 too: the camera branch and the GDN gates read it), the cross-attention's query input (the residual
    stream, which goes on in bf16) and the FFN's input."""

    attention: bool = False
    cross_query: bool = False
    ffn: bool = False


def fp8_inputs(block, x) -> Fp8Inputs:
    """The block's `Fp8Inputs` on activations like x: where every reader of an activation that may be FP8 is a
    row-scaled `Fp8Linear` run as its own forward (`camrender.model.fp8.takes_quantized`). Blocks without FP8
    linears: all False. The query rows go to the cross-attention's processor itself, past the module's call, so
    not where that call would run hooks."""
    attn, processor = block.attn, getattr(block.cross_attn, "processor", None)
    attention = isinstance(attn, (PatchedGDNAttention, PatchedSoftmaxAttention)) \
        and takes_quantized(input_linears(attn))
    cross = isinstance(processor, FusedCrossAttnProcessor) and not has_hooks(block.cross_attn) \
        and processor.takes_query_rows(block.cross_attn, x)
    ffn = ffn_input_linear(block.mlp)
    return Fp8Inputs(attention, cross, ffn is not None and takes_quantized([ffn]))


def _rows(quantized, like) -> Optional[QuantizedRows]:
    """A glue kernel's (q, scale) of rows shaped and typed like `like` (B, N, C) as a `QuantizedRows`; None: None."""
    return None if quantized is None else QuantizedRows(*quantized, tuple(like.shape[:-1]), like.dtype)


class PatchedBlock(SanaVideoMSCamCtrlBlock):
    """A SANA-WM block whose adaLN glue runs on `kernels.block_glue`; same call as the stock block.

    x (B, N, C), y (B, 1, L, C) text, t (B, 1, T, 6C) modulation; returns (B, N, C) contiguous.
    Segment mode adds `state` (this block's `BlockCache`, or None) and `segment` (the call's
    `SegmentCall`; THW is then not read); without a segment the call is one whole-clip segment under
    the attention's `full_options` (how diffusers' transformer forward calls it). `text_keys`: this
    block's `TextKeys` of y (`prepared_text`; y and mask are then not read by the cross-attention);
    `projected_plucker`: this block's projection of plucker_emb, made once for the call's passes
    (`camrender.model.stage1.segments.plucker_projections`).
    block_mask and chunk_size are not read.
    """

    settings: KernelSettings = KernelSettings()
    fixed_plucker = None  # (B_p, N, C) Plucker projection without bias, set by `fixed_plucker`

    @classmethod
    def adopt(cls, stock: SanaVideoMSCamCtrlBlock, settings: KernelSettings = KernelSettings()):
        block = adopt_module(cls, stock, settings=settings)
        if not isinstance(block.cross_attn.processor, FusedCrossAttnProcessor):
            block.cross_attn.set_processor(FusedCrossAttnProcessor())
        block.cross_attn.processor.backend = settings.backend
        return block

    def forward(self, x, y, t, mask=None, THW=None, rotary_emb=None, block_mask=None, camera_conditions=None,
                ucpe_ray_transforms=None, plucker_emb=None, frame_valid_mask=None, chunk_size=None, *,
                state: Optional[BlockCache] = None, segment: Optional[SegmentCall] = None,
                text_keys: Optional[TextKeys] = None, projected_plucker: Optional[torch.Tensor] = None):
        if frame_valid_mask is not None:
            # padded-frame masking belongs to training-time batching: diffusers' block code computes it
            return super().forward(x, y, t, mask, THW, rotary_emb, block_mask, camera_conditions,
                                   ucpe_ray_transforms, plucker_emb, frame_valid_mask, chunk_size)
        # diffusers' transformer forward calls a block with THW and no segment: one whole-clip segment
        call = segment if segment is not None else SegmentCall.whole(THW, self.attn.full_options)

        def attend(attn_in, attn_rows=None):
            rows = {} if attn_rows is None else {"x_rows": attn_rows}
            return self.attn(attn_in, rotary_emb=rotary_emb, camera_conditions=camera_conditions,
                             ucpe_ray_transforms=ucpe_ray_transforms, state=state, segment=call, **rows)

        text = y if text_keys is None else text_keys
        x, spatial = glue_forward(self, x, text, mask, t, call.grid, attend, plucker_emb, self.settings.backend,
                                  left=None if state is None else state.ffn_tail, segments=call.segments,
                                  projected_plucker=projected_plucker)
        if call.write:
            state.keep_ffn_tail(spatial, call)
        return x


def patch_block(block, settings: KernelSettings = KernelSettings()):
    """The patched block for `block` (updates its settings in place if already patched)."""
    if isinstance(block, PatchedBlock):
        block.settings = settings
        block.cross_attn.processor.backend = settings.backend
        return block
    return PatchedBlock.adopt(block, settings)
