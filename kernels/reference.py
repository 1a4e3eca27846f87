"""Plain PyTorch (fp32) references for the fused kernels.

Every op here has the same signature as its fast counterpart: initial state in,
final state out. Layouts: B batch, H heads, T frames, S tokens per frame,
Dk key dim, Dv value dim.
"""
import torch


def delta_scan_ref(q, k, v, beta, decay, *, initial_state=None, segment_starts=None, reverse=True):
    """Frame-wise delta rule, forward (inclusive) plus reverse (exclusive) pass, numerator only.

    Forward, state M (Dk x Dv), all S tokens of frame t update from the same state:
        M_t = g_t (I - K_t^T diag(beta_t) K_t) M_{t-1} + K_t^T diag(beta_t) V_t,   O_t = Q_t M_t
    Reverse, R_{T-1} = 0, frame t reads keys/values/gates of frame t+1:
        R_t = g_{t+1} (I - K_{t+1}^T diag(beta_{t+1}) K_{t+1}) R_{t+1} + K_{t+1}^T diag(beta_{t+1}) V_{t+1}
        O^rev_t = Q_t R_t

    Args:
        q, k: (B, H, T, S, Dk).
        v: (B, H, T, S, Dv).
        beta: (B, H, T, S) per-token write strength.
        decay: (B, H, T) per-frame decay g in (0, 1].
        initial_state: optional (B, H, Dk, Dv) forward state before frame 0 (zeros if None).
        segment_starts: optional bool (T,) or (B, T); where frame t+1 starts a segment the
            reverse pass restarts (R_t = 0), so no information crosses the boundary backwards.
        reverse: add the reverse pass (False gives the forward pass alone).

    Returns:
        (out, final_state): out (B, H, T, S, Dv) fp32, the sum of both passes;
        final_state (B, H, Dk, Dv) fp32, the forward state after the last frame.
    """
    q, k, v, beta, decay = (x.float() for x in (q, k, v, beta, decay))
    batch, heads, frames, _, dk = k.shape
    dv = v.shape[-1]
    if initial_state is None:
        state = q.new_zeros(batch, heads, dk, dv)
    else:
        state = initial_state.float().clone()

    def step(state, t):
        k_beta = k[:, :, t] * beta[:, :, t, :, None]
        erased = state - k_beta.transpose(-1, -2) @ (k[:, :, t] @ state)
        return decay[:, :, t, None, None] * erased + k_beta.transpose(-1, -2) @ v[:, :, t]

    out = []
    for t in range(frames):
        state = step(state, t)
        out.append(q[:, :, t] @ state)
    out = torch.stack(out, dim=2)
    if not reverse:
        return out, state

    starts = None
    if segment_starts is not None:
        starts = segment_starts.to(torch.bool).reshape(-1, frames).expand(batch, frames)
    rev_state = q.new_zeros(batch, heads, dk, dv)
    rev_out = [None] * frames
    rev_out[frames - 1] = q.new_zeros(out[:, :, 0].shape)
    for t in range(frames - 2, -1, -1):
        rev_state = step(rev_state, t + 1)
        if starts is not None:
            keep = (~starts[:, t + 1]).to(rev_state.dtype)[:, None, None, None]
            rev_state = rev_state * keep
        rev_out[t] = q[:, :, t] @ rev_state
    return out + torch.stack(rev_out, dim=2), state


# ---------------------------------------------------------------------------
# Camera branch (UCPE): prep, decode and the whole branch, fp32
# ---------------------------------------------------------------------------

def rms_norm_ref(x, weight, eps, inv_rms=None):
    """RMSNorm over the last dim (C channels) with weight (C,), no bias; fp32. inv_rms: optional
    (B, N) 1 / RMS per token used instead of the one over x's channels (head split)."""
    x = x.float()
    if inv_rms is None:
        inv_rms = torch.rsqrt(x.square().mean(dim=-1) + eps)
    return x * inv_rms.float()[..., None] * weight.float()


