"""Triton delta_scan (through the interpreter on CPU) against delta_scan_ref, on tiny shapes."""
import pytest
import torch

from camrender.kernels import delta_scan, delta_scan_ref
from helpers import rel

EXACT = dict(matmul_precision="ieee", output_final_state=True)  # exact fp32 products; the final state returned


def scan_inputs(batch=2, heads=2, frames=5, spatial=4, dk=16, dv=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(batch, heads, frames, spatial, dk, generator=gen)
    k = torch.rand(batch, heads, frames, spatial, dk, generator=gen) * (dk * spatial) ** -0.5
    v = torch.randn(batch, heads, frames, spatial, dv, generator=gen)
    beta = torch.rand(batch, heads, frames, spatial, generator=gen)
    decay = 0.5 + 0.5 * torch.rand(batch, heads, frames, generator=gen)
    state = torch.randn(batch, heads, dk, dv, generator=gen)
    return q, k, v, beta, decay, state


@pytest.mark.parametrize("frames", [1, 2, 5])
@pytest.mark.parametrize("dk,dv", [(16, 16), (24, 1)])
def test_delta_scan_matches_reference(frames, dk, dv):
    q, k, v, beta, decay, state = scan_inputs(frames=frames, dk=dk, dv=dv, seed=frames)
    starts = torch.zeros(frames, dtype=torch.bool)
    starts[frames // 2] = True
    for kwargs in (dict(), dict(initial_state=state, segment_starts=starts)):
        out, final = delta_scan(q, k, v, beta, decay, **EXACT, **kwargs)
        ref_out, ref_final = delta_scan_ref(q, k, v, beta, decay, output_final_state=True, **kwargs)
        assert out.shape == ref_out.shape and final.shape == ref_final.shape
        assert rel(out, ref_out) < 1e-5
        assert rel(final, ref_final) < 1e-5
        # not asked for, no final state (flash-linear-attention's convention), the same output
        unasked, no_state = delta_scan(q, k, v, beta, decay, matmul_precision="ieee", **kwargs)
        assert no_state is None and delta_scan_ref(q, k, v, beta, decay, **kwargs)[1] is None
        assert torch.equal(unasked, out)


def test_delta_scan_forward_only_and_strided_views():
    """reverse=False gives the forward pass alone; inputs may be permuted (B, N, H, D) views."""
    batch, heads, frames, spatial, dim = 1, 2, 3, 4, 16
    q, k, v, beta, decay, state = scan_inputs(batch, heads, frames, spatial, dim, dim, seed=3)

    def as_token_major(x):  # (B, H, T, S, D) -> same values in a (B, T, S, H, D) buffer, viewed back
        return x.permute(0, 2, 3, 1, 4).contiguous().permute(0, 3, 1, 2, 4)

    qv, kv, vv = (as_token_major(x) for x in (q, k, v))
    assert not qv.is_contiguous()
    out, final = delta_scan(qv, kv, vv, beta, decay, initial_state=state, reverse=False, **EXACT)
    ref_out, ref_final = delta_scan_ref(q, k, v, beta, decay, initial_state=state, reverse=False,
                                        output_final_state=True)
    assert rel(out, ref_out) < 1e-5 and rel(final, ref_final) < 1e-5
    both, _ = delta_scan_ref(q, k, v, beta, decay, initial_state=state)
    assert rel(out, both) > 1e-3  # the reverse pass really is left out


def test_split_and_resume_equals_unsplit():
    q, k, v, beta, decay, state = scan_inputs(frames=5, seed=4)
    whole, whole_state = delta_scan(q, k, v, beta, decay, initial_state=state, reverse=False, **EXACT)
    cut = 2
    first, mid_state = delta_scan(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut], beta[:, :, :cut],
                                  decay[:, :, :cut], initial_state=state, reverse=False, **EXACT)
    second, end_state = delta_scan(q[:, :, cut:], k[:, :, cut:], v[:, :, cut:], beta[:, :, cut:],
                                   decay[:, :, cut:], initial_state=mid_state, reverse=False, **EXACT)
    assert rel(torch.cat([first, second], dim=2), whole) < 1e-5
    assert rel(end_state, whole_state) < 1e-5


def test_reverse_mask_equals_separate_segments():
    """Cutting the reverse pass where a segment starts == scanning each segment on its own
    (the forward pass carried over through the state)."""
    q, k, v, beta, decay, state = scan_inputs(frames=5, seed=5)
    starts = torch.tensor([True, False, True, False, False])
    whole, whole_state = delta_scan(q, k, v, beta, decay, initial_state=state, segment_starts=starts,
                                    **EXACT)
    parts, carry = [], state
    for lo, hi in ((0, 2), (2, 5)):
        part, carry = delta_scan(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], beta[:, :, lo:hi],
                                 decay[:, :, lo:hi], initial_state=carry, **EXACT)
        parts.append(part)
    assert rel(torch.cat(parts, dim=2), whole) < 1e-5
    assert rel(carry, whole_state) < 1e-5
    unmasked, _ = delta_scan(q, k, v, beta, decay, initial_state=state, **EXACT)
    assert rel(unmasked, whole) > 1e-3  # the mask changes the result


