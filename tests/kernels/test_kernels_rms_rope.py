"""kernels.rms_rope (the refiner's q/k RMSNorm + RoPE in one pass) and block_glue's norm="rms" against
their references and diffusers' own ops (CPU, Triton interpreter from conftest)."""
import pytest
import torch
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_sana_wm_refiner import (
    apply_interleaved_rotary_emb,
    apply_split_rotary_emb,
)

from camrender.kernels.block_glue import ada_norm, residual_ada_norm
from camrender.kernels.block_glue_reference import ada_norm_ref
from camrender.kernels.rms_rope import rms_rope_qk, rope_rows
from camrender.kernels.rms_rope_reference import rms_rope_qk_ref, rope_rows_ref

HEADS, HEAD_DIM = 3, 8
CHANNELS = HEADS * HEAD_DIM  # 24: not a power of two, so the kernels' masks are exercised


def tables(rope_type, batch=1, tokens=10, seed=0):
    """(cos, sin) in diffusers' layout for rope_type, fp32, with some padded (cos 1, sin 0) pairs."""
    g = torch.Generator().manual_seed(seed)
    angles = torch.randn(batch, tokens, CHANNELS // 2, generator=g) * 3
    angles[..., :1] = 0.0
    if rope_type == "interleaved":
        return angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    per_head = angles.reshape(batch, tokens, HEADS, -1)
    return per_head.cos().swapaxes(1, 2), per_head.sin().swapaxes(1, 2)  # (B, H, N, D/2) views, as diffusers


def qk(batch=1, tokens=10, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, tokens, CHANNELS, generator=g) * 3).to(dtype)
    k = torch.randn(batch, tokens, CHANNELS, generator=g).to(dtype)
    weights = [(1 + 0.2 * torch.randn(CHANNELS, generator=g)).to(dtype) for _ in range(2)]
    return q, k, weights


