"""Chunkwise (frame-parallel) Triton delta-rule scan: forward (inclusive) + reverse (exclusive).

Three launches, the same for the plain scan and the fused camera branch:

1. transitions, one program per (b, h, t) (two with `split`: one for W, one for U; times `col_split`
   blocks of their columns):
   A_t = K_t^T diag(beta_t) K_t and U_t = K_t^T diag(beta_t) V_t as tl.dot GEMMs over the
   frame's S tokens; W_t = g_t (I - A_t). In camera mode k and v come from the prep kernel
   with beta folded in, and the beta discount 1 / max(1, mean inflation) -- a per-frame scalar
   -- scales A_t and U_t at the end.
2. recurrence, one program per (b, h, block of value columns, direction): the short serial
   D x D scan M_t = W_t M_{t-1} + U_t (forward, from the initial state) and R_t = W_{t+1}
   R_{t+1} + U_{t+1} (reverse, cut where segment_starts[t+1]); every state is stored.
3. output, one program per (b, h, t, token split): O_t = Q_t (M_t + R_t). In camera mode the
   program decodes the output (inverse UCPE) before storing (B, N, C).

All states and accumulations are fp32; tl.dot runs in `matmul_precision` ("tf32" or "ieee"); with
f16 operands (the camera branch, and the main branch, in tf32 mode) the transition, recurrence
and output products take fp16 operands (the same 10-bit mantissa), and W_t (in the camera branch
also the per-frame states) is stored in fp16.
Dims are padded to powers of two (>= 16) with masks, so any Dk, Dv >= 1 works.
"""
import torch
import triton
import triton.language as tl

from . import ucpe_tiles
from ._grid import cdiv, next_power_of_2
from ._scan_transition import _transition_kernel
from ._validate import MATMUL_PRECISIONS, check_choice, check_tensor, segment_starts_tensor, use_triton
from .delta_scan_reference import delta_scan_ref

__all__ = ["delta_scan"]


