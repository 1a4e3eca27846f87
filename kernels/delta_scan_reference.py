"""Plain PyTorch (fp32) reference of `kernels.delta_scan.delta_scan`: same arguments, initial state in,
final state out. Layouts: B batch, H heads, T frames, S tokens per frame, Dk key dim, Dv value dim.
"""
import torch


def delta_scan_ref(q, k, v, beta, decay, *, initial_state=None, segment_starts=None, reverse=True,
                   output_final_state=False):
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
        output_final_state: return the forward state after the last frame (else None in its place).

    Returns:
        (out, final_state): out (B, H, T, S, Dv) fp32, the sum of both passes;
        final_state (B, H, Dk, Dv) fp32, the forward state after the last frame, or None.
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
    final_state = state if output_final_state else None
    if not reverse:
        return out, final_state

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
    return out + torch.stack(rev_out, dim=2), final_state
