"""Fused main Gated DeltaNet branch: prep, KV + Z bidirectional scans, division.

Pipeline (release shape B=2, T=21, S=880, H=20, D=112):
1. `main_prep` on q and k, one pass each: full-C RMSNorm, ReLU, k-scale D^-0.5 S^-0.5, writing
   the un-rotated (Z stream) and the RoPE'd (KV stream) result, (B, N, C) in the input dtype.
2. The scans, two interchangeable paths (`SCAN_CONFIG["scan"]`):
   - "chunkwise" (default): `kernels.delta_scan` on the KV stream (q_rot, k_rot, v) and on the Z
     stream (q, k, ones), both reading the (B, N, C) tensors in place through permuted views
     (v straight from the qkv output); then `_divide_heads_kernel` writes
     out = num / (den + eps), (B, N, C) in v.dtype.
   - "recurrent": `_main_scan_kernel`, one launch, grid (value-column blocks + 1, B*H, 2
     directions). Programs with pid_v < NV carry fp32 KV state columns [v0, v0+BV) of one (b, h)
     and one direction: per frame KM = K M, M <- g M + K^T (beta * (V - g KM)), then O = Q M
     (forward: after the update, inclusive; reverse: before it, exclusive). The program
     pid_v == NV carries the Z state (a D-vector): den = q . z. Both directions add into
     zero-initialised fp32 buffers with atomics (two addends per element: order-independent,
     deterministic); `_divide_kernel` divides.
Initial states feed the forward scans; final states are the forward states after frame T-1;
segment_starts restarts the reverse scans. Reference: `kernels.main_reference.main_branch_ref`.
"""
import torch
import triton
import triton.language as tl

from .main_prep import main_prep
from .main_reference import main_branch_ref, rope_tables
from .short_conv import use_triton

# scan: "chunkwise" runs kernels.delta_scan (frame-parallel transitions, short D x D recurrence,
# parallel output) on the KV and the Z stream, reading the (B, N, C) tensors in place through
# permuted views; "recurrent" runs `_main_scan_kernel` below (both streams, both directions, one
# launch). H200, release shape: chunkwise 1.8 ms for both scans, recurrent 2.5-3.1 ms.
# For "recurrent": BS tokens per step, BV state columns per program; rope_on_load rotates q, k inside
# the scan instead of reading rotated copies from the prep (20x slower on H200: keep False).
SCAN_CONFIG = {"scan": "chunkwise", "BS": 64, "BV": 32, "num_warps": 4, "num_stages": 2, "rope_on_load": False}


