"""Kernel checks that need CUDA (`python3 -m pytest -m gpu`): release-size shapes, the tf32 and fp16
scan paths, the inline-asm silu of the FFN, launch configurations, and cuDNN settings of the decode.

These were the pass/fail parts of bench/bench_cam_branch.py (delta_scan check), bench/bench_ffn.py
(--sweep against the default launch) and bench/bench_decode.py (variants against the default); the
bench scripts keep the timings. Tiny-shape versions of every kernel run on the CPU in
tests/kernels/test_kernel_cases.py.
"""
import pytest
import torch

from helpers import rel, temporal_conv_exact

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dv", [112, 1])  # the KV stream (Dv = D) and the normaliser stream (Dv = 1)
def test_delta_scan_release_head_dim(dv):
    from camrender.kernels import delta_scan, delta_scan_ref

    gen = torch.Generator().manual_seed(1)
    b, h, t, s, dk = 1, 4, 5, 200, 112
    q = torch.rand(b, h, t, s, dk, generator=gen).cuda()
    k = (torch.rand(b, h, t, s, dk, generator=gen) * (dk * s) ** -0.5).cuda()
    v = torch.randn(b, h, t, s, dv, generator=gen).cuda()
    beta = torch.rand(b, h, t, s, generator=gen).cuda()
    decay = (0.5 + 0.5 * torch.rand(b, h, t, generator=gen)).cuda()
    state = torch.randn(b, h, dk, dv, generator=gen).cuda()
    starts = torch.tensor([True, False, False, True, False], device="cuda")
    kwargs = dict(initial_state=state, segment_starts=starts, output_final_state=True)
    ref, ref_state = delta_scan_ref(q, k, v, beta, decay, **kwargs)
    exact, exact_state = delta_scan(q, k, v, beta, decay, matmul_precision="ieee", **kwargs)
    assert rel(exact, ref) < 1e-5 and rel(exact_state, ref_state) < 1e-5  # H200: 3e-7, 4e-7
    for options in (dict(matmul_precision="tf32"), dict(matmul_precision="tf32", f16_operands=True)):
        fast, fast_state = delta_scan(q, k, v, beta, decay, **options, **kwargs)
        assert rel(fast, ref) < 1e-2 and rel(fast_state, ref_state) < 1e-2, options  # H200 tf32: 2e-3, 3.5e-3
        assert not torch.equal(fast, exact), options  # the tf32 path really ran


