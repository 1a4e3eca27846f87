"""kernels.softmax_cam (UCPE encode / decode around the softmax blocks' camera SDPA) against the
fp32 PyTorch references in kernels.softmax_cam_reference, on the edge cases of the tiled kernels:
token counts that leave a partial block, head dims whose half is not a power-of-two number of
quads (D = 24, 112), the smallest head (D = 16), D > 128 (padded to 256), a broadcast batch of
matrices, RoPE given as a (cos, sin) pair or absent, and the SDPA output in either memory layout.
CPU, Triton interpreter, tiny shapes.
"""
import pytest
import torch

from camrender.kernels.softmax_cam_reference import cam_softmax_decode_ref, cam_softmax_encode_ref
from camrender.kernels.softmax_cam import cam_softmax_decode, cam_softmax_encode
from helpers import rel


def _rays(batch, tokens, dim, gen, *, mat_batch=None, rope=True):
    """Random (P, P_T, P_inv, rope_cam): general 4x4 matrices (not rotations: the RMS downscale
    clamps), P_T a transposed view, unit-modulus RoPE (1, 1, N, D/4)."""
    mat_batch = batch if mat_batch is None else mat_batch
    p = torch.randn(mat_batch, tokens, 4, 4, generator=gen) + 2 * torch.eye(4)
    p_inv = torch.linalg.inv(p)
    rope_cam = None
    if rope:
        angles = torch.rand(1, 1, tokens, dim // 4, generator=gen) * 6.2832
        rope_cam = torch.polar(torch.ones_like(angles), angles)
    return p, p.transpose(-1, -2), p_inv, rope_cam


CASES = {  # name: (batch, tokens, heads, dim, options)
    "d16_tail": (2, 37, 3, 16, {}),
    "d24_no_rope": (1, 18, 2, 24, dict(rope=False)),
    "d32_no_norm_no_downscale_bcast": (2, 17, 2, 32, dict(norm=False, downscale=False, mat_batch=1)),
    "d112_release_head": (1, 21, 2, 112, {}),
    "d136_pad256": (1, 9, 1, 136, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_encode_matches_reference(case):
    batch, tokens, heads, dim, opt = CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    channels = heads * dim
    q, k, v = (torch.randn(batch, tokens, channels, generator=gen) for _ in range(3))
    rays = _rays(batch, tokens, dim, gen, mat_batch=opt.get("mat_batch"), rope=opt.get("rope", True))
    weights = {}
    if opt.get("norm", True):
        weights = dict(q_norm_weight=0.5 + torch.rand(channels, generator=gen),
                       k_norm_weight=0.5 + torch.rand(channels, generator=gen))
    kw = dict(heads=heads, downscale=opt.get("downscale", True), norm_eps=1e-5, **weights)
    got = cam_softmax_encode(q, k, v, rays, **kw)
    want = cam_softmax_encode_ref(q, k, v, rays, **kw)
    dpad = 128 if dim <= 128 else 256
    for name, g, w in zip("qkv", got, want):
        assert g.shape == (batch, tokens, heads, dpad) and g.is_contiguous() and g.dtype == torch.float32, name
        assert torch.all(g[..., dim:] == 0), name
        assert rel(g, w) < 1e-5, name


def test_encode_bf16_storage_and_rope_pair():
    batch, tokens, heads, dim = 2, 20, 2, 112
    gen = torch.Generator().manual_seed(11)
    channels = heads * dim
    q, k, v = (torch.randn(batch, tokens, channels, generator=gen).bfloat16() for _ in range(3))
    rays = _rays(batch, tokens, dim, gen)
    weights = dict(q_norm_weight=0.5 + torch.rand(channels, generator=gen),
                   k_norm_weight=0.5 + torch.rand(channels, generator=gen))
    # fp32 math on the bf16 inputs: stored in fp32 it matches the reference tightly ...
    got32 = cam_softmax_encode(q, k, v, rays, heads=heads, out_dtype=torch.float32, **weights)
    want = cam_softmax_encode_ref(q, k, v, rays, heads=heads, out_dtype=torch.float32, **weights)
    for g, w in zip(got32, want):
        assert rel(g, w) < 1e-5
    # ... and the default storage is the input dtype (bf16), within bf16 rounding of it
    got16 = cam_softmax_encode(q, k, v, rays, heads=heads, **weights)
    for g, w in zip(got16, want):
        assert g.dtype == torch.bfloat16 and torch.all(g[..., dim:] == 0)
        assert rel(g, w) < 8e-3
    # RoPE handed over as a (cos, sin) pair of (N, D/4) gives the same encoding
    rope = rays[3].reshape(tokens, dim // 4)
    pair_rays = (*rays[:3], (rope.real.contiguous(), rope.imag.contiguous()))
    got_pair = cam_softmax_encode(q, k, v, pair_rays, heads=heads, out_dtype=torch.float32, **weights)
    for g, w in zip(got_pair, got32):
        assert torch.equal(g, w)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", ["heads_major", "sdpa_tokens_major"])
def test_decode_matches_reference(case, layout):
    batch, tokens, heads, dim, opt = CASES[case]
    gen = torch.Generator().manual_seed(100 + len(case))
    dpad = 128 if dim <= 128 else 256
    rays = _rays(batch, tokens, dim, gen, mat_batch=opt.get("mat_batch"), rope=opt.get("rope", True))
    if layout == "heads_major":
        o = torch.randn(batch, heads, tokens, dpad, generator=gen)
    else:  # what SDPA returns for the transposed (B, N, H, DPAD) encodings: a (B, H, N, DPAD) view
        o = torch.randn(batch, tokens, heads, dpad, generator=gen).transpose(1, 2)
    got = cam_softmax_decode(o, rays, dim=dim)
    want = cam_softmax_decode_ref(o, rays, dim=dim)
    assert got.shape == (batch, tokens, heads * dim) and got.is_contiguous()
    assert rel(got, want) < 1e-5
    assert cam_softmax_decode(o.bfloat16(), rays, dim=dim).dtype == torch.bfloat16


def test_bad_shapes_raise_value_error():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 6, 2 * 12, generator=gen)
    with pytest.raises(ValueError, match="multiple of 8"):
        cam_softmax_encode(q, q, q, _rays(1, 6, 12, gen), heads=2)
    q = torch.randn(1, 6, 2 * 16, generator=gen)
    with pytest.raises(ValueError, match="P_inv"):
        p, p_t, _, rope = _rays(1, 6, 16, gen)
        cam_softmax_encode(q, q, q, (p, p_t, p[:, :5], rope), heads=2)
    with pytest.raises(ValueError, match="rope_cam"):
        cam_softmax_decode(torch.randn(1, 2, 6, 128), _rays(1, 6, 32, gen), dim=16)
    with pytest.raises(ValueError, match="at least dim"):
        cam_softmax_decode(torch.randn(1, 2, 6, 8), _rays(1, 6, 16, gen), dim=16)


def test_encode_writes_keys_and_values_into_window_slots():
    """kv_out: k and v go straight into a softmax window's slots ((B, H, c + n, DPAD) buffers, their last n
    tokens, transposed), with the bits of the contiguous outputs; the cached tokens before the slot stay."""
    batch, tokens, heads, dim, cached = 2, 13, 2, 24, 5
    gen = torch.Generator().manual_seed(7)
    channels = heads * dim
    q, k, v = (torch.randn(batch, tokens, channels, generator=gen) for _ in range(3))
    rays = _rays(batch, tokens, dim, gen)
    kw = dict(heads=heads, q_norm_weight=0.5 + torch.rand(channels, generator=gen),
              k_norm_weight=0.5 + torch.rand(channels, generator=gen))
    want = cam_softmax_encode(q, k, v, rays, **kw)
    windows = [torch.randn(batch, heads, cached + tokens, 128, generator=gen) for _ in range(2)]
    before = [w[:, :, :cached].clone() for w in windows]
    slots = tuple(w[:, :, cached:].transpose(1, 2) for w in windows)
    got = cam_softmax_encode(q, k, v, rays, kv_out=slots, **kw)
    assert got[1] is slots[0] and got[2] is slots[1]
    for i in range(3):
        assert torch.equal(got[i], want[i])
    for w, b in zip(windows, before):
        assert torch.equal(w[:, :, :cached], b)
    with pytest.raises(ValueError, match="share their strides"):
        cam_softmax_encode(q, k, v, rays, kv_out=(slots[0], want[2]), **kw)


def test_token_tiles_change_no_bit():
    """`_grid.filling_tile` cuts the tokens an encode program takes on a segment: every tile of the encode and
    the decode gives the same bits (interpreted; compiled, a row's sum of squares may be reduced in another
    order)."""
    from camrender.kernels.softmax_cam import decode_launch, encode_launch, ray_inputs

    batch, tokens, heads, dim = 1, 37, 2, 24
    gen = torch.Generator().manual_seed(11)
    channels = heads * dim
    q, k, v = (torch.randn(batch, tokens, channels, generator=gen) for _ in range(3))
    views = ray_inputs(_rays(batch, tokens, dim, gen), batch, tokens, dim, q.device)
    kw = dict(q_norm_weight=0.5 + torch.rand(channels, generator=gen),
              k_norm_weight=0.5 + torch.rand(channels, generator=gen), norm_eps=1e-5, heads=heads, downscale=True,
              out_dtype=torch.float32, num_warps=4)
    want = encode_launch(q, k, v, views, block_s=16, **kw)
    o = torch.randn(batch, heads, tokens, 32, generator=gen)
    want_dec = decode_launch(o, views, dim=dim, out_dtype=torch.float32, block_s=16, num_warps=2)
    for block_s in (8, 4):
        assert all(torch.equal(a, b) for a, b in zip(encode_launch(q, k, v, views, block_s=block_s, **kw), want))
        assert torch.equal(decode_launch(o, views, dim=dim, out_dtype=torch.float32, block_s=block_s,
                                         num_warps=2), want_dec)