@triton.jit
def _load_rows(base, rows, stride_n, d_offs, mask, cos_ptr, sin_ptr, HALF, ROPE: tl.constexpr):
    """Load a (BS, BD) tile of head vectors at token rows `rows`; rotate pairs if ROPE. fp32."""
    ptrs = base + rows[:, None] * stride_n
    x = tl.load(ptrs + d_offs[None, :], mask=mask, other=0.0).to(tl.float32)
    if ROPE:
        xp = tl.load(ptrs + (d_offs ^ 1)[None, :], mask=mask, other=0.0).to(tl.float32)
        tab = rows[:, None] * HALF + (d_offs // 2)[None, :]
        cos = tl.load(cos_ptr + tab, mask=mask, other=0.0)
        sin = tl.load(sin_ptr + tab, mask=mask, other=0.0)
        sign = tl.where((d_offs % 2) == 0, -1.0, 1.0)
        x = x * cos + xp * sin * sign[None, :]
    return x


@triton.jit
def _kv_emit(q_base, stride_qn, num_base, M, t, S, C, d_offs, d_mask, v_offs, v_mask, cos_ptr, sin_ptr, HALF,
             BS: tl.constexpr, PREC: tl.constexpr, ROPE: tl.constexpr):
    for s0 in range(0, S, BS):
        s_offs = s0 + tl.arange(0, BS)
        s_mask = s_offs < S
        rows = (t * S + s_offs).to(tl.int64)
        q = _load_rows(q_base, rows, stride_qn, d_offs, s_mask[:, None] & d_mask[None, :], cos_ptr, sin_ptr, HALF,
                       ROPE)
        o = tl.dot(q, M, input_precision=PREC)
        tl.atomic_add(num_base + rows[:, None] * C + v_offs[None, :], o, mask=s_mask[:, None] & v_mask[None, :],
                      sem="relaxed")


@triton.jit
def _z_emit(q_base, stride_qn, den_base, z, t, S, H, d_offs, d_mask, BS: tl.constexpr):
    for s0 in range(0, S, BS):
        s_offs = s0 + tl.arange(0, BS)
        s_mask = s_offs < S
        rows = (t * S + s_offs).to(tl.int64)
        q = tl.load(q_base + rows[:, None] * stride_qn + d_offs[None, :], mask=s_mask[:, None] & d_mask[None, :],
                    other=0.0).to(tl.float32)
        den = tl.sum(q * z[None, :], axis=1)
        tl.atomic_add(den_base + rows * H, den, mask=s_mask, sem="relaxed")


@triton.jit
def _main_scan_kernel(
    q_ptr, k_ptr, qr_ptr, kr_ptr, v_ptr, beta_ptr, decay_ptr, cos_ptr, sin_ptr, starts_ptr,
    init_kv_ptr, init_z_ptr, num_ptr, den_ptr, final_kv_ptr, final_z_ptr,
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
    stride_bb, stride_bh, stride_bt, stride_bs,
    stride_db, stride_dh, stride_dt,
    T, S, H, D, C,
    NV: tl.constexpr, ROPE_ON_LOAD: tl.constexpr, HAS_INIT: tl.constexpr, HAS_STARTS: tl.constexpr,
    WRITE_FINAL: tl.constexpr,
    BS: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1)
    rev = tl.program_id(2)
    b = pid_bh // H
    h = pid_bh % H
    half = D // 2
    d_offs = tl.arange(0, BD)
    d_mask = d_offs < D
    q_base = q_ptr + b.to(tl.int64) * stride_qb + h * D
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h * D
    qr_base = qr_ptr + b.to(tl.int64) * stride_qb + h * D
    kr_base = kr_ptr + b.to(tl.int64) * stride_kb + h * D
    beta_base = beta_ptr + b.to(tl.int64) * stride_bb + h * stride_bh
    decay_base = decay_ptr + b * stride_db + h * stride_dh
    n_tokens = T * S

    if pid_v < NV:
        v_offs = pid_v * BV + tl.arange(0, BV)
        v_mask = v_offs < D
        v_base = v_ptr + b.to(tl.int64) * stride_vb + h * D
        num_base = num_ptr + b.to(tl.int64) * n_tokens * C + h * D
        state_offs = pid_bh.to(tl.int64) * D * D + d_offs[:, None] * D + v_offs[None, :]
        state_mask = d_mask[:, None] & v_mask[None, :]
        M = tl.zeros((BD, BV), dtype=tl.float32)
        if HAS_INIT:
            M = tl.load(init_kv_ptr + state_offs, mask=state_mask, other=0.0) * (1 - rev).to(tl.float32)
        for i in range(T):
            t = i + rev * (T - 1 - 2 * i)
            g = tl.load(decay_base + t * stride_dt).to(tl.float32)
            if rev == 1:
                _kv_emit(qr_base, stride_qn, num_base, M, t, S, C, d_offs, d_mask, v_offs, v_mask, cos_ptr, sin_ptr,
                         half, BS, PREC, ROPE_ON_LOAD)
            dM = tl.zeros((BD, BV), dtype=tl.float32)
            for s0 in range(0, S, BS):
                s_offs = s0 + tl.arange(0, BS)
                s_mask = s_offs < S
                rows = (t * S + s_offs).to(tl.int64)
                k = _load_rows(kr_base, rows, stride_kn, d_offs, s_mask[:, None] & d_mask[None, :], cos_ptr, sin_ptr,
                               half, ROPE_ON_LOAD)
                v = tl.load(v_base + rows[:, None] * stride_vn + v_offs[None, :],
                            mask=s_mask[:, None] & v_mask[None, :], other=0.0).to(tl.float32)
                bt = tl.load(beta_base + t * stride_bt + s_offs * stride_bs, mask=s_mask, other=0.0).to(tl.float32)
                km = tl.dot(k, M, input_precision=PREC)
                delta = bt[:, None] * (v - g * km)
                dM = tl.dot(tl.trans(k), delta, dM, input_precision=PREC)
            M = g * M + dM
            if HAS_STARTS:
                # reverse scans restart at a segment start: nothing crosses it backwards
                st = tl.load(starts_ptr + b * T + t).to(tl.float32)
                M = M * (1.0 - st * rev)
            if rev == 0:
                _kv_emit(qr_base, stride_qn, num_base, M, t, S, C, d_offs, d_mask, v_offs, v_mask, cos_ptr, sin_ptr,
                         half, BS, PREC, ROPE_ON_LOAD)
        if WRITE_FINAL:
            if rev == 0:
                tl.store(final_kv_ptr + state_offs, M, mask=state_mask)
    else:
        den_base = den_ptr + b.to(tl.int64) * n_tokens * H + h
        z_offs = pid_bh.to(tl.int64) * D + d_offs
        z = tl.zeros((BD,), dtype=tl.float32)
        if HAS_INIT:
            z = tl.load(init_z_ptr + z_offs, mask=d_mask, other=0.0) * (1 - rev).to(tl.float32)
        for i in range(T):
            t = i + rev * (T - 1 - 2 * i)
            g = tl.load(decay_base + t * stride_dt).to(tl.float32)
            if rev == 1:
                _z_emit(q_base, stride_qn, den_base, z, t, S, H, d_offs, d_mask, BS)
            dz = tl.zeros((BD,), dtype=tl.float32)
            for s0 in range(0, S, BS):
                s_offs = s0 + tl.arange(0, BS)
                s_mask = s_offs < S
                rows = (t * S + s_offs).to(tl.int64)
                k = tl.load(k_base + rows[:, None] * stride_kn + d_offs[None, :],
                            mask=s_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
                bt = tl.load(beta_base + t * stride_bt + s_offs * stride_bs, mask=s_mask, other=0.0).to(tl.float32)
                kz = tl.sum(k * z[None, :], axis=1)
                delta = bt * (1.0 - g * kz)
                dz += tl.sum(k * delta[:, None], axis=0)
            z = g * z + dz
            if HAS_STARTS:
                st = tl.load(starts_ptr + b * T + t).to(tl.float32)
                z = z * (1.0 - st * rev)
            if rev == 0:
                _z_emit(q_base, stride_qn, den_base, z, t, S, H, d_offs, d_mask, BS)
        if WRITE_FINAL:
            if rev == 0:
                tl.store(final_z_ptr + z_offs, z, mask=d_mask)


@triton.jit
def _divide_heads_kernel(num_ptr, den_ptr, out_ptr, sn_b, sn_h, sn_t, sn_s, sd_b, sd_h, sd_t, sd_s, T, S, H, D, eps,
                         BS: tl.constexpr, BD: tl.constexpr):
    """out[b, t*S + s, h*D + d] = num[b, h, t, s, d] / (den[b, h, t, s] + eps); one (b, h, t, s-block) per program."""
    n_sblocks = tl.cdiv(S, BS)
    t = tl.program_id(0) // n_sblocks
    s = (tl.program_id(0) % n_sblocks) * BS + tl.arange(0, BS)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    d = tl.arange(0, BD)
    m = (s < S)[:, None] & (d < D)[None, :]
    num = tl.load(num_ptr + b * sn_b + h * sn_h + t * sn_t + s[:, None] * sn_s + d[None, :], mask=m, other=0.0)
    den = tl.load(den_ptr + b * sd_b + h * sd_h + t * sd_t + s * sd_s, mask=s < S, other=1.0)
    rows = (b * T + t) * S + s
    tl.store(out_ptr + (rows[:, None] * H + h) * D + d[None, :], (num / (den[:, None] + eps)).to(
        out_ptr.dtype.element_ty), mask=m)


def _chunkwise(qn, kn, q_rot, k_rot, v, beta, decay, out, *, eps, initial_state, segment_starts, precision,
               return_final_state):
    """KV and Z streams through kernels.delta_scan on permuted (B, H, T, S, D) views; divide into `out`."""
    from .delta_scan import delta_scan

    batch, tokens, channels = v.shape
    heads, frames, spatial = beta.shape[1], beta.shape[2], beta.shape[3]
    head_dim = channels // heads

    def heads_view(x):
        return x.reshape(batch, frames, spatial, heads, head_dim).permute(0, 3, 1, 2, 4)

    init_kv = init_z = None
    if initial_state is not None:
        init_kv, init_z = initial_state
    # tf32: fp16 operands (same mantissa, twice the rate; normalised q, scaled k and bf16 v fit its range).
    fast = precision == "tf32"
    num, kv = delta_scan(heads_view(q_rot), heads_view(k_rot), heads_view(v), beta, decay, initial_state=init_kv,
                         segment_starts=segment_starts, precision=precision, f16_operands=fast)
    ones = torch.ones(batch, heads, frames, spatial, 1, device=v.device, dtype=torch.float32)
    den, z = delta_scan(heads_view(qn), heads_view(kn), ones, beta, decay, initial_state=init_z,
                        segment_starts=segment_starts, precision=precision, f16_operands=fast)
    bs = 32
    _divide_heads_kernel[(frames * triton.cdiv(spatial, bs), batch * heads)](
        num, den, out, *num.stride()[:4], *den.stride()[:4], frames, spatial, heads, head_dim, float(eps),
        BS=bs, BD=max(16, triton.next_power_of_2(head_dim)), num_warps=4)
    return (kv, z) if return_final_state else None


@triton.jit
def _divide_kernel(num_ptr, den_ptr, out_ptr, R, C, D, H, eps, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r_offs = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c_offs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m = (r_offs < R)[:, None] & (c_offs < C)[None, :]
    r64 = r_offs.to(tl.int64)
    num = tl.load(num_ptr + r64[:, None] * C + c_offs[None, :], mask=m, other=0.0)
    den = tl.load(den_ptr + r64[:, None] * H + (c_offs // D)[None, :], mask=m, other=1.0)
    tl.store(out_ptr + r64[:, None] * C + c_offs[None, :], (num / (den + eps)).to(out_ptr.dtype.element_ty), mask=m)


def main_scan(qn, kn, v, beta, decay, cos, sin, *, q_rot=None, k_rot=None, initial_state=None,
              segment_starts=None, precision="tf32", return_final_state=False, config=None):
    """Bidirectional KV + Z scans on prepped (normalised, ReLU'd, k-scaled, un-rotated) q, k.

    Args:
        qn, kn, v: (B, N, C), channel stride 1. beta (B, H, T, S); decay (B, H, T); cos, sin (N, D/2) fp32.
        q_rot, k_rot: optional pre-rotated qn, kn (same layout as qn, kn); None rotates on load.

    Returns:
        (num (B, N, C) fp32, den (B, N, H) fp32, final (kv, z) or None).
    """
    cfg = dict(SCAN_CONFIG, **(config or {}))
    batch, tokens, channels = v.shape
    heads, frames, spatial = beta.shape[1], beta.shape[2], beta.shape[3]
    head_dim = channels // heads
    dev = v.device
    rope_on_load = q_rot is None
    if rope_on_load:
        q_rot, k_rot = qn, kn
    for x in (qn, kn, q_rot, k_rot, v):
        if x.stride(-1) != 1:
            raise ValueError("q, k, v need a contiguous channel axis")
    if q_rot.stride() != qn.stride() or k_rot.stride() != kn.stride():
        raise ValueError("q_rot, k_rot must have the strides of q, k")
    num = torch.zeros(batch, tokens, channels, device=dev, dtype=torch.float32)
    den = torch.zeros(batch, tokens, heads, device=dev, dtype=torch.float32)
    has_init = initial_state is not None
    if has_init:
        init_kv = initial_state[0].float().contiguous()
        init_z = initial_state[1].float().reshape(batch, heads, head_dim).contiguous()
    else:
        init_kv = init_z = num
    if return_final_state:
        final_kv = torch.empty(batch, heads, head_dim, head_dim, device=dev, dtype=torch.float32)
        final_z = torch.empty(batch, heads, head_dim, 1, device=dev, dtype=torch.float32)
    else:
        final_kv = final_z = num
    has_starts = segment_starts is not None
    if has_starts:
        starts = segment_starts.to(device=dev, dtype=torch.int8).reshape(-1, frames).expand(batch, frames).contiguous()
    else:
        starts = num
    if precision not in ("tf32", "ieee"):
        raise ValueError(f"precision must be 'tf32' or 'ieee', got {precision!r}")
    bd = max(16, triton.next_power_of_2(head_dim))
    nv = triton.cdiv(head_dim, cfg["BV"])
    grid = (nv + 1, batch * heads, 2)
    _main_scan_kernel[grid](
        qn, kn, q_rot, k_rot, v, beta, decay, cos, sin, starts, init_kv, init_z, num, den, final_kv, final_z,
        qn.stride(0), qn.stride(1), kn.stride(0), kn.stride(1), v.stride(0), v.stride(1),
        *beta.stride(), *decay.stride(),
        frames, spatial, heads, head_dim, channels,
        NV=nv, ROPE_ON_LOAD=rope_on_load, HAS_INIT=has_init, HAS_STARTS=has_starts, WRITE_FINAL=return_final_state,
        BS=cfg["BS"], BD=bd, BV=cfg["BV"], PREC=precision,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return num, den, ((final_kv, final_z) if return_final_state else None)


def main_branch(q, k, v, beta, decay, rope, *, q_norm_weight, k_norm_weight, norm_eps=1e-5, eps=1e-8,
                initial_state=None, segment_starts=None, precision="tf32", backend="auto",
                return_final_state=False, config=None):
    """Main GDN branch of one block, fused; same contract as `kernels.main_reference.main_branch_ref`.

    Args:
        q: (B, N, C) raw query projection; k: (B, N, C) key after the short conv; v: (B, N, C) value.
            Channel stride 1; slices of the fused qkv output are read in place.
        beta: (B, H, T, S); decay: (B, H, T) (any strides).
        rope: diffusers' complex table (1, 1, N, D/2) or (cos, sin) of (N, D/2).
        q_norm_weight, k_norm_weight: (C,); norm_eps: RMSNorm epsilon; eps: denominator epsilon.
        initial_state: optional (kv (B, H, D, D), z (B, H, D, 1)) fp32 forward states.
        segment_starts: optional bool (T,) or (B, T); reverse scans restart at segment starts.
        precision: "tf32" (tensor cores) or "ieee" (exact fp32 dots).
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else PyTorch), "triton", "torch".
        return_final_state: also return the forward states (kv, z) after the last frame.
        config: optional overrides of SCAN_CONFIG (scan path and tiles).

    Returns:
        out (B, N, C) in v.dtype, or (out, (kv, z)).
    """
    if not use_triton(v, backend):
        return main_branch_ref(q, k, v, beta, decay, rope, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight,
                               norm_eps=norm_eps, eps=eps, initial_state=initial_state, segment_starts=segment_starts,
                               return_final_state=return_final_state)  # config only tunes the Triton path
    batch, tokens, channels = v.shape
    heads, spatial = beta.shape[1], beta.shape[3]
    head_dim = channels // heads
    q, k, v = (x.reshape(batch, tokens, channels) for x in (q, k, v))
    cfg = dict(SCAN_CONFIG, **(config or {}))
    cos, sin = rope_tables(rope)
    cos, sin = cos.to(v.device), sin.to(v.device)
    k_scale = head_dim ** -0.5 * spatial ** -0.5
    if cfg["scan"] not in ("chunkwise", "recurrent"):
        raise ValueError(f"config scan must be 'chunkwise' or 'recurrent', got {cfg['scan']!r}")
    if cfg["rope_on_load"] and cfg["scan"] == "recurrent":
        qn = main_prep(q, q_norm_weight, heads, norm_eps=norm_eps)
        kn = main_prep(k, k_norm_weight, heads, norm_eps=norm_eps, scale=k_scale)
        q_rot = k_rot = None
    else:
        qn, q_rot = main_prep(q, q_norm_weight, heads, norm_eps=norm_eps, rope=(cos, sin), keep_unrotated=True)
        kn, k_rot = main_prep(k, k_norm_weight, heads, norm_eps=norm_eps, scale=k_scale, rope=(cos, sin),
                              keep_unrotated=True)
    out = torch.empty(batch, tokens, channels, device=v.device, dtype=v.dtype)
    if cfg["scan"] == "chunkwise":
        final = _chunkwise(qn, kn, q_rot, k_rot, v, beta, decay, out, eps=eps, initial_state=initial_state,
                           segment_starts=segment_starts, precision=precision, return_final_state=return_final_state)
        return (out, final) if return_final_state else out
    num, den, final = main_scan(qn, kn, v, beta, decay, cos, sin, q_rot=q_rot, k_rot=k_rot,
                                initial_state=initial_state,
                                segment_starts=segment_starts, precision=precision,
                                return_final_state=return_final_state, config=config)
    block_r, block_c = 16, 128
    rows = batch * tokens
    _divide_kernel[(triton.cdiv(rows, block_r), triton.cdiv(channels, block_c))](
        num, den, out, rows, channels, head_dim, heads, float(eps), BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)
    if return_final_state:
        return out, final
    return out
