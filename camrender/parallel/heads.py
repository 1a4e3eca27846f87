"""Tensor parallel over heads: every block of a patched SANA-WM transformer split over the N ranks
of a video group (Megatron-style).

Rank r of N keeps heads [r H/N, (r+1) H/N) of every attention and the matching share of every
FFN's hidden channels; the activations between blocks (the residual stream, adaLN glue,
embeddings, final layer) stay whole and identical on every rank.

- column split (no communication): the projections into heads (qkv, beta/gate projections,
  output gate, camera q/k/v, cross-attention q and kv), the per-channel short convolutions, the
  per-head gate parameters (A_log, dt_bias), the FFN's inverted and depthwise convs (value and gate
  halves alike, so the GLU pairs stay on one rank);
- row split, ONE all-reduce (sum) each, bias added once after it: the attention output `proj`,
  the cross-attention `proj`, the FFN point conv (the temporal conv then runs on the whole output);
- the camera branch's `out_proj_cam` feeds the elementwise output gate before `proj`, so it cannot
  fold into `proj`: the camera heads' output is all-gathered (each rank holds C/N channels) and
  `out_proj_cam` computes this rank's C/N output channels;
- RMSNorms over all C channels (q/k norms of every attention): the per-token sum of squares is
  all-reduced ((B, N) fp32, tiny) and handed to the fused kernels as an inverse RMS
  (`camrender.model.stage1.gdn_attention.norm_inv_rms`); on the PyTorch path `SplitRMSNorm` does the same.

The GDN scan states and the softmax K/V caches are per head, so segment mode's state passing
splits with them. Weights are sliced from the loaded model (a copy of this rank's share; the whole
tensors are freed once nothing else holds them). Per block and step: 3 all-reduces of (B, N, C)
(attention, cross-attention, FFN), one all-gather of (B, N, C) (camera branch) and six (B, N) ones
(the q/k norms of the main, camera and cross attentions).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from diffusers.models.transformers.transformer_sana_wm import GLUMBConvTemp
from torch import nn

from camrender.errors import CamrenderError


@dataclasses.dataclass(frozen=True)
class HeadSplit:
    """Rank `rank` of the `size` ranks of process group `group` that share every block's heads."""

    group: Any
    rank: int
    size: int

    def share(self, total: int) -> slice:
        """This rank's contiguous share of `total` (heads, channels) items."""
        part = total // self.size
        return slice(self.rank * part, (self.rank + 1) * part)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks, in place; returns x."""
        dist.all_reduce(x, group=self.group)
        return x

    def gather_channels(self, x: torch.Tensor) -> torch.Tensor:
        """(..., c) of every rank -> (..., size * c), rank order along the last dim."""
        x = x.contiguous()
        stacked = x.new_empty(self.size * x.shape[0], *x.shape[1:])  # the ranks' x one after the other
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.12 / before
        gather(stacked, x, group=self.group)
        stacked = stacked.view(self.size, *x.shape)
        return torch.movedim(stacked, 0, -2).reshape(*x.shape[:-1], self.size * x.shape[-1])


def check_heads(heads: int, size: int) -> None:
    """Raise CamrenderError unless `heads` split evenly over `size` ranks."""
    if size > 1 and heads % size:
        divisors = [d for d in range(2, heads + 1) if heads % d == 0]
        raise CamrenderError(f"the model's {heads} heads do not split over {size} GPUs per video; use "
                             f"{', '.join(map(str, divisors))} (or one GPU per video with camrender batch)",
                             field="gpus")


# ----------------------------------------------------------------------------- split modules
def _param(tensor: torch.Tensor) -> nn.Parameter:
    """A parameter owning a copy of `tensor` (so the whole tensor it was sliced from can be freed)."""
    return nn.Parameter(tensor.detach().clone(memory_format=torch.contiguous_format), requires_grad=False)


def _rows(tensor: torch.Tensor, parts) -> torch.Tensor:
    """The rows (dim 0) `parts` (slices) of `tensor`, concatenated."""
    return torch.cat([tensor[part] for part in parts]) if len(parts) > 1 else tensor[parts[0]]


def column_linear(linear: nn.Linear, parts) -> nn.Linear:
    """A Linear computing the output features `parts` (slices) of `linear`, in that order."""
    out = nn.Linear(linear.in_features, sum(p.stop - p.start for p in parts), bias=linear.bias is not None,
                    device="meta")
    out.weight = _param(_rows(linear.weight, parts))
    if linear.bias is not None:
        out.bias = _param(_rows(linear.bias, parts))
    return out


class RowSplitLinear(nn.Module):
    """`linear` with this rank's input features `cols`: x (..., c) -> the whole (..., out) output,
    the partial products summed over the ranks (one all-reduce), the bias added once after it."""

    def __init__(self, linear: nn.Linear, cols: slice, split: HeadSplit):
        super().__init__()
        self.split = split
        self.weight = _param(linear.weight[:, cols])
        self.bias = None if linear.bias is None else _param(linear.bias)

    def forward(self, x):
        y = self.split.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias.to(y.dtype)


class GatheredLinear(nn.Module):
    """`linear` computing this rank's output features `rows` from the whole input, of which every
    rank holds its share: x (..., c) -> (..., rows), one all-gather of x."""

    def __init__(self, linear: nn.Linear, rows: slice, split: HeadSplit):
        super().__init__()
        self.split = split
        self.weight = _param(linear.weight[rows])
        self.bias = None if linear.bias is None else _param(linear.bias[rows])

    def forward(self, x):
        return F.linear(self.split.gather_channels(x), self.weight, self.bias)


class SplitRMSNorm(nn.Module):
    """diffusers' RMSNorm over all C channels, applied to this rank's channels `cols`: the per-token
    sum of squares is summed over the ranks. `inv_rms(x)` gives the fused kernels that scale."""

    def __init__(self, norm: nn.Module, cols: slice, split: HeadSplit):
        super().__init__()
        self.split = split
        self.eps = norm.eps
        weight = getattr(norm, "weight", None)
        self.channels = norm.dim[-1] if isinstance(norm.dim, (tuple, list, torch.Size)) else norm.dim
        self.weight = None if weight is None else _param(weight[cols])
        if getattr(norm, "bias", None) is not None:
            raise CamrenderError("the head split supports RMSNorm without bias (the released models)", field="gpus")

    def inv_rms(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N) fp32 1 / RMS per token over all ranks' channels; x (B, N, ...) this rank's."""
        # the norm accumulates in fp32 without an fp32 copy of x (bf16 activations: two copies otherwise)
        accumulate = torch.promote_types(x.dtype, torch.float32)
        sumsq = torch.linalg.vector_norm(x.reshape(*x.shape[:2], -1), dim=-1, dtype=accumulate).square().float()
        return torch.rsqrt(self.split.all_reduce(sumsq) / self.channels + self.eps)

    def forward(self, x):
        y = x * self.inv_rms(x)[..., None]
        if self.weight is None:
            return y.to(x.dtype)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            y = y.to(self.weight.dtype)
        return y * self.weight


