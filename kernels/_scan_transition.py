"""The transition step of `kernels.delta_scan` (its first launch, `run_scan` makes it): per frame, the Gram
products of the frame's keys with themselves and with the values, W_t = g_t (I - A_t) and U_t, in fp32
accumulators over the frame's tokens, a block of their columns per program (see `delta_scan`'s module docstring)."""
import triton
import triton.language as tl


@triton.jit
def _frame_transition(k_base, v_base, beta_base, infl_base, sk_s, sv_s, sb_s, g, scale_a, scale_u,
                      w_out, u_out, S, col,
                      DK: tl.constexpr, DV: tl.constexpr, DKP: tl.constexpr, DVP: tl.constexpr,
                      BS: tl.constexpr, HAS_BETA: tl.constexpr, HAS_INFL: tl.constexpr,
                      F16_DOT: tl.constexpr, PREC: tl.constexpr, WANT_W: tl.constexpr, WANT_U: tl.constexpr,
                      US: tl.constexpr, UPERM: tl.constexpr, WCOLS: tl.constexpr, UCOLS: tl.constexpr):
    """Accumulate one frame's Gram products over its S tokens; store W_t and/or U_t (padded): the columns of
    block `col`, WCOLS of W_t's DKP and UCOLS of U_t's DVP (all of them with one block)."""
    dk = tl.arange(0, DKP)
    cw = col * WCOLS + tl.arange(0, WCOLS)
    cu = col * UCOLS + tl.arange(0, UCOLS)
    if WANT_W:
        acc_a = tl.zeros((DKP, WCOLS), dtype=tl.float32)
    if WANT_U:
        acc_u = tl.zeros((DKP, UCOLS), dtype=tl.float32)
    infl = tl.zeros((BS,), dtype=tl.float32)
    for s0 in range(0, S, BS):
        s = s0 + tl.arange(0, BS)
        smask = s < S
        kt = tl.load(k_base + s[:, None] * sk_s + dk[None, :], mask=smask[:, None] & (dk[None, :] < DK), other=0.0)
        if WANT_W:
            if WCOLS == DKP:
                kc = kt
            else:  # this block's columns of K_t (the rows of kb^T are all of them)
                kc = tl.load(k_base + s[:, None] * sk_s + cw[None, :], mask=smask[:, None] & (cw[None, :] < DK),
                             other=0.0)
        if WANT_U:
            vt = tl.load(v_base + s[:, None] * sv_s + cu[None, :], mask=smask[:, None] & (cu[None, :] < DV),
                         other=0.0)
        if HAS_BETA:
            bt = tl.load(beta_base + s * sb_s, mask=smask, other=0.0).to(tl.float32)
            kb = kt.to(tl.float32) * bt[:, None]
        else:
            kb = kt
        if HAS_INFL:
            infl += tl.load(infl_base + s, mask=smask, other=0.0)
        if F16_DOT:
            kb = tl.trans(kb.to(tl.float16))
            if WANT_W:
                acc_a = tl.dot(kb, kc.to(tl.float16), acc_a)
            if WANT_U:
                acc_u = tl.dot(kb, vt.to(tl.float16), acc_u)
        else:
            kb = tl.trans(kb.to(tl.float32))
            if WANT_W:
                acc_a = tl.dot(kb, kc.to(tl.float32), acc_a, input_precision=PREC)
            if WANT_U:
                acc_u = tl.dot(kb, vt.to(tl.float32), acc_u, input_precision=PREC)
    # Beta discount (camera): a per-frame scalar, so it scales the products after the fact.
    discount = 1.0
    if HAS_INFL:
        discount = 1.0 / tl.maximum(tl.sum(infl, axis=0) / S, 1.0)
    if WANT_W:
        eye = ((dk[:, None] == cw[None, :]) & (dk[:, None] < DK)).to(tl.float32)
        w = g * (eye - acc_a * (scale_a * discount))
        tl.store(w_out + dk[:, None] * DKP + cw[None, :], w.to(w_out.dtype.element_ty))
    if WANT_U:
        acc_u = acc_u * (scale_u * discount)
        if UPERM:  # column 4g + j at j * (US / 4) + g (see _recurrence_kernel)
            if DVP == US and UCOLS == DVP:
                acc_u = tl.reshape(tl.permute(tl.reshape(acc_u, (DKP, DVP // 4, 4)), (0, 2, 1)), (DKP, DVP))
                tl.store(u_out + dk[:, None] * US + cu[None, :], acc_u)
            else:  # tiny Dv (a zeroed, wider buffer) or a block of the columns: scattered
                tl.store(u_out + dk[:, None] * US + ((cu % 4) * (US // 4) + cu // 4)[None, :], acc_u)
        else:
            tl.store(u_out + dk[:, None] * US + cu[None, :], acc_u)


@triton.jit
def _transition_kernel(k_ptr, v_ptr, beta_ptr, decay_ptr, infl_ptr, w_ptr, u_ptr,
                       sk_b, sk_h, sk_t, sk_s, sv_b, sv_h, sv_t, sv_s,
                       sb_b, sb_h, sb_t, sb_s, sg_b, sg_h, sg_t, scale_a, scale_u,
                       H, T, S,
                       DK: tl.constexpr, DV: tl.constexpr, DKP: tl.constexpr, DVP: tl.constexpr,
                       BS: tl.constexpr, HAS_BETA: tl.constexpr, HAS_INFL: tl.constexpr,
                       F16_DOT: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr,
                       US: tl.constexpr, UPERM: tl.constexpr, WCOLS: tl.constexpr, UCOLS: tl.constexpr,
                       U_BLOCKS: tl.constexpr):
    """One program per (b, h, t) (x2 when SPLIT: program_id(1) 0 builds W_t, 1 builds U_t; x the column blocks,
    program_id(2): W_t's DKP / WCOLS, of which the first U_BLOCKS also build U_t's UCOLS columns).

    W_t = g_t (I - scale_a * disc * sum_s beta k k^T), U_t = scale_u * disc * sum_s beta k v^T,
    disc = 1 / max(1, mean inflation of the frame) when HAS_INFL (infl_ptr (B, H, T, S)
    contiguous), else 1; without HAS_BETA the beta is already folded into k and v.
    """
    pid = tl.program_id(0)
    col = tl.program_id(2)
    t = pid % T
    bh = pid // T
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    k_base = k_ptr + b * sk_b + h * sk_h + t * sk_t
    v_base = v_ptr + b * sv_b + h * sv_h + t * sv_t
    beta_base = beta_ptr + b * sb_b + h * sb_h + t * sb_t
    frame = bh.to(tl.int64) * T + t
    infl_base = infl_ptr + frame * S
    g = tl.load(decay_ptr + b * sg_b + h * sg_h + t * sg_t).to(tl.float32)
    w_out = w_ptr + frame * DKP * DKP
    u_out = u_ptr + frame * DKP * US
    if SPLIT:
        if tl.program_id(1) == 0:
            _frame_transition(k_base, v_base, beta_base, infl_base, sk_s, sv_s, sb_s, g, scale_a, scale_u,
                              w_out, u_out, S, col, DK, DV, DKP, DVP, BS, HAS_BETA, HAS_INFL, F16_DOT, PREC,
                              True, False, US, UPERM, WCOLS, UCOLS)
        elif col < U_BLOCKS:
            _frame_transition(k_base, v_base, beta_base, infl_base, sk_s, sv_s, sb_s, g, scale_a, scale_u,
                              w_out, u_out, S, col, DK, DV, DKP, DVP, BS, HAS_BETA, HAS_INFL, F16_DOT, PREC,
                              False, True, US, UPERM, WCOLS, UCOLS)
    elif col < U_BLOCKS:
        _frame_transition(k_base, v_base, beta_base, infl_base, sk_s, sv_s, sb_s, g, scale_a, scale_u,
                          w_out, u_out, S, col, DK, DV, DKP, DVP, BS, HAS_BETA, HAS_INFL, F16_DOT, PREC,
                          True, True, US, UPERM, WCOLS, UCOLS)
    else:
        _frame_transition(k_base, v_base, beta_base, infl_base, sk_s, sv_s, sb_s, g, scale_a, scale_u,
                          w_out, u_out, S, col, DK, DV, DKP, DVP, BS, HAS_BETA, HAS_INFL, F16_DOT, PREC,
                          True, False, US, UPERM, WCOLS, UCOLS)
