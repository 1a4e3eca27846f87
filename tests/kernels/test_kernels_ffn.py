"""Fused FFN of SANA-WM blocks: kernels.ffn_glu (GLU depthwise stage) and camrender.model.stage1.ffn.

CPU, Triton interpreter (conftest), tiny shapes. The kernel is checked against its PyTorch
reference (odd image sizes, channel counts that are not multiples of the block, several column
chunks, fp32 and bf16); the patched module against diffusers' stock `GLUMBConvTemp` on the same
random weights; `ffn_parts` with segments and a cached left frame against a direct per-frame
computation of the chunk-causal rule.
"""
import pytest
import torch
from diffusers.models.transformers.transformer_sana_wm import GLUMBConvTemp

from camrender.kernels.ffn_glu import glu_depthwise
from camrender.kernels.ffn_glu_reference import glu_depthwise_ref
from camrender.model.settings import KernelSettings
from camrender.model.stage1 import ffn
from camrender.model.stage1.ffn import PatchedGLUMBConvTemp, ffn_parts, patch_ffn
from helpers import rel, temporal_conv_exact


def _mlp(seed, channels=8, hidden=12, use_bias=(True, True, True), act=("silu", "silu", None)):
    """A stock GLUMBConvTemp with random weights (biases included)."""
    gen = torch.Generator().manual_seed(seed)
    mlp = GLUMBConvTemp(channels, hidden, use_bias=use_bias, act=act, t_kernel_size=3)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.4 if p.ndim > 1 else 0.2))
    return mlp.eval()


@pytest.mark.parametrize(
    "frames, height, width, hidden, dtype, bias, tuning",
    [
        (3, 5, 7, 12, torch.float32, True, None),  # 12 channels: second block of 16 half empty
        (2, 3, 9, 10, torch.float32, False, {"lanes": 8, "block_c": 8, "prefetch": 1}),  # 2 column chunks
        (2, 4, 5, 9, torch.bfloat16, True, {"block_c": 8}),  # odd channel count, bf16 in and out
        (4, 1, 1, 3, torch.float32, True, None),  # single-pixel images: every neighbour is padding
        (2, 4, 3, 6, torch.float32, True, {"block_c": 8, "prefetch": 2}),  # two rows loaded ahead
    ],
)
def test_glu_depthwise_matches_reference(frames, height, width, hidden, dtype, bias, tuning):
    gen = torch.Generator().manual_seed(frames * 100 + hidden)
    h = (torch.randn(frames, height * width, 2 * hidden, generator=gen) * 2).to(dtype)
    weight = torch.randn(2 * hidden, 1, 3, 3, generator=gen).to(dtype)
    b = torch.randn(2 * hidden, generator=gen).to(dtype) if bias else None
    out = torch.full((frames, height * width, hidden), float("nan"), dtype=dtype)  # every element must be written

    got = glu_depthwise(h, weight, b, height, width, out=out, backend="triton", tuning=tuning)
    assert got is out and got.dtype == dtype
    expected = glu_depthwise_ref(h.float(), weight.float(), None if b is None else b.float(), height, width)
    assert torch.isfinite(got).all()
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    else:  # one bf16 rounding of the fp32 result
        assert ((got.float() - expected).abs() <= expected.abs() * 2.0**-7 + 1e-5).all()
        # the reference itself, on bf16 inputs, is the fp32 one rounded once
        assert torch.equal(glu_depthwise_ref(h, weight, b, height, width), expected.to(dtype))