class RowSplitConv1x1(nn.Module):
    """A 1x1 conv with this rank's input channels: partial sums all-reduced, bias added once.
    `reduce_partial(y)` finishes a token-major product computed elsewhere (`camrender.model.stage1.ffn`)."""

    def __init__(self, conv: nn.Conv2d, cols: slice, split: HeadSplit):
        super().__init__()
        if conv.kernel_size != (1, 1) or conv.groups != 1:
            raise CamrenderError("the head split needs a 1x1 FFN point conv (the released models)", field="gpus")
        self.in_channels, self.out_channels = cols.stop - cols.start, conv.out_channels
        self.kernel_size, self.groups = conv.kernel_size, conv.groups
        self.split = split
        self.weight = _param(conv.weight[:, cols])
        self.bias = None if conv.bias is None else _param(conv.bias)

    def reduce_partial(self, y):
        """(..., C_out) partial products (no bias) -> summed over the ranks, plus the bias."""
        y = self.split.all_reduce(y)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def forward(self, x):
        y = self.split.all_reduce(F.conv2d(x, self.weight))
        return y if self.bias is None else y + self.bias.to(y.dtype)[:, None, None]


# ----------------------------------------------------------------------------- blocks
def _split_short_conv(conv, cols: slice):
    if conv is not None:
        conv.weight = _param(conv.weight[cols])
        if conv.bias is not None:
            conv.bias = _param(conv.bias[cols])
        conv.hidden_size = cols.stop - cols.start


def _split_per_head(attn, split: HeadSplit) -> None:
    """The per-head gates shared by the GDN and softmax attention modules."""
    heads = split.share(attn.heads)
    for name in ("beta_proj", "gate_proj"):
        if isinstance(getattr(attn, name, None), nn.Linear):
            setattr(attn, name, column_linear(getattr(attn, name), [heads]))
    for name in ("A_log", "dt_bias"):
        if isinstance(getattr(attn, name, None), torch.Tensor):
            setattr(attn, name, _param(getattr(attn, name)[heads]))


