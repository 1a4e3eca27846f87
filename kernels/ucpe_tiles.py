"""Triton device helpers shared by the camera-branch kernels: UCPE + RoPE on register tiles.

A head vector of D channels is viewed as D/4 groups of four: groups [0, NGU) hold the UCPE
half (each group mapped by the token's 4x4 matrix, y = M x), groups [NGU, 2*NGU) hold the
RoPE half (two interleaved complex pairs per group); NGU = D/8, so D/2 must be divisible by 4.

"Quads" (the scan's output kernel) keep a (BS tokens, G groups) tile as four (BS, G) tensors, one
per channel 4g + j: the 4x4 mixing and the pair rotations are then plain elementwise arithmetic,
with no data movement between threads. Groups past D/4 (G is a
power of two) are padding: zero in, zero out.
"""
import triton
import triton.language as tl


@triton.jit
def _mat_row(mat_ptr, tok, tok_mask, i: tl.constexpr):
    """Row i of the per-token 4x4 matrices (row-major 16 floats per token), as four (BS, 1)."""
    base = mat_ptr + tok * 16 + i * 4
    m0 = tl.load(base + 0, mask=tok_mask, other=0.0).to(tl.float32)[:, None]
    m1 = tl.load(base + 1, mask=tok_mask, other=0.0).to(tl.float32)[:, None]
    m2 = tl.load(base + 2, mask=tok_mask, other=0.0).to(tl.float32)[:, None]
    m3 = tl.load(base + 3, mask=tok_mask, other=0.0).to(tl.float32)[:, None]
    return m0, m1, m2, m3


@triton.jit
def inflation_sq(pre_sq, post_sq, tok_mask):
    """Per-token (|k_after| / |k_before|)^2 with norms clamped at 1e-6; 0 on masked rows."""
    ratio = tl.maximum(tl.sqrt(post_sq), 1e-6) / tl.maximum(tl.sqrt(pre_sq), 1e-6)
    return tl.where(tok_mask, ratio * ratio, 0.0)


@triton.jit
def ucpe_rope_quads(x0, x1, x2, x3, mat_ptr, tok, rope_ptr, pos, tok_mask,
                    G: tl.constexpr, NGU: tl.constexpr, HAS_ROPE: tl.constexpr, INV_ROPE: tl.constexpr):
    """UCPE (y = M x per UCPE group, M = the token's matrix) and RoPE (per RoPE group) on quads; rope_ptr: the
    interleaved (N, 2 NGU, 2) (cos, sin) table (`rope_pairs`), read at the tokens' positions pos."""
    a0, a1, a2, a3 = _mat_row(mat_ptr, tok, tok_mask, 0)
    u0 = a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
    a0, a1, a2, a3 = _mat_row(mat_ptr, tok, tok_mask, 1)
    u1 = a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
    a0, a1, a2, a3 = _mat_row(mat_ptr, tok, tok_mask, 2)
    u2 = a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
    a0, a1, a2, a3 = _mat_row(mat_ptr, tok, tok_mask, 3)
    u3 = a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
    g = tl.arange(0, G)[None, :]
    is_ucpe = g < NGU
    if HAS_ROPE:
        in_rope = (g >= NGU) & (g < 2 * NGU) & tok_mask[:, None]
        off = (pos.to(tl.int32)[:, None] * (2 * NGU) + 2 * (g - NGU)) * 2  # pairs 2(g - NGU) and the next
        c0 = tl.load(rope_ptr + off, mask=in_rope, other=0.0)
        s0 = tl.load(rope_ptr + off + 1, mask=in_rope, other=0.0)
        c1 = tl.load(rope_ptr + off + 2, mask=in_rope, other=0.0)
        s1 = tl.load(rope_ptr + off + 3, mask=in_rope, other=0.0)
        if INV_ROPE:
            s0 = -s0
            s1 = -s1
        r0 = c0 * x0 - s0 * x1
        r1 = s0 * x0 + c0 * x1
        r2 = c1 * x2 - s1 * x3
        r3 = s1 * x2 + c1 * x3
    else:
        r0 = x0
        r1 = x1
        r2 = x2
        r3 = x3
    return tl.where(is_ucpe, u0, r0), tl.where(is_ucpe, u1, r1), tl.where(is_ucpe, u2, r2), tl.where(is_ucpe, u3, r3)