def _glu_inputs(frames=6, height=22, width=40, hidden=96, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    h = (torch.randn(frames, height * width, 2 * hidden, generator=gen) * 2).to("cuda", dtype)
    weight = (torch.randn(2 * hidden, 1, 3, 3, generator=gen) * 0.3).to("cuda", dtype)
    bias = (torch.randn(2 * hidden, generator=gen) * 0.1).to("cuda", dtype)
    return h, weight, bias, height, width


@pytest.mark.parametrize("silu", ["tanh", "exp"])
def test_glu_depthwise_inline_asm_silu(silu):
    """On CUDA the GLU's silu runs on PTX approximations (inline asm: tanh.approx, or ex2.approx.ftz):
    within one bf16 rounding (plus the approximation) of the fp32 reference, in fp32 within 1e-3."""
    from camrender.kernels.ffn_glu import glu_depthwise
    from camrender.kernels.ffn_glu_reference import glu_depthwise_ref

    for dtype, bound in ((torch.float32, 1e-3), (torch.bfloat16, 2.0**-7)):
        h, weight, bias, height, width = _glu_inputs(dtype=dtype)
        got = glu_depthwise(h, weight, bias, height, width, backend="triton", tuning={"silu": silu})
        expected = glu_depthwise_ref(h.float(), weight.float(), bias.float(), height, width)
        assert got.dtype == dtype and torch.isfinite(got).all()
        scale = expected.abs().max().item()
        assert ((got.float() - expected).abs() <= bound * (expected.abs() + 1e-2 * scale)).all(), (dtype, silu)
    tanh = glu_depthwise(h, weight, bias, height, width, backend="triton", tuning={"silu": "tanh"})
    exp = glu_depthwise(h, weight, bias, height, width, backend="triton", tuning={"silu": "exp"})
    assert not torch.equal(tanh, exp)  # two different approximations ran


def test_glu_depthwise_launch_configurations_agree():
    """Every launch configuration of bench_ffn's sweep gives the default launch's output, bit for bit
    (same arithmetic per element, other tiles), for its silu."""
    from camrender.kernels.ffn_glu import glu_depthwise

    h, weight, bias, height, width = _glu_inputs()
    default = {silu: glu_depthwise(h, weight, bias, height, width, backend="triton", tuning={"silu": silu})
               for silu in ("exp", "tanh")}
    for lanes, silu in ((64, "exp"), (128, "exp"), (256, "exp"), (128, "tanh"), (64, "tanh")):
        for block_c, num_warps in ((8, 4), (16, 8), (8, 8), (16, 4)):
            for prefetch in (1, 2):
                tuning = {"lanes": lanes, "block_c": block_c, "num_warps": num_warps, "prefetch": prefetch,
                          "silu": silu}
                got = glu_depthwise(h, weight, bias, height, width, backend="triton", tuning=tuning)
                assert torch.equal(got, default[silu]), tuning


def test_streaming_decode_cudnn_settings_agree():
    """The causal stream decode with cuDNN autotuning gives the default frames, and so does the decoder on
    channels-last activations (the default on CUDA) up to bf16 rounding (bench_decode.py prints both
    differences at the release shape)."""
    from diffusers import AutoencoderKLLTX2Video

    from camrender.model.stage1.segments import segment_bounds
    from camrender.render.decode import CausalStreamDecoder

    torch.manual_seed(0)
    with torch.device("cuda"):
        vae = AutoencoderKLLTX2Video(spatial_compression_ratio=32, temporal_compression_ratio=8)
    vae = vae.to(torch.bfloat16).eval()
    latents = torch.randn(1, vae.config.latent_channels, 1 + 3 * 2, 4, 6, device="cuda", dtype=torch.bfloat16)

    def decode(channels_last):
        decoder, videos = CausalStreamDecoder(vae, channels_last=channels_last), []
        for start, stop in segment_bounds(latents.shape[2], 3):
            videos.append(decoder.decode(latents[:, :, start:stop]))
        return torch.cat(videos, dim=2).float()

    saved = torch.backends.cudnn.benchmark
    try:
        with torch.no_grad():
            torch.backends.cudnn.benchmark = False
            default = decode(False)
            torch.backends.cudnn.benchmark = True
            decode(False)  # autotuning run
            tuned = decode(False)
            torch.backends.cudnn.benchmark = False
            channels_last = decode(True)
            implied = CausalStreamDecoder(vae).memory_format
    finally:
        torch.backends.cudnn.benchmark = saved
    assert default.shape[2] == 1 + 8 * 6 and torch.isfinite(default).all()
    assert torch.equal(tuned, default)
    assert implied == torch.channels_last_3d
    assert (channels_last - default).abs().max().item() <= 0.1 * max(1.0, default.abs().max().item())


def test_streaming_decode_fused_resnets_equal_separate_passes(monkeypatch):
    """The decoder's resnets with each norm written into its conv's padded input and the conv biases taken by
    the next norm and the residual add (`CausalStreamDecoder._resnet_forward`) give the frames of the separate
    passes (norm -> SiLU, a conv with its bias, the residual add) bit for bit: cuDNN leaves a conv's bias to an
    add of its own, whose rounding the fused kernels repeat."""
    from diffusers import AutoencoderKLLTX2Video

    from camrender.kernels.rms_silu import rms_silu
    from camrender.model.stage1.segments import segment_bounds
    from camrender.render.decode import CausalStreamDecoder

    torch.manual_seed(0)
    with torch.device("cuda"):
        vae = AutoencoderKLLTX2Video(spatial_compression_ratio=32, temporal_compression_ratio=8)
    vae = vae.to(torch.bfloat16).eval()
    with torch.no_grad():  # make every conv bias count
        for conv in vae.decoder.modules():
            if isinstance(conv, torch.nn.Conv3d) and conv.bias is not None:
                conv.bias.normal_(0, 0.05)
    latents = torch.randn(1, vae.config.latent_channels, 1 + 3 * 2, 4, 6, device="cuda", dtype=torch.bfloat16)

    def separate(self, resnet, inputs, temb=None, generator=None, causal=True):
        hidden_states = resnet.conv1(rms_silu(inputs, resnet.norm1.eps), causal=causal)
        hidden_states = resnet.conv2(rms_silu(hidden_states, resnet.norm2.eps), causal=causal)
        if resnet.norm3 is not None:
            inputs = resnet.norm3(inputs.movedim(1, -1)).movedim(-1, 1)
        if resnet.conv_shortcut is not None:
            inputs = resnet.conv_shortcut(inputs)
        return hidden_states + inputs

    def decode():
        decoder, videos = CausalStreamDecoder(vae, channels_last=True), []
        assert decoder._fusable
        for start, stop in segment_bounds(latents.shape[2], 3):
            videos.append(decoder.decode(latents[:, :, start:stop]))
        return torch.cat(videos, dim=2)

    with torch.no_grad():
        fused = decode()
        monkeypatch.setattr(CausalStreamDecoder, "_resnet_forward", separate)
        passes = decode()
    assert fused.shape[2] == 1 + 8 * 6 and torch.isfinite(fused).all()
    assert torch.equal(fused, passes)


def test_temporal_conv_as_gemms_on_cublas(monkeypatch):
    """A segment call's temporal conv (3 frames of 880 tokens, a cached left frame, the release's 2240 channels) as
    GEMMs per tap on cuBLAS and as cuDNN's convolution: in float32 (TF32 off) both to float32 rounding of the float64
    result; in bf16 both within 2x (RMS) of one rounding of it (an H100 measured GEMMs 1.62x, the conv below 1.6x)."""
    from camrender.model.stage1 import ffn

    gen = torch.Generator().manual_seed(3)
    channels, spatial = 2240, 880
    conv = torch.nn.Conv2d(channels, channels, (3, 1), padding=(1, 0), bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen) / (3 * channels) ** 0.5)
    mlp = torch.nn.Module()
    mlp.t_conv = conv.cuda()
    ffn.channels_last_kernel(mlp)
    y = torch.randn(1, 3, spatial, channels, generator=gen).cuda()
    left = torch.randn(1, 1, spatial, channels, generator=gen).cuda()
    exact = temporal_conv_exact(mlp.t_conv.weight, y, left)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:  # float32 renders keep cuDNN (`ffn._temporal`); the GEMMs are called directly here
        monkeypatch.setattr(ffn, "TEMPORAL_GEMM_MAX_FRAMES", 0)
        for z in (ffn._temporal(mlp, y, left, [(0, 3)]), ffn._temporal_gemms(mlp.t_conv.weight, y, left, [(0, 3)])):
            assert rel(z.double(), exact) < 1e-5  # float32 sums of 2240 to 6720 terms
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    mlp.bfloat16()
    ffn.channels_last_kernel(mlp)
    y, left = y.bfloat16(), left.bfloat16()
    exact = temporal_conv_exact(mlp.t_conv.weight, y, left)
    floor = (exact.bfloat16().double() - exact).norm() / exact.norm()
    for gemm_frames in (0, 8):
        monkeypatch.setattr(ffn, "TEMPORAL_GEMM_MAX_FRAMES", gemm_frames)
        z = ffn._temporal(mlp, y, left, [(0, 3)])
        assert z.dtype == torch.bfloat16 and (z.double() - exact).norm() / exact.norm() < 2.0 * floor, gemm_frames