def test_glu_depthwise_reference_is_the_stock_chain():
    """The reference equals diffusers' inverted act -> depth_conv -> chunk -> value * glu_act(gate)."""
    mlp = _mlp(5)
    frames, height, width = 3, 4, 5
    h = torch.randn(frames, height * width, 24, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        images = mlp.inverted_conv.act(h.reshape(frames, height, width, 24).permute(0, 3, 1, 2))
        value, gate = mlp.depth_conv(images).chunk(2, dim=1)
        stock = (value * mlp.glu_act(gate)).permute(0, 2, 3, 1).reshape(frames, height * width, 12)
        ref = glu_depthwise_ref(h, mlp.depth_conv.conv.weight, mlp.depth_conv.conv.bias, height, width)
    torch.testing.assert_close(ref, stock, rtol=1e-5, atol=1e-6)


def test_glu_depthwise_rejects_bad_shapes():
    h = torch.randn(2, 12, 8)
    with pytest.raises(ValueError, match="height \\* width"):
        glu_depthwise(h, torch.randn(8, 1, 3, 3), None, 3, 5)
    with pytest.raises(ValueError, match="weight"):
        glu_depthwise(h, torch.randn(8, 1, 5, 5), None, 3, 4)


@pytest.mark.parametrize("seed", [0, 1])
def test_patched_ffn_matches_stock(seed):
    mlp = _mlp(seed)
    batch, frames, height, width = 2, 3, 3, 5
    x = torch.randn(batch, frames * height * width, 8, generator=torch.Generator().manual_seed(seed + 10))
    with torch.no_grad():
        stock = mlp(x, HW=(frames, height, width))
        patched = PatchedGLUMBConvTemp.adopt(mlp, KernelSettings.from_kernels("fused"))
        fused = patched(x, HW=(frames, height, width))
        y, z = ffn_parts(patched, x, frames, height, width, backend="torch")
        patched.settings = KernelSettings.from_kernels("torch")
        torch_mode = patched(x, HW=(frames, height, width))
    assert fused.shape == stock.shape and fused.dtype == stock.dtype
    assert rel(fused, stock) < 1e-5
    assert rel(y + z, stock) < 1e-5
    assert rel(z, stock) > 1e-2  # the temporal term is really there
    assert torch.equal(torch_mode, stock)


def test_adopt_keeps_the_state_dict_and_shares_parameters():
    mlp = _mlp(2)
    parameters = dict(mlp.named_parameters())
    before = {k: v.clone() for k, v in mlp.state_dict().items()}
    pointers = {k: v.data_ptr() for k, v in mlp.state_dict().items()}
    patched = patch_ffn(mlp, KernelSettings.from_kernels("fused"))
    after = patched.state_dict()
    assert isinstance(patched, PatchedGLUMBConvTemp) and isinstance(patched, GLUMBConvTemp)
    assert list(after) == list(before)
    assert all(patched.get_parameter(k) is p for k, p in parameters.items())  # the stock module's own
    assert all(torch.equal(after[k], before[k]) for k in before)
    # the temporal kernel is laid out channels-last once (the same parameter); nothing else moves
    assert patched.t_conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert all(after[k].data_ptr() == pointers[k] for k in before if k != "t_conv.weight")
    torch_settings = KernelSettings.from_kernels("torch")
    assert patch_ffn(patched, torch_settings) is patched and patched.settings == torch_settings
    with pytest.raises(TypeError):
        patch_ffn(torch.nn.Linear(2, 2))


def _stock_spatial(mlp, x, frames, height, width):
    """y (B, T, S, C) from the stock spatial convs (channels-first)."""
    batch, _, channels = x.shape
    images = x.reshape(batch * frames, height, width, channels).permute(0, 3, 1, 2)
    value, gate = mlp.depth_conv(mlp.inverted_conv(images)).chunk(2, dim=1)
    y = mlp.point_conv(value * mlp.glu_act(gate))
    return y.permute(0, 2, 3, 1).reshape(batch, frames, height * width, channels)


def _chunk_causal_temporal(mlp, y, left, segments):
    """z[t] = W0 y[t-1] + W1 y[t] + W2 y[t+1]: y[t-1] is `left` (or 0) before frame 0 and the previous
    frame otherwise; y[t+1] is 0 past the end of t's segment."""
    weight = mlp.t_conv.weight[:, :, :, 0]  # (C_out, C_in, 3)
    z = torch.zeros_like(y)
    for start, stop in segments:
        for t in range(start, stop):
            prev = y[:, t - 1] if t > 0 else (left[:, 0] if left is not None else torch.zeros_like(y[:, 0]))
            nxt = y[:, t + 1] if t + 1 < stop else torch.zeros_like(y[:, 0])
            z[:, t] = prev @ weight[:, :, 0].T + y[:, t] @ weight[:, :, 1].T + nxt @ weight[:, :, 2].T
    return z


@pytest.mark.parametrize("gemm_frames", [0, 8], ids=["conv", "gemms"])
@pytest.mark.parametrize(
    "segments, with_left",
    [([(0, 2), (2, 3), (3, 5)], True), ([(0, 5)], True), ([(0, 1), (1, 5)], False), ([(0, 5)], False)],
)
def test_ffn_parts_follows_the_segment_rule(segments, with_left, gemm_frames, monkeypatch):
    """Both temporal paths: the convolution (longer calls) and the GEMMs per tap (calls of a few frames)."""
    monkeypatch.setattr(ffn, "TEMPORAL_GEMM_MAX_FRAMES", gemm_frames)
    mlp = _mlp(3)
    batch, frames, height, width = 2, 5, 2, 3
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(batch, frames * height * width, 8, generator=gen)
    left = torch.randn(batch, 1, height * width, 8, generator=gen) if with_left else None
    with torch.no_grad():
        y, z = ffn_parts(mlp, x, frames, height, width, left=left, segments=segments)
        y_ref = _stock_spatial(mlp, x, frames, height, width)
        z_ref = _chunk_causal_temporal(mlp, y_ref, left, segments)
    torch.testing.assert_close(y, y_ref.reshape(y.shape), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(z, z_ref.reshape(z.shape), rtol=1e-5, atol=1e-5)


def test_temporal_gemms_round_bf16_near_a_single_rounding(monkeypatch):
    """In bf16 the GEMMs per tap round z after each product (cuBLAS sums each in fp32): on a segment call with a
    cached left frame, z stays within 1.6x (RMS) of one rounding of the exact result, as the convolution does."""
    channels, spatial = 128, 48
    gen = torch.Generator().manual_seed(11)
    mlp = _mlp(12, channels=channels, hidden=16)
    with torch.no_grad():
        mlp.t_conv.weight.mul_(1 / (3 * channels) ** 0.5)
    ffn.channels_last_kernel(mlp.bfloat16())
    y = torch.randn(1, 3, spatial, channels, generator=gen).bfloat16()
    left = torch.randn(1, 1, spatial, channels, generator=gen).bfloat16()
    exact = temporal_conv_exact(mlp.t_conv.weight, y, left)
    floor = (exact.bfloat16().double() - exact).norm() / exact.norm()
    for gemm_frames in (0, 8):
        monkeypatch.setattr(ffn, "TEMPORAL_GEMM_MAX_FRAMES", gemm_frames)
        z = ffn._temporal(mlp, y, left, [(0, 3)])
        assert z.dtype == torch.bfloat16
        assert (z.double() - exact).norm() / exact.norm() < 1.6 * floor


def test_segment_ffn_carries_the_last_frame():
    """Segment mode's FFN (`ffn_residual` with the cached left frame, `BlockCache.keep_ffn_tail`):
    two cached calls equal one two-segment call over all frames."""
    from types import SimpleNamespace

    from camrender.model.stage1.block import ffn_residual
    from camrender.model.stage1.state import BlockCache, SegmentCall

    block = SimpleNamespace(mlp=_mlp(4))
    batch, height, width = 1, 2, 3
    spatial = height * width
    g = torch.Generator().manual_seed(8)
    x, residual = (torch.randn(batch, 5 * spatial, 8, generator=g) for _ in range(2))
    gate = torch.randn(batch, 5, 8, generator=g)

    def run(start, stop, segments, cache, write):
        call = SegmentCall(stop - start, height, width, tuple(segments), write)
        tokens = slice(start * spatial, stop * spatial)
        out, y = ffn_residual(block, residual[:, tokens], x[:, tokens], (stop - start, height, width),
                              gate[:, start:stop], "auto", left=cache.ffn_tail, segments=segments)
        if write:
            cache.keep_ffn_tail(y, call)
        return out

    with torch.no_grad():
        dense = run(0, 5, [(0, 2), (2, 5)], BlockCache(), False)
        cache = BlockCache()
        first = run(0, 2, [(0, 2)], cache, True)
        assert cache.ffn_tail.shape == (batch, 1, spatial, 8)
        second = run(2, 5, [(0, 3)], cache, False)
    torch.testing.assert_close(torch.cat([first, second], dim=1), dense, rtol=1e-5, atol=1e-5)


def test_unfused_activation_layout_falls_back_to_the_stock_convs():
    mlp = _mlp(6, act=("relu", "silu", "silu"))
    x = torch.randn(2, 3 * 2 * 2, 8, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        y, z = ffn_parts(mlp, x, 3, 2, 2)
        stock = mlp(x, HW=(3, 2, 2))
    torch.testing.assert_close(y + z, stock, rtol=1e-5, atol=1e-5)


def test_ffn_parts_rejects_bad_segments_and_left():
    mlp = _mlp(0)
    x = torch.randn(1, 3 * 4, 8)
    with pytest.raises(ValueError, match="tile"):
        ffn_parts(mlp, x, 3, 2, 2, segments=[(0, 2)])
    with pytest.raises(ValueError, match="left"):
        ffn_parts(mlp, x, 3, 2, 2, left=torch.zeros(1, 1, 3, 8))