def _split_norm(module, name: str, cols: slice, split: HeadSplit) -> None:
    norm = getattr(module, name)
    if not isinstance(norm, nn.Identity):
        setattr(module, name, SplitRMSNorm(norm, cols, split))


def split_attention(attn, split: HeadSplit) -> None:
    """Split a GDN or softmax block attention (`BidirectionalGDNUCPESinglePathLiteLA`,
    `_SoftmaxUCPESinglePathLiteLA`, patched or not) in place; see the module docstring."""
    check_heads(attn.heads, split.size)
    channels = attn.heads * attn.dim
    cols = split.share(channels)
    attn.qkv = column_linear(attn.qkv, [slice(i * channels + cols.start, i * channels + cols.stop) for i in range(3)])
    for name in ("conv_q", "conv_k", "conv_v", "conv_q_cam", "conv_k_cam", "conv_v_cam"):
        _split_short_conv(getattr(attn, name, None), cols)
    for name in ("q_norm", "k_norm", "q_norm_cam", "k_norm_cam"):
        _split_norm(attn, name, cols, split)
    _split_per_head(attn, split)
    if getattr(attn, "output_gate", None) is not None:
        attn.output_gate = column_linear(attn.output_gate, [cols])
    for name in ("q_proj_cam", "k_proj_cam", "v_proj_cam"):
        setattr(attn, name, column_linear(getattr(attn, name), [cols]))
    attn.out_proj_cam = GatheredLinear(attn.out_proj_cam, cols, split)
    attn.proj = RowSplitLinear(attn.proj, cols, split)
    attn.heads = attn.cam_heads = attn.num_heads = attn.heads // split.size


def split_cross_attention(attn, split: HeadSplit) -> None:
    """Split a `MultiHeadCrossAttention` in place: q and kv by heads, `proj` by rows."""
    check_heads(attn.heads, split.size)
    channels = attn.heads * attn.head_dim
    cols = split.share(channels)
    attn.q_linear = column_linear(attn.q_linear, [cols])
    attn.kv_linear = column_linear(attn.kv_linear, [cols, slice(channels + cols.start, channels + cols.stop)])
    _split_norm(attn, "q_norm", cols, split)
    _split_norm(attn, "k_norm", cols, split)
    attn.proj = RowSplitLinear(attn.proj, cols, split)
    attn.heads //= split.size


def split_ffn(mlp, split: HeadSplit) -> None:
    """Split a `GLUMBConvTemp` in place: value and gate hidden channels by the same share, the
    point conv by rows; the temporal conv stays whole (it runs on the all-reduced output)."""
    hidden = mlp.point_conv.conv.in_channels
    if hidden % split.size:
        raise CamrenderError(f"the FFN's {hidden} hidden channels do not split over {split.size} GPUs", field="gpus")
    if mlp.point_conv.act is not None:
        raise CamrenderError("the head split needs an FFN point conv without activation (the released models)",
                             field="gpus")
    cols = split.share(hidden)
    pairs = [cols, slice(hidden + cols.start, hidden + cols.stop)]
    for layer in (mlp.inverted_conv.conv, mlp.depth_conv.conv):
        layer.weight = _param(_rows(layer.weight, pairs))
        if layer.bias is not None:
            layer.bias = _param(_rows(layer.bias, pairs))
        layer.out_channels = 2 * (cols.stop - cols.start)
        if layer.groups > 1:
            layer.groups = layer.in_channels = layer.out_channels
    mlp.point_conv.conv = RowSplitConv1x1(mlp.point_conv.conv, cols, split)


def split_transformer(transformer, split: HeadSplit):
    """Split every block of a (patched) SANA-WM transformer over `split`'s ranks, in place;
    returns the transformer. Splitting twice is refused (the model holds one rank's share)."""
    if getattr(transformer, "head_split", None) is not None:
        raise ValueError("this transformer is already split over heads")
    for block in transformer.blocks:
        check_heads(block.attn.heads, split.size)
    for block in transformer.blocks:
        split_attention(block.attn, split)
        split_cross_attention(block.cross_attn, split)
        if isinstance(block.mlp, GLUMBConvTemp):
            split_ffn(block.mlp, split)
        else:
            raise CamrenderError(f"the head split supports GLUMBConvTemp FFNs, not {type(block.mlp).__name__}",
                                 field="gpus")
    transformer.head_split = split
    return transformer