@triton.jit
def _recurrence_kernel(w_ptr, u_ptr, st_ptr, init_ptr, final_ptr, starts_ptr, H, T, BH, NCB,
                       DK: tl.constexpr, DV: tl.constexpr, DKP: tl.constexpr, DVP: tl.constexpr,
                       BV: tl.constexpr, HAS_INIT: tl.constexpr, HAS_STARTS: tl.constexpr,
                       PREC: tl.constexpr, SW: tl.constexpr, PERM: tl.constexpr, F16_DOT: tl.constexpr):
    """One program per (b, h, block of BV value columns, direction 0 = forward / 1 = reverse);
    stores every M_t (forward) or R_t (reverse) of its columns (rows of SW entries, in the
    buffer's dtype), and the final forward state. PERM stores column 4g + j at j * (SW / 4) + g,
    so the output kernel reads each quad's columns as one contiguous block; program cb then
    owns the columns of quads [cb * R, (cb + 1) * R), R = BV / (SW / 4), which it stores as one
    contiguous block of BV.

    W_t may be stored in fp16 (camera tf32 mode: the 10-bit mantissa the tf32 product keeps
    anyway); F16_DOT then runs the products on fp16 operands (the state rounded like the stored
    per-frame states), accumulating in fp32 onto U_t."""
    pid = tl.program_id(0)
    direction = tl.program_id(1)
    cb = pid % NCB
    bh = (pid // NCB).to(tl.int64)
    b = bh // H
    rows = tl.arange(0, DKP)
    lane = tl.arange(0, BV)
    if PERM:
        GQ: tl.constexpr = SW // 4
        R: tl.constexpr = BV // GQ
        cols = 4 * (lane % GQ) + cb * R + lane // GQ
        st_tile = rows[:, None] * SW + (cb * BV + lane)[None, :]
    else:
        cols = cb * BV + lane
        st_tile = rows[:, None] * SW + cols[None, :]
    w_tile = rows[:, None] * DKP + rows[None, :]
    u_tile = st_tile  # U_t is stored in the state's column order (PERM: see _scan_transition)
    w_base = w_ptr + bh * T * DKP * DKP
    u_base = u_ptr + bh * T * DKP * SW
    st_base = st_ptr + (direction * BH + bh) * T * DKP * SW
    st_ty = st_ptr.dtype.element_ty
    if direction == 0:
        valid = (rows[:, None] < DK) & (cols[None, :] < DV)
        state_off = bh * DK * DV + rows[:, None] * DV + cols[None, :]
        if HAS_INIT:
            m = tl.load(init_ptr + state_off, mask=valid, other=0.0)
        else:
            m = tl.zeros((DKP, BV), dtype=tl.float32)
        for t in range(T):
            w = tl.load(w_base + t * DKP * DKP + w_tile)
            u = tl.load(u_base + t * DKP * SW + u_tile)
            if F16_DOT:
                m = tl.dot(w.to(tl.float16), m.to(tl.float16), u)
            else:
                m = tl.dot(w.to(tl.float32), m, u, input_precision=PREC)
            tl.store(st_base + t * DKP * SW + st_tile, m.to(st_ty))
        tl.store(final_ptr + state_off, m, mask=valid)
    else:
        r = tl.zeros((DKP, BV), dtype=tl.float32)
        tl.store(st_base + (T - 1) * DKP * SW + st_tile, r.to(st_ty))
        for i in range(T - 1):
            t = T - 2 - i
            w = tl.load(w_base + (t + 1) * DKP * DKP + w_tile)
            u = tl.load(u_base + (t + 1) * DKP * SW + u_tile)
            if F16_DOT:
                r = tl.dot(w.to(tl.float16), r.to(tl.float16), u)
            else:
                r = tl.dot(w.to(tl.float32), r, u, input_precision=PREC)
            if HAS_STARTS:
                cut = tl.load(starts_ptr + b * T + t + 1)
                r = r * (1 - cut).to(tl.float32)
            tl.store(st_base + t * DKP * SW + st_tile, r.to(st_ty))


@triton.jit
def _output_kernel(q_ptr, st_ptr, out_ptr, sq_b, sq_h, sq_t, sq_s, so_b, so_h, so_t, so_s,
                   p_ptr, rope_ptr, H, T, S, BH, S_PER_PROG,
                   DK: tl.constexpr, DV: tl.constexpr, DKP: tl.constexpr, DVP: tl.constexpr,
                   BS: tl.constexpr, G: tl.constexpr, NGU: tl.constexpr, DECODE: tl.constexpr,
                   HAS_ROPE: tl.constexpr, REVERSE: tl.constexpr, F16_DOT: tl.constexpr, PREC: tl.constexpr,
                   SW: tl.constexpr):
    """One program per (b, h, t, token split): O = Q_t (M_t + R_t), stored in out's dtype.

    With DECODE (camera), O is computed as four (BS, G) quads O_j = Q_t S[:, 4g + j] from the
    state stored column-permuted (quad j in columns [jG, (j+1)G), see _recurrence_kernel; same
    FLOPs as one product), decoded in registers (P of the token on the UCPE half, conjugate
    RoPE on the other) and joined into contiguous rows before the store.
    """
    pid = tl.program_id(0)
    t = pid % T
    bh = (pid // T).to(tl.int64)
    b = bh // H
    h = bh % H
    dk = tl.arange(0, DKP)
    frame_off = (bh * T + t) * DKP * SW
    rev_off = BH * T * DKP * SW
    q_base = q_ptr + b * sq_b + h * sq_h + t * sq_t
    o_base = out_ptr + b * so_b + h * so_h + t * so_t
    s_begin = tl.program_id(1) * S_PER_PROG
    s_end = tl.minimum(s_begin + S_PER_PROG, S)
    if DECODE:
        g = tl.arange(0, G)
        col = dk[:, None] * SW + g[None, :]
        cmask = (dk[:, None] < DK) & (g[None, :] < DV // 4)
        s0_ = tl.load(st_ptr + frame_off + col, mask=cmask, other=0.0).to(tl.float32)
        s1_ = tl.load(st_ptr + frame_off + col + G, mask=cmask, other=0.0).to(tl.float32)
        s2_ = tl.load(st_ptr + frame_off + col + 2 * G, mask=cmask, other=0.0).to(tl.float32)
        s3_ = tl.load(st_ptr + frame_off + col + 3 * G, mask=cmask, other=0.0).to(tl.float32)
        if REVERSE:
            s0_ += tl.load(st_ptr + rev_off + frame_off + col, mask=cmask, other=0.0).to(tl.float32)
            s1_ += tl.load(st_ptr + rev_off + frame_off + col + G, mask=cmask, other=0.0).to(tl.float32)
            s2_ += tl.load(st_ptr + rev_off + frame_off + col + 2 * G, mask=cmask, other=0.0).to(tl.float32)
            s3_ += tl.load(st_ptr + rev_off + frame_off + col + 3 * G, mask=cmask, other=0.0).to(tl.float32)
        if F16_DOT:
            s0_ = s0_.to(tl.float16)
            s1_ = s1_.to(tl.float16)
            s2_ = s2_.to(tl.float16)
            s3_ = s3_.to(tl.float16)
    else:
        dv = tl.arange(0, DVP)
        st_off = frame_off + dk[:, None] * SW + dv[None, :]
        state = tl.load(st_ptr + st_off)
        if REVERSE:
            state += tl.load(st_ptr + rev_off + st_off)
        if F16_DOT:
            state = state.to(tl.float16)
    for s0 in range(s_begin, s_end, BS):
        s = s0 + tl.arange(0, BS)
        smask = s < s_end
        qt = tl.load(q_base + s[:, None] * sq_s + dk[None, :], mask=smask[:, None] & (dk[None, :] < DK), other=0.0)
        if F16_DOT:
            qt = qt.to(tl.float16)
        else:
            qt = qt.to(tl.float32)
        if DECODE:
            if F16_DOT:
                o0 = tl.dot(qt, s0_)
                o1 = tl.dot(qt, s1_)
                o2 = tl.dot(qt, s2_)
                o3 = tl.dot(qt, s3_)
            else:
                o0 = tl.dot(qt, s0_, input_precision=PREC)
                o1 = tl.dot(qt, s1_, input_precision=PREC)
                o2 = tl.dot(qt, s2_, input_precision=PREC)
                o3 = tl.dot(qt, s3_, input_precision=PREC)
            n = t * S + s
            o0, o1, o2, o3 = ucpe_tiles.ucpe_rope_quads(o0, o1, o2, o3, p_ptr, b * T * S + n, rope_ptr, n,
                                                        smask, G, NGU, HAS_ROPE, True)
            oc = tl.arange(0, 4 * G)
            o = ucpe_tiles.join_quads(o0, o1, o2, o3, BS, G)
            tl.store(o_base + s[:, None] * so_s + oc[None, :], o.to(out_ptr.dtype.element_ty),
                     mask=smask[:, None] & (oc[None, :] < DV))
        else:
            if F16_DOT:
                o = tl.dot(qt, state)
            else:
                o = tl.dot(qt, state, input_precision=PREC)
            tl.store(o_base + s[:, None] * so_s + dv[None, :], o.to(out_ptr.dtype.element_ty),
                     mask=smask[:, None] & (dv[None, :] < DV))


def padded(dim):
    return max(16, next_power_of_2(dim))


def run_scan(*, k, v, q, beta, decay, out, k_strides, v_strides, q_strides, out_strides,
             batch, heads, frames, spatial, dk, dv, initial_state, starts, reverse, matmul_precision,
             infl=None, scale_a=1.0, scale_u=1.0, decode=None, f16_dot=False,
             block_s=None, s_split=None, block_v=None, num_warps=(8, 4, 8), split=True, out_block_s=None,
             num_stages=(3, 3, 3), rec_f16=False, w_f16=True, maxnreg=(None, None, None), col_split=1):
    """Launch the transition, recurrence and output kernels.

    Strides are the (b, h, t, s) element strides of each tensor viewed as (B, H, T, S, D) with
    unit stride on D. beta None means beta is folded into k and v. infl: per-token inflation
    (B, H, T, S) fp32 contiguous for the camera beta discount. decode: (p, rope) to decode the
    output, p the tokens' P (B, N, 4, 4) fp32 (any strides), rope the (N, Dv/4, 2) (cos, sin)
    table or None (cam_prep.ray_views). f16_dot: operands are rounded to fp16 (10-bit mantissa,
    like tf32); W_t is then stored in fp16, and with decode the per-frame states too (they feed
    fp16 products). rec_f16: the recurrence's products on fp16 operands as well (f16_dot only).
    w_f16: store W_t in fp16 when f16_dot (else fp32). maxnreg: register cap per thread of the
    (transition, recurrence, output) kernels (None: the compiler's choice).
    num_stages: software-pipelining depth of the (transition, recurrence, output) kernels.
    block_s: tokens per tile of the transition kernel (and of the output kernel unless
    out_block_s); s_split: output programs per frame. col_split: the transition kernel's programs per frame and
    product, each building a block of W_t's and U_t's columns (a power of two; U_t's blocks keep 16 columns at
    least): more programs for a segment's few frames and heads, each loading all of K_t. Default 1: on an H200, four
    blocks of 32 columns on a segment's 120 programs took 9.4 ms a segment against 5.4 for whole programs (each
    block loads all of K_t again; bench/results/2026-12-05_segment_targets_75df780_h200.json).

    Returns the final forward state (B, H, Dk, Dv) fp32.
    """
    device = k.device
    dkp, dvp = padded(dk), padded(dv)
    bs = block_s or max(16, min(64 if f16_dot else 32, next_power_of_2(spatial)))
    bh = batch * heads
    w_buf = torch.empty(bh, frames, dkp, dkp, device=device, dtype=torch.float16 if (f16_dot and w_f16) else torch.float32)
    quads = padded(dv // 4)  # decode: groups of four, padded for tl.dot
    st_width = 4 * quads if decode is not None else dvp
    # U_t and the states share one column order: quad-major (permuted) with decode, else plain.
    u_buf = (torch.zeros if st_width != dvp else torch.empty)(bh, frames, dkp, st_width, device=device,
                                                              dtype=torch.float32)
    st_dtype = torch.float16 if (decode is not None and f16_dot) else torch.float32
    st_buf = torch.empty(2 if reverse else 1, bh, frames, dkp, st_width, device=device, dtype=st_dtype)
    final = torch.empty(batch, heads, dk, dv, device=device, dtype=torch.float32)
    dummy = final
    regs = [dict(maxnreg=r) if r else {} for r in maxnreg]
    beta_args = (beta, *beta.stride()) if beta is not None else (dummy, 0, 0, 0, 0)
    if col_split < 1 or col_split & (col_split - 1) or dkp // col_split < 16:
        raise ValueError(f"col_split must be a power of two leaving 16 columns of W_t at least, got {col_split}")
    u_blocks = max(1, min(col_split, dvp // 16))
    _transition_kernel[(bh * frames, 2 if split else 1, col_split)](
        k, v, beta_args[0], decay, infl if infl is not None else dummy, w_buf, u_buf,
        *k_strides, *v_strides, *beta_args[1:], *decay.stride(), float(scale_a), float(scale_u),
        heads, frames, spatial, DK=dk, DV=dv, DKP=dkp, DVP=dvp, BS=bs, HAS_BETA=beta is not None,
        HAS_INFL=infl is not None, F16_DOT=bool(f16_dot), PREC=matmul_precision, SPLIT=bool(split),
        US=st_width, UPERM=decode is not None, WCOLS=dkp // col_split, UCOLS=dvp // u_blocks, U_BLOCKS=u_blocks,
        num_warps=num_warps[0], num_stages=num_stages[0], **regs[0])
    if decode is not None:  # whole quads per program (see _recurrence_kernel)
        bv = min(max(block_v or quads, quads), st_width)
        ncb = st_width // bv
    else:
        bv = block_v or min(dvp, 32)
        ncb = dvp // bv
    _recurrence_kernel[(bh * ncb, 2 if reverse else 1)](
        w_buf, u_buf, st_buf, initial_state if initial_state is not None else dummy, final,
        starts if starts is not None else dummy, heads, frames, bh, ncb,
        DK=dk, DV=dv, DKP=dkp, DVP=dvp, BV=bv, HAS_INIT=initial_state is not None,
        HAS_STARTS=starts is not None, PREC=matmul_precision, SW=st_width, PERM=decode is not None,
        F16_DOT=bool(f16_dot and rec_f16), num_warps=num_warps[1], num_stages=num_stages[1], **regs[1])
    bs = out_block_s or bs
    split_s = s_split or max(1, min(cdiv(spatial, bs), 4))
    per_prog = cdiv(cdiv(spatial, split_s), bs) * bs
    grid = (bh * frames, cdiv(spatial, per_prog))
    if decode is not None:
        p, rope = decode
        p = p.contiguous()
        rope = rope.contiguous() if rope is not None else None  # (N, Dv/4, 2): ray_views' is already
    else:
        p, rope = dummy, None
    _output_kernel[grid](
        q, st_buf, out, *q_strides, *out_strides, p, rope if rope is not None else dummy,
        heads, frames, spatial, bh, per_prog,
        DK=dk, DV=dv, DKP=dkp, DVP=dvp, BS=bs, G=quads, NGU=max(dv // 8, 1), DECODE=decode is not None,
        HAS_ROPE=rope is not None, REVERSE=bool(reverse), F16_DOT=bool(f16_dot), PREC=matmul_precision,
        SW=st_width, num_warps=num_warps[2], num_stages=num_stages[2], **regs[2])
    return final


def delta_scan(q, k, v, beta, decay, *, initial_state=None, segment_starts=None, reverse=True,
               output_final_state=False, matmul_precision="tf32", f16_operands=False, col_split=1, backend="auto"):
    """Triton delta-rule scan with delta_scan_ref's arguments and semantics.

    q, k: (B, H, T, S, Dk); v: (B, H, T, S, Dv); beta (B, H, T, S); decay (B, H, T);
    initial_state (B, H, Dk, Dv); segment_starts bool (T,) or (B, T). Any strides with a
    contiguous last dim (e.g. a permuted (B, N, H, D) view); any float dtypes.
    output_final_state: return the forward state after the last frame (else None in its place).
    `matmul_precision`: "tf32" (default, fast) or "ieee" (exact fp32 products).
    `f16_operands` (with "tf32"): the products take fp16 operands (the 10-bit mantissa tf32 keeps,
    at twice the tensor-core rate) and W_t is stored in fp16, as the camera branch does; q, k, v
    and the states must stay within fp16 range. Accumulation stays fp32. `col_split`: see `run_scan`.
    backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else `delta_scan_ref`), "triton", "torch".

    Returns (out (B, H, T, S, Dv) fp32, final_state (B, H, Dk, Dv) fp32 or None unless output_final_state).
    """
    check_choice("matmul_precision", matmul_precision, MATMUL_PRECISIONS)
    check_tensor("k", k, (None, None, None, None, None), contiguous=False, last_dim_contiguous=True)
    batch, heads, frames, spatial, dk = k.shape
    check_tensor("q", q, (batch, heads, frames, spatial, dk), contiguous=False, last_dim_contiguous=True)
    check_tensor("v", v, (batch, heads, frames, spatial, None), contiguous=False, last_dim_contiguous=True)
    dv = v.shape[-1]
    check_tensor("beta", beta, (batch, heads, frames, spatial), contiguous=False)
    check_tensor("decay", decay, (batch, heads, frames), contiguous=False)
    if initial_state is not None:
        check_tensor("initial_state", initial_state, (batch, heads, dk, dv), contiguous=False)
    starts = segment_starts_tensor(segment_starts, batch, frames, k.device) if reverse else None
    if not use_triton(k, backend):
        return delta_scan_ref(q, k, v, beta, decay, initial_state=initial_state, segment_starts=segment_starts,
                              reverse=reverse, output_final_state=output_final_state)
    if initial_state is not None:
        initial_state = initial_state.float().contiguous()
    out = torch.empty(batch, heads, frames, spatial, dv, device=k.device, dtype=torch.float32)
    final = run_scan(k=k, v=v, q=q, beta=beta, decay=decay, out=out,
                     k_strides=k.stride()[:4], v_strides=v.stride()[:4], q_strides=q.stride()[:4],
                     out_strides=out.stride()[:4], batch=batch, heads=heads, frames=frames,
                     spatial=spatial, dk=dk, dv=dv, initial_state=initial_state, starts=starts,
                     reverse=reverse, matmul_precision=matmul_precision,
                     f16_dot=f16_operands and matmul_precision == "tf32", rec_f16=f16_operands, col_split=col_split)
    return out, (final if output_final_state else None)
