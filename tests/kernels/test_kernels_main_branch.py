"""Fused main GDN branch (kernels.main_prep, kernels.main_branch) against diffusers (CPU interpreter, ieee)."""
import torch
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_sana_wm import (
    SanaWMBidirectionalGDNAttention,
    SanaWMRotaryPosEmbed,
    _apply_rotary_emb,
)

from camrender.kernels.main_branch import main_branch
from camrender.kernels.main_prep import main_prep
from camrender.kernels.main_branch_reference import main_branch_ref
from camrender.kernels.main_prep_reference import main_prep_ref
from helpers import rel


def _inputs(seed, batch=2, frames=4, hw=(2, 3), heads=2, head_dim=24):
    gen = torch.Generator().manual_seed(seed)
    spatial, channels = hw[0] * hw[1], heads * head_dim
    tokens = frames * spatial
    qkv = torch.randn(batch, tokens, 3 * channels, generator=gen)
    q, k, v = qkv[..., :channels], qkv[..., channels:2 * channels], qkv[..., 2 * channels:]
    # gates in the layouts the block produces: permuted / transposed views
    beta = torch.rand(batch, frames, spatial, heads, generator=gen).permute(0, 3, 1, 2)
    decay = (0.3 + 0.7 * torch.rand(batch, frames, heads, generator=gen)).transpose(1, 2)
    weights = [1 + 0.3 * torch.randn(channels, generator=gen) for _ in range(2)]
    rope = SanaWMRotaryPosEmbed(head_dim, (1, 1, 1), 64)((frames, *hw))
    return q, k, v, beta, decay, rope, weights


def _diffusers_main(q, k, v, beta, decay, rope, weights, frames, heads):
    batch, tokens, channels = v.shape
    shape = (batch, tokens, heads, channels // heads)
    q_norm, k_norm = RMSNorm(channels, 1e-5), RMSNorm(channels, 1e-5)
    q_norm.weight.data, k_norm.weight.data = weights
    query = torch.relu(q_norm(q)).reshape(shape)
    key = torch.relu(k_norm(k)).reshape(shape)
    attn = SanaWMBidirectionalGDNAttention(eps=1e-8)
    return attn(query, key, v.reshape(shape), beta, decay, torch.zeros(1), frames, rotary_emb=rope)


def test_main_prep_matches_rmsnorm_relu_and_rope():
    q, k, _, _, _, rope, (w, _) = _inputs(0, heads=3, head_dim=16)
    batch, tokens, channels = q.shape
    norm = RMSNorm(channels, 1e-5)
    norm.weight.data = w
    with torch.no_grad():
        want = torch.relu(norm(q)) * 0.25
        assert rel(main_prep(q, w, 3, scale=0.25), want) < 1e-6
        assert rel(main_prep_ref(q, w, 3, scale=0.25), want) < 1e-6
        heads_last = norm(k).reshape(batch, tokens, 3, 16)
        rotated = _apply_rotary_emb(heads_last.permute(0, 2, 3, 1), rope).permute(0, 3, 1, 2).reshape(q.shape)
        assert rel(main_prep(k, w, 3, relu=False, rope=rope), rotated) < 1e-6
        assert rel(main_prep_ref(k, w, 3, relu=False, rope=rope), rotated) < 1e-6


def test_main_prep_rounds_as_diffusers_in_bf16():
    """bf16 weights: the RMSNorm output, the scaled key and the rotated pairs are rounded where
    diffusers writes them, so the kernel (and the reference) reproduce the stock bits: RMSNorm,
    ReLU, `key * scale`, `_apply_rotary_emb`, each on bf16 tensors."""
    q, _, _, _, _, rope, (w, _) = _inputs(3, heads=3, head_dim=16)
    batch, tokens, channels = q.shape
    q, w = q.bfloat16(), w.bfloat16()
    norm = RMSNorm(channels, 1e-5).bfloat16()
    norm.weight.data = w
    scale = 16 ** -0.5 * 6 ** -0.5
    with torch.no_grad():
        key = torch.relu(norm(q)) * scale
        rotated = _apply_rotary_emb(key.reshape(batch, tokens, 3, 16).permute(0, 2, 3, 1), rope)
        rotated = rotated.permute(0, 3, 1, 2).reshape(q.shape)
        plain, rot = main_prep(q, w, 3, scale=scale, rope=rope, keep_unrotated=True)
    for got, want in ((plain, key), (rot, rotated), (main_prep_ref(q, w, 3, scale=scale), key),
                      (main_prep_ref(q, w, 3, scale=scale, rope=rope), rotated)):
        assert got.dtype == torch.bfloat16
        assert (got != want).float().mean() < 0.01  # fp32 sums in another order may tip a rare element
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=0)


def test_main_branch_matches_diffusers():
    q, k, v, beta, decay, rope, weights = _inputs(0)
    with torch.no_grad():
        want = _diffusers_main(q, k, v, beta, decay, rope, weights, 4, 2)
    kw = dict(q_norm_weight=weights[0], k_norm_weight=weights[1])
    got, no_state = main_branch(q, k, v, beta, decay, rope, matmul_precision="ieee", backend="triton", **kw)
    ref, _ = main_branch_ref(q, k, v, beta, decay, rope, **kw)
    assert no_state is None
    assert got.shape == want.shape and got.dtype == want.dtype
    assert rel(got, want) < 1e-4
    assert rel(ref, want) < 1e-5
    assert torch.equal(main_branch(q, k, v, beta, decay, rope, backend="torch", **kw)[0], ref)