def _rms_normalize(x, weight, eps, inv_rms=None):
    """Full-channel RMSNorm of (B, N, H, D) over C = H*D per token, fp32; weight (C,)."""
    batch, tokens, heads, dim = x.shape
    return rms_norm_ref(x.reshape(batch, tokens, heads * dim), weight, eps, inv_rms).reshape(batch, tokens, heads, dim)


def rope_tables(rope):
    """Return fp32 (cos, sin), each (N, P), from a rotary table of P complex pairs per token.

    `rope` is either diffusers' complex table (1, 1, N, P) / (N, P), or a (cos, sin) pair.
    """
    if isinstance(rope, (tuple, list)):
        cos, sin = rope
        return cos.float().reshape(-1, cos.shape[-1]).contiguous(), sin.float().reshape(-1, sin.shape[-1]).contiguous()
    rope = rope.reshape(-1, rope.shape[-1])
    return rope.real.float().contiguous(), rope.imag.float().contiguous()


def downscale_ref(x, y):
    """Scale each vector of y (last dim) down to the RMS of the matching vector of x, never up
    (eps 1e-6), as diffusers' UCPE encode does."""
    ref_rms = (x.square().mean(-1, keepdim=True) + 1e-6).sqrt()
    out_rms = (y.square().mean(-1, keepdim=True) + 1e-6).sqrt()
    return y * (ref_rms / out_rms.clamp_min(1e-6)).clamp(max=1.0)


def rotate_pairs_ref(x, cos, sin, *, inverse=False):
    """Rotate the interleaved pairs (2i, 2i+1) = (real, imag) of x's last dim by the angles whose
    (cos, sin) broadcast against x[..., 0::2] (conjugate angles if inverse); fp32."""
    if inverse:
        sin = -sin
    re, im = x[..., 0::2], x[..., 1::2]
    return torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1).flatten(-2)