def test_gdn_gates_at_the_release_size():
    """`kernels.gdn_gates` compiled, on a segment of the release (3 frames of 880 tokens, 2240 channels, 20 heads)
    against diffusers' ops: float32 (ieee) to float32 rounding; in bf16, beta within one bf16 step (the tile products
    sum in another order than cuBLAS', so a logit may round the other way), the decay to 1e-3 on average (a flip of
    the gate's bf16 rounding moves one value by up to a few percent)."""
    from camrender.kernels.gdn_gates import gdn_gates
    from camrender.kernels.gdn_gates_reference import gdn_gates_ref

    gen = torch.Generator().manual_seed(4)
    heads, channels, frames = 20, 2240, 3
    x = torch.randn(1, frames * 880, channels, generator=gen)
    weights = [torch.randn(heads, channels, generator=gen) * scale * channels ** -0.5 for scale in (1, 4)]
    biases = [torch.randn(heads, generator=gen) for _ in range(2)]
    rate, dt_bias = (-3 * torch.rand(heads, generator=gen)).cuda(), torch.randn(heads, generator=gen).cuda()
    for dtype in (torch.float32, torch.bfloat16):
        args = (x.to("cuda", dtype), frames, weights[0].to("cuda", dtype), biases[0].to("cuda", dtype),
                weights[1].to("cuda", dtype), biases[1].to("cuda", dtype), rate, dt_bias)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            want_beta, want_decay = gdn_gates_ref(*args)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        beta, decay = gdn_gates(*args, backend="triton", matmul_precision="ieee")
        if dtype == torch.float32:
            torch.testing.assert_close(beta, want_beta, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(decay, want_decay, rtol=1e-5, atol=1e-6)
        else:
            assert (beta.float() - want_beta.float()).abs().max() <= 2.0 ** -8
            assert ((decay - want_decay).abs() / want_decay).mean() < 1e-3
            torch.testing.assert_close(decay, want_decay, rtol=5e-2, atol=0)
