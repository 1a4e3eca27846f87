"""Attention over key parts merged by log-sum-exp (`camrender.model.refiner.lse_attention`) equals one attention over
the concatenated keys: PyTorch on the CPU here; each CUDA kernel of `LSE_BACKENDS` in the GPU suite."""
import pytest
import torch
import torch.nn.functional as F

from camrender.model.refiner import lse_attention
from camrender.model.refiner.lse_attention import attend_parts, attention_math, merge_parts


def qkv_parts(lengths, queries=5, heads=3, dim=8, dtype=torch.float32, device="cpu", scale=1.0, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return (torch.randn(*shape, generator=generator) * scale).to(device, dtype)

    q = draw(2, heads, queries, dim)
    return q, [(draw(2, heads, m, dim), draw(2, heads, m, dim)) for m in lengths]


def reference(q, parts):
    """Attention over the concatenated parts in float64."""
    k = torch.cat([k for k, _ in parts], dim=2).double()
    v = torch.cat([v for _, v in parts], dim=2).double()
    return F.scaled_dot_product_attention(q.double(), k, v)


def one_attention(q, parts):
    """One SDPA call over the concatenated parts, in q's dtype."""
    return F.scaled_dot_product_attention(q, torch.cat([k for k, _ in parts], 2), torch.cat([v for _, v in parts], 2))


@pytest.mark.parametrize("lengths", [[7, 4], [11, 1, 6], [1, 1]])
def test_parts_equal_the_concatenated_attention(lengths):
    q, parts = qkv_parts(lengths)
    got = attend_parts(q, parts)
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got.double(), reference(q, parts), rtol=1e-6, atol=1e-6)


def test_log_sum_exp_is_the_scores_one():
    q, [(k, v)] = qkv_parts([9])
    out, lse = attention_math(q, k, v)
    scores = q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, dim=-1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.double(), reference(q, [(k, v)]), rtol=1e-6, atol=1e-6)


def test_merge_is_stable_for_large_scores():
    """Scores in the hundreds: exp overflows fp32, the merge by differences of log-sum-exps does not."""
    q, parts = qkv_parts([6, 5], scale=12.0)
    got = attend_parts(q, parts)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), reference(q, parts), rtol=1e-5, atol=1e-5)


def test_bfloat16_parts_round_like_one_call():
    q, parts = qkv_parts([40, 12], dtype=torch.bfloat16, dim=16)
    got = attend_parts(q, parts)
    assert got.dtype == torch.bfloat16
    exact = reference(q, parts)
    one_call = one_attention(q, parts)
    error = (got.double() - exact).abs().max()
    assert error <= 2 * (one_call.double() - exact).abs().max() + 2 ** -9  # within bf16 rounding of one call


def test_merge_weights_follow_the_parts_mass():
    """A part whose log-sum-exp is far below the other's contributes nothing."""
    out_a, out_b = torch.ones(1, 1, 2, 3), torch.full((1, 1, 2, 3), 5.0)
    merged = merge_parts([(out_a, torch.zeros(1, 1, 2)), (out_b, torch.full((1, 1, 2), -200.0))])
    assert torch.equal(merged, out_a)
    even = merge_parts([(out_a, torch.zeros(1, 1, 2)), (out_b, torch.zeros(1, 1, 2))])
    assert torch.equal(even, torch.full((1, 1, 2, 3), 3.0))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", lse_attention.LSE_BACKENDS)
def test_each_cuda_kernel_equals_the_concatenated_attention(backend):
    """Each fused kernel alone, at the refiner's head dim in bf16: the kernel really ran (not refused: its log-sum-exp
    layout is read right) and the merge lands within bf16 rounding of one attention call over all the keys."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    lse_attention._refused.clear()
    q, parts = qkv_parts([1100, 264], queries=264, heads=4, dim=128, dtype=torch.bfloat16, device="cuda")
    out, lse = lse_attention.attention_with_lse(q, *parts[0], backends=(backend,))
    assert not lse_attention._refused, f"{backend} refused the inputs"
    _, exact_lse = attention_math(q, *parts[0])
    torch.testing.assert_close(lse, exact_lse, rtol=1e-3, atol=1e-2)
    got = attend_parts(q, parts, backends=(backend,))
    exact = reference(q, parts)
    one_call = one_attention(q, parts)
    assert (got.double() - exact).abs().max() <= 2 * (one_call.double() - exact).abs().max() + 2 ** -9


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_refiner_window_on_cuda_equals_the_stock_blocks(dtype):
    """The tiny refiner on CUDA (kernels compiled): the fused path, its window attended to apart from the block and
    merged, against diffusers' stock blocks (one SDPA over the concatenated window) on the same clip; in bf16 within
    the stock blocks' own distance under a one-ulp change of the clip (the agreement bar of bench_refiner.py)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from camrender.model.refiner.stream import RefinerStream, encode_refiner_prompt
    from camrender.model.refiner.tiny import build_tiny_refiner

    refiner = build_tiny_refiner(seed=5).to("cuda", dtype)
    clip = torch.randn(1, 8, 1 + 3 * 5 + 2, 4, 6, generator=torch.Generator().manual_seed(1)).to("cuda", dtype)
    text = encode_refiner_prompt(refiner, "a hall", "cuda", dtype)

    def refine(kernels, frames):
        stream = RefinerStream(refiner, text, fps=16.0, generator=torch.Generator().manual_seed(2), kernels=kernels)
        pieces = [stream.push(frames[:, :, :4]), stream.push(frames[:, :, 4:]), stream.finish()]
        return torch.cat(pieces, 2).float()

    def distance(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()

    stock, fused = refine("torch", clip), refine("fused", clip)
    if dtype == torch.float32:
        assert distance(fused, stock) <= 1e-4
    else:
        floor = distance(refine("torch", torch.nextafter(clip, torch.full_like(clip, float("inf")))), stock)
        assert 0 < floor and distance(fused, stock) <= 2 * floor