def stock(x, weight, cos, sin, rope_type):
    """diffusers' processor: torch.nn.RMSNorm, then apply_*_rotary_emb."""
    norm = torch.nn.RMSNorm(CHANNELS, eps=1e-6).to(x.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        normed = norm(x)
    rotate = apply_interleaved_rotary_emb if rope_type == "interleaved" else apply_split_rotary_emb
    return rotate(normed, (cos, sin)), normed


@pytest.mark.parametrize("rope_type", ["interleaved", "split"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_equals_diffusers(rope_type, dtype):
    q, k, (wq, wk) = qk(dtype=dtype)
    cos, sin = tables(rope_type)
    got_q, got_k, got_pre = rms_rope_qk_ref(q, k, wq, wk, cos, sin, eps=1e-6, rope_type=rope_type)
    want_q, _ = stock(q, wq, cos, sin, rope_type)
    want_k, want_pre = stock(k, wk, cos, sin, rope_type)
    rotate = apply_interleaved_rotary_emb if rope_type == "interleaved" else apply_split_rotary_emb
    pairs = ((got_q, want_q), (got_k, want_k), (got_pre, want_pre), (rope_rows_ref(q, cos, sin, rope_type=rope_type),
                                                                     rotate(q, (cos, sin))))
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6 if dtype == torch.float32 else 0)


@pytest.mark.parametrize("rope_type", ["interleaved", "split"])
def test_fp32_kernel_equals_reference(rope_type):
    batch, tokens = 2, 10
    q, k, (wq, wk) = qk(batch, tokens)
    cos, sin = tables(rope_type, batch, tokens)
    window = torch.full((batch, 3 + tokens + 4, CHANNELS), float("nan"))  # k lands in a slice of a wider buffer
    got_q, got_k, got_pre = rms_rope_qk(q, k, wq, wk, cos, sin, eps=1e-6, head_dim=HEAD_DIM, rope_type=rope_type,
                                        k_out=window[:, 3:3 + tokens], return_k_pre=True, backend="triton")
    want = rms_rope_qk_ref(q, k, wq, wk, cos, sin, eps=1e-6, rope_type=rope_type)
    assert got_k.data_ptr() == window[:, 3].data_ptr()
    for got, expected in zip((got_q, got_k, got_pre), want):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert window[:, :3].isnan().all() and window[:, 3 + tokens:].isnan().all()  # nothing else written


@pytest.mark.parametrize("rope_type", ["interleaved", "split"])
def test_bf16_kernel_within_the_references_rounding(rope_type):
    """bf16: each output is within one bf16 unit (of its row's scale: a flipped rounding of the normalised
    value moves the rotated one by that) of the reference's, and as close to the fp64 truth."""
    q, k, (wq, wk) = qk(tokens=32, dtype=torch.bfloat16)
    cos, sin = tables(rope_type, tokens=32)
    got = rms_rope_qk(q, k, wq, wk, cos, sin, eps=1e-6, head_dim=HEAD_DIM, rope_type=rope_type, return_k_pre=True,
                      backend="triton")
    ref = rms_rope_qk_ref(q, k, wq, wk, cos, sin, eps=1e-6, rope_type=rope_type)
    truth = rms_rope_qk_ref(q.double(), k.double(), wq.double(), wk.double(), cos.double(), sin.double(), eps=1e-6,
                            rope_type=rope_type)
    for out, expected, exact in zip(got, ref, truth):
        assert out.dtype == torch.bfloat16
        unit = torch.finfo(torch.bfloat16).eps * expected.double().abs().amax(-1, keepdim=True)
        assert ((out.double() - expected.double()).abs() <= unit).all()
        assert (out != expected).float().mean() <= 0.02  # the same rounding points: almost all bit-equal
        err, ref_err = (out.double() - exact).norm(), (expected.double() - exact).norm()
        assert err <= 1.1 * ref_err, (err, ref_err)


@pytest.mark.parametrize("rope_type", ["interleaved", "split"])
def test_rope_rows_writes_the_sink_slot(rope_type):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 4, CHANNELS, generator=g)
    cos, sin = tables(rope_type, tokens=4, seed=3)
    window = torch.zeros(1, 9, CHANNELS)
    out = rope_rows(x, cos, sin, head_dim=HEAD_DIM, rope_type=rope_type, out=window[:, :4], backend="triton")
    rotate = apply_interleaved_rotary_emb if rope_type == "interleaved" else apply_split_rotary_emb
    torch.testing.assert_close(out, rotate(x, (cos, sin)), rtol=1e-6, atol=1e-6)
    assert torch.equal(window[:, :4], out) and not window[:, 4:].any()


def test_bad_tables_are_named():
    q, k, (wq, wk) = qk()
    cos, sin = tables("interleaved")
    with pytest.raises(ValueError, match="interleaved cos must have shape"):
        rms_rope_qk(q, k, wq, wk, cos[:, :5], sin[:, :5], eps=1e-6, head_dim=HEAD_DIM)
    with pytest.raises(ValueError, match="rope_type"):
        rms_rope_qk(q, k, wq, wk, cos, sin, eps=1e-6, head_dim=HEAD_DIM, rope_type="spiral")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_glue_equals_the_refiner_blocks_ops(dtype):
    """ada_norm(norm="rms") and residual_ada_norm: diffusers' RMSNorm (no weight) and the refiner block's
    `* (1 + scale) + shift` with one modulation row per batch (the stream's (1, 1) timestep)."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(2, 12, CHANNELS, generator=g) * 2).to(dtype)
    r = torch.randn(2, 12, CHANNELS, generator=g).to(dtype)
    shift, scale = (torch.randn(2, 1, 2, CHANNELS, generator=g) * 0.5).to(dtype).unbind(2)
    norm = RMSNorm(CHANNELS, eps=1e-6, elementwise_affine=False)
    stock_mod = norm(x) * (1 + scale) + shift
    assert torch.equal(ada_norm_ref(x, shift, scale, norm="rms"), stock_mod)
    assert torch.equal(ada_norm_ref(x, None, None, norm="rms"), norm(x))
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=8e-3, atol=8e-3)  # bf16: 1 unit
    torch.testing.assert_close(ada_norm(x, shift, scale, norm="rms", backend="triton"), stock_mod, **tol)
    torch.testing.assert_close(ada_norm(x, None, None, norm="rms", backend="triton"), norm(x), **tol)
    updated, normed = residual_ada_norm(x, r, shift, scale, norm="rms", backend="triton")
    assert torch.equal(updated, x + r)
    torch.testing.assert_close(normed, norm(x + r) * (1 + scale) + shift, **tol)
