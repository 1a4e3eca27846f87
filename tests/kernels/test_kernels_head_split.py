"""The kernels' optional per-token inverse RMS (the head split of `camrender.parallel.heads`).

A block whose heads are split over ranks holds some heads of q and k, but their RMSNorm spans all
heads: the caller computes 1 / RMS per token over all channels and passes it. Each kernel (Triton
through the interpreter, and its PyTorch reference: backend "torch") run on a head slice with that input equals the
same slice of the whole-tensor result, and passing the whole tensor's own inverse RMS changes nothing.
"""
import pytest
import torch

from camrender import kernels
from camrender.kernels.main_branch import main_branch
from camrender.kernels.main_prep import main_prep
from camrender.kernels.softmax_cam import cam_softmax_encode
from helpers import rel
from test_kernels_camera import branch_inputs
from test_kernels_main_branch import _inputs

HEADS = slice(1, 3)  # heads 1 and 2 of 4: neither end of the channels
TOL = 1e-5


def inv_rms(x, eps):
    """(B, N) 1 / RMS over the last dim (any (B, N, ...) layout with the channels flattened)."""
    x = x.reshape(*x.shape[:2], -1).float()
    return torch.rsqrt(x.square().mean(-1) + eps)


def channels(x, dim):
    """The channels of heads HEADS of a (B, N, H*dim) tensor."""
    return x[..., HEADS.start * dim:HEADS.stop * dim]


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_main_prep_on_a_head_slice(backend):
    q, _, _, _, _, rope, (weight, _) = _inputs(0, heads=4, head_dim=8)
    full = main_prep(q, weight, 4, norm_eps=1e-5, rope=rope, backend=backend)
    part = main_prep(channels(q, 8).contiguous(), channels(weight, 8), 2, norm_eps=1e-5, rope=rope,
                     inv_rms=inv_rms(q, 1e-5), backend=backend)
    assert rel(part, channels(full, 8)) <= TOL
    same = main_prep(q, weight, 4, norm_eps=1e-5, rope=rope, inv_rms=inv_rms(q, 1e-5), backend=backend)
    assert rel(same, full) <= TOL


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_main_branch_on_a_head_slice(backend):
    q, k, v, beta, decay, rope, (q_w, k_w) = _inputs(1, heads=4, head_dim=8)
    norms = dict(norm_eps=1e-5, matmul_precision="ieee", backend=backend)
    full, _ = main_branch(q, k, v, beta, decay, rope, q_norm_weight=q_w, k_norm_weight=k_w, **norms)
    part, _ = main_branch(channels(q, 8), channels(k, 8), channels(v, 8), beta[:, HEADS], decay[:, HEADS], rope,
                          q_norm_weight=channels(q_w, 8), k_norm_weight=channels(k_w, 8),
                          q_inv_rms=inv_rms(q, 1e-5), k_inv_rms=inv_rms(k, 1e-5), **norms)
    assert rel(part, channels(full, 8)) <= TOL


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_camera_branch_on_a_head_slice(backend):
    x = branch_inputs(heads=4, dim=16, seed=2)
    common = dict(norm_eps=1e-5, matmul_precision="ieee", backend=backend)
    full, _ = kernels.camera_branch(x["q"], x["k"], x["v"], x["beta"], x["decay"], x["rays"], q_norm_weight=x["q_w"],
                                 k_norm_weight=x["k_w"], **common)
    q, k, v = (x[name][:, :, HEADS].contiguous() for name in "qkv")
    part, _ = kernels.camera_branch(q, k, v, x["beta"][:, HEADS], x["decay"][:, HEADS], x["rays"],
                                 q_norm_weight=channels(x["q_w"], 16), k_norm_weight=channels(x["k_w"], 16),
                                 q_inv_rms=inv_rms(x["q"], 1e-5), k_inv_rms=inv_rms(x["k"], 1e-5), **common)
    assert rel(part, channels(full, 16)) <= TOL
    with pytest.raises(ValueError, match="k_inv_rms"):
        kernels.camera_branch(x["q"], x["k"], x["v"], x["beta"], x["decay"], x["rays"], q_norm_weight=x["q_w"],
                              k_norm_weight=x["k_w"], q_inv_rms=inv_rms(x["q"], 1e-5), **common)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_softmax_camera_encode_on_a_head_slice(backend):
    x = branch_inputs(heads=4, dim=16, seed=3)
    q, k, v = (x[name].flatten(2) for name in "qkv")
    full = cam_softmax_encode(q, k, v, x["rays"], q_norm_weight=x["q_w"], k_norm_weight=x["k_w"], heads=4,
                              backend=backend)
    part = cam_softmax_encode(*(channels(t, 16).contiguous() for t in (q, k, v)), x["rays"],
                              q_norm_weight=channels(x["q_w"], 16), k_norm_weight=channels(x["k_w"], 16), heads=2,
                              q_inv_rms=inv_rms(q, 1e-5), k_inv_rms=inv_rms(k, 1e-5), backend=backend)
    for got, want in zip(part, full):
        assert rel(got, want[:, :, HEADS]) <= TOL


def test_inverse_rms_shape_is_checked():
    q, _, _, _, _, rope, (weight, _) = _inputs(0, heads=4, head_dim=8)
    with pytest.raises(ValueError, match=r"inv_rms must have shape \(2, 24\)"):
        main_prep(q, weight, 4, inv_rms=torch.ones(2, 5))