def test_delta_scan_rejects_bad_arguments():
    q, k, v, beta, decay, state = scan_inputs(batch=1, heads=2, frames=3, spatial=4)
    with pytest.raises(ValueError, match=r"q must have shape \(1, 2, 3, 4, 16\)"):
        delta_scan(q[..., :8], k, v, beta, decay)
    with pytest.raises(ValueError, match=r"beta must have shape \(1, 2, 3, 4\)"):
        delta_scan(q, k, v, beta[..., :2], decay)
    with pytest.raises(ValueError, match=r"decay must have shape \(1, 2, 3\)"):
        delta_scan(q, k, v, beta, decay[None])
    with pytest.raises(ValueError, match=r"initial_state must have shape \(1, 2, 16, 16\)"):
        delta_scan(q, k, v, beta, decay, initial_state=state[..., :4])
    with pytest.raises(ValueError, match="contiguous last dimension"):
        delta_scan(q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v, beta, decay)
    with pytest.raises(ValueError, match="floating-point"):
        delta_scan(q, k, v.to(torch.int32), beta, decay)
    with pytest.raises(ValueError, match=r"segment_starts must have shape \(3,\)"):
        delta_scan(q, k, v, beta, decay, segment_starts=torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="matmul_precision"):
        delta_scan(q, k, v, beta, decay, matmul_precision="fp8")
    with pytest.raises(ValueError, match="backend"):
        delta_scan(q, k, v, beta, decay, backend="cuda")


@pytest.mark.parametrize("dk,dv", [(32, 32), (32, 1), (64, 48)])
def test_transition_column_blocks_keep_the_scan(dk, dv):
    """col_split: the transition kernel's programs each build a block of W_t's and U_t's columns (U_t's blocks
    keep 16 columns: a one-column value, the GDN's Z stream, has one block). The scan is the reference's, and
    interpreted its bits are the unsplit kernel's."""
    q, k, v, beta, decay, state = scan_inputs(frames=3, spatial=5, dk=dk, dv=dv, seed=dk + dv)
    kwargs = dict(initial_state=state, **EXACT)
    want, want_final = delta_scan(q, k, v, beta, decay, **kwargs)
    ref_out, ref_final = delta_scan_ref(q, k, v, beta, decay, initial_state=state, output_final_state=True)
    for col_split in (2, 4) if dk // 4 >= 16 else (2,):
        out, final = delta_scan(q, k, v, beta, decay, col_split=col_split, **kwargs)
        assert rel(out, ref_out) < 1e-5 and rel(final, ref_final) < 1e-5
        assert torch.equal(out, want) and torch.equal(final, want_final)
    with pytest.raises(ValueError, match="col_split"):
        delta_scan(q, k, v, beta, decay, col_split=3, **kwargs)
