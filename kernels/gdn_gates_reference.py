"""Plain PyTorch reference of `kernels.gdn_gates.gdn_gates`: the gates of a GDN block as diffusers' block computes
them, each linear in the activations' dtype (its output rounded there), the decay in float32."""
import torch.nn.functional as F


def gdn_gates_ref(x, frames, beta_weight, beta_bias, gate_weight, gate_bias, negative_rate, dt_bias):
    """x (B, N, C), N = frames * S; beta_weight, gate_weight (H, C); beta_bias, gate_bias (H,) or None; negative_rate
    (-exp(A_log)) and dt_bias (H,) float32.

    Returns beta (B, H, T, S) = sigmoid(x @ beta_weight^T + beta_bias) in x's dtype (a view of a (B, T, S, H)
    tensor) and decay (B, H, T) float32 = exp(negative_rate * softplus(gate + dt_bias)), gate the linear
    gate_weight, gate_bias of the frame's mean token (x's dtype)."""
    batch, tokens, channels = x.shape
    spatial, heads = tokens // frames, beta_weight.shape[0]
    beta = F.linear(x, beta_weight, beta_bias).sigmoid().reshape(batch, frames, spatial, heads).permute(0, 3, 1, 2)
    frame_mean = x.reshape(batch, frames, spatial, channels).mean(dim=2)
    gate = F.linear(frame_mean, gate_weight, gate_bias).float()
    decay = (negative_rate.float().view(1, 1, -1) * F.softplus(gate + dt_bias.float().view(1, 1, -1))).exp()
    return beta, decay.transpose(1, 2)