@triton.jit
def split_quads(x, BS: tl.constexpr, G: tl.constexpr):
    """A contiguous (BS, 4G) tile -> quads (x0, x1, x2, x3), xj[:, g] = x[:, 4g + j].

    Pure register renaming when each thread holds whole groups of four (the vectorised
    layout of a contiguous load), so tiles can be loaded and stored 16 bytes at a time.
    """
    x = tl.reshape(x, (BS, G, 2, 2))
    lo, hi = tl.split(x)      # last axis: channel 4g + 2p + {0, 1}
    x0, x2 = tl.split(lo)
    x1, x3 = tl.split(hi)
    return x0, x1, x2, x3


@triton.jit
def join_quads(y0, y1, y2, y3, BS: tl.constexpr, G: tl.constexpr):
    """Inverse of split_quads: quads -> a contiguous (BS, 4G) tile."""
    y = tl.join(tl.join(y0, y2), tl.join(y1, y3))  # (BS, G, 2, 2): [.., p, j] = channel 4g + 2p + j
    return tl.reshape(y, (BS, 4 * G))


@triton.jit
def token_matrix(mat_ptr, off, si, sj, tok_mask):
    """Each token's 4x4 matrix as 16 (BS, 1) fp32 tensors, row-major; entry (i, j) of the
    token at element offset off (BS,) lies at off + i * si + j * sj."""
    return (tl.load(mat_ptr + off, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + sj, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + 2 * sj, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + 3 * sj, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + si, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + si + sj, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + si + 2 * sj, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + si + 3 * sj, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + 2 * si, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + 2 * si + sj, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + 2 * si + 2 * sj, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + 2 * si + 3 * sj, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + 3 * si, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + 3 * si + sj, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + 3 * si + 2 * sj, mask=tok_mask, other=0.0)[:, None],
            tl.load(mat_ptr + off + 3 * si + 3 * sj, mask=tok_mask, other=0.0)[:, None])


@triton.jit
def rope_pairs(rope_ptr, n, tok_mask, GU: tl.constexpr, NGU: tl.constexpr):
    """RoPE (cos, sin) of the two complex pairs of each RoPE group g < NGU of the tokens n (BS,),
    from the interleaved (N, 2 NGU, 2) table: four (BS, GU) fp32 tiles c0, s0, c1, s1 (zero
    past NGU)."""
    g = tl.arange(0, GU)[None, :]
    m = (g < NGU) & tok_mask[:, None]
    off = n[:, None] * (4 * NGU) + 4 * g
    return (tl.load(rope_ptr + off, mask=m, other=0.0), tl.load(rope_ptr + off + 1, mask=m, other=0.0),
            tl.load(rope_ptr + off + 2, mask=m, other=0.0), tl.load(rope_ptr + off + 3, mask=m, other=0.0))


@triton.jit
def rope_tiles(rope_ptr, n, tok_mask, BS: tl.constexpr, GU: tl.constexpr, NGU: tl.constexpr,
               HAS_ROPE: tl.constexpr, INVERSE: tl.constexpr):
    """(c0, s0, c1, s1) of rope_pairs, each (BS, GU) fp32; zeros without RoPE, negated sines
    for the inverse rotation."""
    c0 = tl.zeros((BS, GU), dtype=tl.float32)
    s0 = c0
    c1 = c0
    s1 = c0
    if HAS_ROPE:
        c0, s0, c1, s1 = rope_pairs(rope_ptr, n, tok_mask, GU, NGU)
        if INVERSE:
            s0 = -s0
            s1 = -s1
    return c0, s0, c1, s1