def test_states_and_segment_split_resume():
    # Anchor: forward scans are global (state carried), reverse scans segment-local.
    q, k, v, beta, decay, rope, weights = _inputs(2, batch=1, frames=5)
    kw = dict(q_norm_weight=weights[0], k_norm_weight=weights[1])
    fused = dict(matmul_precision="ieee", backend="triton")
    gen = torch.Generator().manual_seed(7)
    init = (0.1 * torch.randn(1, 2, 24, 24, generator=gen), torch.rand(1, 2, 24, 1, generator=gen))
    starts = torch.tensor([True, False, True, False, False])
    full, (kv, z) = main_branch(q, k, v, beta, decay, rope, initial_state=init, segment_starts=starts,
                                output_final_state=True, **kw, **fused)
    ref, (kv_ref, z_ref) = main_branch_ref(q, k, v, beta, decay, rope, initial_state=init,
                                           segment_starts=starts, output_final_state=True, **kw)
    assert rel(full, ref) < 1e-4
    assert rel(kv, kv_ref) < 1e-5 and rel(z, z_ref) < 1e-5
    assert kv.shape == (1, 2, 24, 24) and z.shape == (1, 2, 24, 1)

    cut = 2 * 6  # tokens of frames [0, 2)
    cos, sin = rope.real.reshape(-1, 12), rope.imag.reshape(-1, 12)
    first, state = main_branch(q[:, :cut], k[:, :cut], v[:, :cut], beta[:, :, :2], decay[:, :, :2],
                               (cos[:cut], sin[:cut]), initial_state=init, output_final_state=True, **kw, **fused)
    second, _ = main_branch(q[:, cut:], k[:, cut:], v[:, cut:], beta[:, :, 2:], decay[:, :, 2:],
                         (cos[cut:], sin[cut:]), initial_state=state, segment_starts=starts[2:], **kw, **fused)
    assert rel(torch.cat([first, second], dim=1), full) < 1e-5


def test_main_branch_tf32_runs_on_fp16_operands():
    """matmul_precision="tf32" runs the scans on fp16 operands (kernels.delta_scan f16_operands): within the
    10-bit-mantissa error of the reference, and not bit-equal to the ieee path (the fast path ran)."""
    q, k, v, beta, decay, rope, weights = _inputs(3)
    kw = dict(q_norm_weight=weights[0], k_norm_weight=weights[1], backend="triton")
    ref, _ = main_branch_ref(q, k, v, beta, decay, rope, q_norm_weight=weights[0], k_norm_weight=weights[1])
    fast, _ = main_branch(q, k, v, beta, decay, rope, matmul_precision="tf32", **kw)
    exact, _ = main_branch(q, k, v, beta, decay, rope, matmul_precision="ieee", **kw)
    assert rel(fast, ref) < 3e-3
    assert rel(exact, ref) < 1e-5 and rel(fast, exact) > 1e-6


def test_rope_pairs_reads_diffusers_table_in_place_and_every_form_alike():
    """The kernels read one (N, P, 2) fp32 table: diffusers' complex64 table is viewed, not copied (a render passes
    it to every block and pass), and main_prep gives the same bits from each form of the table."""
    from camrender.kernels._reference_parts import rope_pairs, rope_tables

    q, _, _, _, _, rope, (w, _) = _inputs(3, heads=2, head_dim=16)
    assert rope.dtype == torch.complex64
    pairs = rope_pairs(rope)
    assert pairs.dtype == torch.float32 and pairs.shape == (q.shape[1], 8, 2)
    assert pairs.data_ptr() == rope.data_ptr()  # a view of the complex table
    cos, sin = rope_tables(rope)
    assert torch.equal(pairs[..., 0], cos) and torch.equal(pairs[..., 1], sin)
    assert rope_pairs(pairs) is pairs
    assert torch.equal(rope_pairs((cos, sin)), pairs)
    assert torch.equal(rope_pairs(rope.to(torch.complex128)), pairs)  # widened tables are narrowed as before
    with torch.no_grad():
        want = main_prep(q, w, 2, relu=False, rope=(cos, sin))
        for form in (rope, pairs):
            assert torch.equal(main_prep(q, w, 2, relu=False, rope=form), want)


def test_main_prep_writes_a_head_major_slot():
    """out may be a (B, N, H, D) view with unit channel stride (a softmax window's key slot, transposed): the same
    bits as the contiguous result, the tokens before the slot untouched."""
    q, _, _, _, _, rope, (w, _) = _inputs(5, heads=2, head_dim=16)
    batch, tokens, _ = q.shape
    window = torch.randn(batch, 2, 7 + tokens, 16)
    before = window[:, :, :7].clone()
    slot = window[:, :, 7:].transpose(1, 2)
    with torch.no_grad():
        want = main_prep(q, w, 2, relu=False, rope=rope)
        got = main_prep(q, w, 2, relu=False, rope=rope, out=slot)
    assert got is slot and torch.equal(got.reshape(want.shape), want)
    assert torch.equal(window[:, :, :7], before)
