"""Camera-branch kernels (Triton through the interpreter on CPU) against diffusers' PyTorch camera
branch and the fp32 references, on tiny shapes with random weights and random camera rays."""
import pytest
import torch
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers import transformer_sana_wm as sana_wm

from camrender import kernels

from camrender.kernels.cam_decode_reference import cam_decode_ref
from camrender.kernels.cam_prep_reference import cam_prep_ref
from helpers import rel


def random_rays(batch, tokens, dim, gen):
    """diffusers-style (P, P_T, P_inv, rope_cam): random rotation + translation per token."""
    rot, _ = torch.linalg.qr(torch.randn(batch * tokens, 3, 3, generator=gen, dtype=torch.float64))
    p = torch.zeros(batch * tokens, 4, 4, dtype=torch.float64)
    p[:, :3, :3] = rot
    p[:, :3, 3] = 2.0 * torch.randn(batch * tokens, 3, generator=gen, dtype=torch.float64)
    p[:, 3, 3] = 1.0
    p = p.float().reshape(batch, tokens, 4, 4)
    angles = 6.2832 * torch.rand(1, 1, tokens, dim // 4, generator=gen)
    rope = torch.polar(torch.ones_like(angles), angles)
    return p, p.transpose(-1, -2), sana_wm._invert_SE3(p), rope


def branch_inputs(batch=2, frames=2, spatial=5, heads=2, dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = frames * spatial
    q, k, v = (torch.randn(batch, tokens, heads, dim, generator=gen) for _ in range(3))
    beta = torch.rand(batch, heads, frames, spatial, generator=gen)
    decay = 0.5 + 0.5 * torch.rand(batch, heads, frames, generator=gen)
    q_w, k_w = (0.5 + torch.rand(heads * dim, generator=gen) for _ in range(2))
    return dict(q=q, k=k, v=v, beta=beta, decay=decay, rays=random_rays(batch, tokens, dim, gen), q_w=q_w, k_w=k_w)


def diffusers_camera_branch(x, eps=1e-5):
    """The block's q_norm_cam / k_norm_cam (RMSNorm over C) + ReLU, then the cam attention module."""
    batch, tokens, heads, dim = x["q"].shape
    q_norm, k_norm = RMSNorm(heads * dim, eps=eps), RMSNorm(heads * dim, eps=eps)
    with torch.no_grad():
        q_norm.weight.copy_(x["q_w"])
        k_norm.weight.copy_(x["k_w"])
        q = torch.relu(q_norm(x["q"].reshape(batch, tokens, -1)).reshape(batch, tokens, heads, dim))
        k = torch.relu(k_norm(x["k"].reshape(batch, tokens, -1)).reshape(batch, tokens, heads, dim))
        return sana_wm.SanaWMBidirectionalGDNCamAttention()(q, k, x["v"], x["rays"], x["beta"], x["decay"],
                                                            x["decay"].shape[-1])


def run_branch(x, **kwargs):
    kwargs.setdefault("q_norm_weight", x["q_w"])
    kwargs.setdefault("k_norm_weight", x["k_w"])
    kwargs.setdefault("matmul_precision", "ieee")
    return kernels.camera_branch(x["q"], x["k"], x["v"], x["beta"], x["decay"], x["rays"], **kwargs)


@pytest.mark.parametrize("dim,frames", [(16, 1), (16, 2), (16, 5), (112, 1), (112, 2), (112, 5)])
def test_camera_branch_matches_diffusers(dim, frames):
    x = branch_inputs(frames=frames, spatial=3 if dim == 112 else 5, dim=dim, seed=dim + frames)
    expected = diffusers_camera_branch(x)
    got, _ = run_branch(x, backend="triton")
    assert got.shape == expected.shape == (2, x["q"].shape[1], 2 * dim)
    assert rel(got, expected) < 1e-4
    assert rel(run_branch(x, backend="torch")[0], expected) < 1e-4


@pytest.mark.parametrize("variant", ["no_norm", "no_rope", "no_downscale"])
def test_camera_branch_variants_match_reference(variant):
    x = branch_inputs(frames=3, seed=7)
    default, _ = run_branch(x, backend="torch")
    kwargs = dict(q_norm_weight=None, k_norm_weight=None) if variant == "no_norm" else {}
    if variant == "no_rope":
        x = dict(x, rays=x["rays"][:3] + (None,))
    if variant == "no_downscale":
        kwargs["downscale"] = False
    got, _ = run_branch(x, backend="triton", **kwargs)
    ref, _ = run_branch(x, backend="torch", **kwargs)
    assert rel(got, ref) < 1e-5
    assert rel(got, default) > 1e-4  # the switch matters on these inputs


@pytest.mark.parametrize("tuning", [dict(stage_block_s=8, block_v=32, s_split=2),
                                    dict(block_v=64, out_block_s=16, num_warps=(8, 4, 8), split=False)])
def test_camera_branch_launch_variants_match_reference(tuning):
    """Other launch settings: stage tiles, recurrence column blocks (several quads per program),
    output tiles and programs per frame, the transition kernel without its W/U split."""
    x = branch_inputs(frames=3, spatial=4, seed=23)
    state = 0.1 * torch.randn(2, 2, 16, 16, generator=torch.Generator().manual_seed(1))
    starts = torch.tensor([True, False, True])
    got, got_state = run_branch(x, backend="triton", tuning=tuning, initial_state=state, segment_starts=starts,
                                output_final_state=True)
    ref, ref_state = run_branch(x, backend="torch", initial_state=state, segment_starts=starts,
                                output_final_state=True)
    assert rel(got, ref) < 1e-5 and rel(got_state, ref_state) < 1e-5


def test_cam_prep_and_decode_match_references():
    x = branch_inputs(frames=2, dim=112, spatial=3, seed=11)
    args = (x["q"], x["k"], x["v"], x["rays"])
    kw = dict(num_frames=2, q_norm_weight=x["q_w"], k_norm_weight=x["k_w"])
    for got, ref in zip(kernels.cam_prep(*args, **kw), cam_prep_ref(*args, **kw)):
        assert got.shape == ref.shape
        assert rel(got, ref) < 1e-5
    # decode == diffusers' own inverse transform on the same ray-space tensor
    ray_space = torch.randn(2, 2, 6, 112)
    expected = sana_wm._apply_ucpe_transform(ray_space, x["rays"][0], x["rays"][3], inverse_rope=True)
    expected = expected.permute(0, 2, 1, 3).reshape(2, 6, 224)
    assert rel(kernels.cam_decode(ray_space, x["rays"][0], x["rays"][3]), expected) < 1e-6
    assert rel(cam_decode_ref(ray_space, x["rays"][0], x["rays"][3]), expected) < 1e-6


def test_camera_split_and_resume_with_segments():
    """Frames [0, 2) then [2, 4) from the saved state == the whole clip with the reverse pass cut at 2."""
    x = branch_inputs(frames=4, spatial=3, seed=13)
    spatial, cut = 3, 2
    starts = torch.tensor([True, False, True, False])
    whole, whole_state = run_branch(x, segment_starts=starts, output_final_state=True)

    def piece(lo, hi):
        sl = slice(lo * spatial, hi * spatial)
        p, p_t, p_inv, rope = x["rays"]
        return dict(x, q=x["q"][:, sl].contiguous(), k=x["k"][:, sl].contiguous(), v=x["v"][:, sl].contiguous(),
                    beta=x["beta"][:, :, lo:hi], decay=x["decay"][:, :, lo:hi],
                    rays=(p[:, sl], p_t[:, sl], p_inv[:, sl], rope[:, :, sl]))

    first, state = run_branch(piece(0, cut), output_final_state=True)
    second, end_state = run_branch(piece(cut, 4), initial_state=state, output_final_state=True)
    assert rel(torch.cat([first, second], dim=1), whole) < 1e-5
    assert rel(end_state, whole_state) < 1e-5
    ref, ref_state = run_branch(x, segment_starts=starts, output_final_state=True, backend="torch")
    assert rel(whole, ref) < 1e-5 and rel(whole_state, ref_state) < 1e-5


@pytest.mark.parametrize("tuning", [None, dict(rec_f16=False, w_f16=False)])
def test_camera_branch_bf16_in_bf16_out(tuning):
    """tf32 mode: fp16 encodings, W_t, states and recurrence products (default), or tf32 ones."""
    x = branch_inputs(frames=2, seed=17)
    xb = dict(x, **{name: x[name].to(torch.bfloat16) for name in ("q", "k", "v", "beta")})
    got, _ = run_branch(xb, matmul_precision="tf32", backend="triton", tuning=tuning)
    assert got.dtype == torch.bfloat16
    ref, _ = run_branch(dict(xb, **{name: xb[name].float() for name in ("q", "k", "v", "beta")}), backend="torch")
    assert rel(got, ref) < 1e-2


def test_camera_branch_rejects_bad_arguments():
    x = branch_inputs(frames=2, spatial=3, seed=19)
    with pytest.raises(ValueError, match=r"k must have shape \(2, 6, 2, 16\)"):
        kernels.camera_branch(x["q"], x["k"][:, :4], x["v"], x["beta"], x["decay"], x["rays"],
                              q_norm_weight=x["q_w"], k_norm_weight=x["k_w"])
    with pytest.raises(ValueError, match=r"beta must have shape \(2, 2, 2, 3\)"):
        run_branch(dict(x, beta=x["beta"][..., :2]))
    with pytest.raises(ValueError, match="must be contiguous"):
        run_branch(dict(x, q=x["q"].transpose(0, 1).contiguous().transpose(0, 1)))
    with pytest.raises(ValueError, match="floating-point"):
        run_branch(dict(x, v=x["v"].to(torch.int32)))
    with pytest.raises(ValueError, match=r"q_norm_weight must have shape \(32,\)"):
        run_branch(x, q_norm_weight=x["q_w"][:8])
    with pytest.raises(ValueError, match=r"P_inv must have shape \(2, 6, 4, 4\)"):
        run_branch(dict(x, rays=(x["rays"][0], x["rays"][1], x["rays"][2][:, :3], x["rays"][3])))
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 2, 16, 16\)"):
        run_branch(x, initial_state=torch.zeros(2, 2, 16, 8))
    with pytest.raises(ValueError, match="backend"):
        run_branch(x, backend="cuda")
    bad = branch_inputs(frames=2, spatial=3, dim=12, seed=19)  # D/2 = 6 is not divisible by 4
    with pytest.raises(ValueError, match=r"D/2 divisible by 4.*\(B, N, H, D\)"):
        run_branch(bad)


def test_stage_token_tiles_change_no_bit():
    """`_grid.filling_tile` halves the stage's tokens a program on a segment: the branch's bits stay (interpreted;
    compiled, a row's sum of squares may be reduced in another order)."""
    x = branch_inputs(frames=3, spatial=7, dim=16, seed=29)
    want = run_branch(x, backend="triton", tuning=dict(stage_block_s=16))[0]
    for block_s in (8, 4):
        assert torch.equal(run_branch(x, backend="triton", tuning=dict(stage_block_s=block_s))[0], want)


def test_transition_column_blocks_change_no_bit():
    """The camera scan's transition in column blocks (`run_scan` col_split, an option: whole programs are the
    default): U_t's blocks go to the permuted, quad-major columns the decode reads; interpreted, the bits are the
    unsplit kernel's."""
    x = branch_inputs(frames=3, spatial=7, dim=32, seed=31)
    want = run_branch(x, backend="triton")[0]
    for tuning in (dict(col_split=2), dict(col_split=2, split=False)):
        assert torch.equal(run_branch(x, backend="triton", tuning=tuning)[0], want)