def ucpe_transform_ref(x, matrix, rope_tables, *, inverse_rope=False):
    """Per-token UCPE: x' = M x on each group of 4 of the first D/2 dims, RoPE on the rest.

    Args:
        x: (B, H, N, D) fp32.
        matrix: (B, N, 4, 4) per-token matrix M.
        rope_tables: (cos, sin) each (N, D/4), or None (second half unchanged). Pair i is
            dims (D/2 + 2i, D/2 + 2i + 1) as (real, imag).
        inverse_rope: rotate by the conjugate angle (decode).
    Returns (B, H, N, D) fp32.
    """
    batch, heads, tokens, dim = x.shape
    half = dim // 2
    groups = x[..., :half].reshape(batch, heads, tokens, half // 4, 4)
    mixed = (matrix.float()[:, None, :, None, :, :] * groups[..., None, :]).sum(-1)
    rotated = x[..., half:]
    if rope_tables is not None:
        rotated = rotate_pairs_ref(rotated, *rope_tables, inverse=inverse_rope)
    return torch.cat((mixed.reshape(batch, heads, tokens, half), rotated), dim=-1)


def cam_prep_ref(q, k, v, ray_transforms, *, num_frames, q_norm_weight=None, k_norm_weight=None,
                 norm_eps=1e-5, downscale=True, q_inv_rms=None, k_inv_rms=None):
    """Camera-branch prep of raw projections, fp32.

    q, k, v: (B, N, H, D) raw camera projections (k after conv_k_cam). RMSNorm over C = H*D
    (when a weight is given) and ReLU on q and k, k *= D^-0.5 * S^-0.5 (S = N / num_frames),
    UCPE (P_T on q, P_inv on k and v) + RoPE, then (downscale=True, diffusers' behaviour) each
    token's head vector is scaled down to its pre-UCPE RMS over D (eps 1e-6). q_inv_rms,
    k_inv_rms: optional (B, N) 1 / RMS per token replacing the one over these H heads (head split).

    Returns (q_enc, k_enc, v_enc, inflation_sq): encodings (B, H, T, S, D) fp32 and the
    per-token key inflation (|k_after| / |k_before|)^2, norms clamped at 1e-6, (B, H, T, S).
    """
    _, p_t, p_inv, rope_cam = ray_transforms
    batch, tokens, heads, dim = q.shape
    frames = num_frames
    spatial = tokens // frames
    q, k, v = q.float(), k.float(), v.float()
    if q_norm_weight is not None:
        q = _rms_normalize(q, q_norm_weight, norm_eps, q_inv_rms)
    if k_norm_weight is not None:
        k = _rms_normalize(k, k_norm_weight, norm_eps, k_inv_rms)
    q = torch.relu(q)
    k = torch.relu(k) * (dim ** -0.5 * spatial ** -0.5)
    tables = None if rope_cam is None else rope_tables(rope_cam)

    def encode(x, matrix):
        x = x.permute(0, 2, 1, 3)  # (B, H, N, D)
        y = ucpe_transform_ref(x, matrix, tables)
        return x, downscale_ref(x, y) if downscale else y

    _, q_enc = encode(q, p_t)
    k_pre, k_enc = encode(k, p_inv)
    _, v_enc = encode(v, p_inv)
    inflation = (k_enc.norm(dim=-1).clamp_min(1e-6) / k_pre.norm(dim=-1).clamp_min(1e-6)).square()

    def frames_view(x):
        return x.reshape(batch, heads, frames, spatial, *x.shape[3:])

    return frames_view(q_enc), frames_view(k_enc), frames_view(v_enc), frames_view(inflation)


def discount_beta_ref(beta, inflation_sq):
    """Dynamic beta discounting: beta / max(1, mean over the frame's S tokens of inflation).

    beta (B, H, T, S), inflation_sq (B, H, T, S) -> (B, H, T, S) fp32.
    """
    frame = inflation_sq.float().mean(dim=-1, keepdim=True)
    return beta.float() / frame.clamp_min(1.0)


def cam_decode_ref(x, p, rope_cam):
    """Inverse UCPE of the scan output: P on the first half, conjugate RoPE on the second.

    x: (B, H, N, D) (or (B, H, T, S, D)); p: (B, N, 4, 4); rope_cam complex (..., N, D/4) or None.
    Returns (B, N, H*D) fp32.
    """
    batch, heads = x.shape[:2]
    dim = x.shape[-1]
    x = x.float().reshape(batch, heads, -1, dim)
    tokens = x.shape[2]
    y = ucpe_transform_ref(x, p, None if rope_cam is None else rope_tables(rope_cam), inverse_rope=True)
    return y.permute(0, 2, 1, 3).reshape(batch, tokens, heads * dim)


def camera_branch_ref(q, k, v, beta, decay, ray_transforms, *, q_norm_weight=None, k_norm_weight=None,
                      norm_eps=1e-5, initial_state=None, segment_starts=None, downscale=True,
                      output_final_state=False, q_inv_rms=None, k_inv_rms=None):
    """The whole camera branch from raw projections, fp32 (see kernels.camera_branch).

    q, k, v (B, N, H, D); beta (B, H, T, S); decay (B, H, T); ray_transforms (P, P_T, P_inv,
    rope_cam); q_inv_rms, k_inv_rms as cam_prep_ref. Returns (out (B, N, H*D) in v's dtype, the forward
    state (B, H, D, D) fp32 after the last frame, or None unless output_final_state).
    """
    frames = decay.shape[-1]
    q_enc, k_enc, v_enc, inflation = cam_prep_ref(
        q, k, v, ray_transforms, num_frames=frames, q_norm_weight=q_norm_weight,
        k_norm_weight=k_norm_weight, norm_eps=norm_eps, downscale=downscale, q_inv_rms=q_inv_rms,
        k_inv_rms=k_inv_rms)
    beta_cam = discount_beta_ref(beta, inflation)
    out, state = delta_scan_ref(q_enc, k_enc, v_enc, beta_cam, decay, initial_state=initial_state,
                                segment_starts=segment_starts, reverse=True)
    out = cam_decode_ref(out, ray_transforms[0], ray_transforms[3]).to(v.dtype)
    return out, (state if output_final_state else None)
