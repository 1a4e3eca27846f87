"""kernels/fp8_quant.py: the Triton per-row e4m3 quantization gives its PyTorch reference's bits; with the GELU
inside, the reference's up to the GELU's fp32 rounding. The kernels that quantize the rows they write (the
adaLN glue's `quantize=True`, the gated residual's, the output gate's, the attention output's head merge) give the
bits of quantizing their output."""
import pytest
import torch

from camrender.kernels.block_glue import ada_norm, gated_residual, residual_ada_norm, silu_gate
from camrender.kernels.fp8_quant import gelu_quantize_rows, merge_heads_quantize_rows, quantize_rows
from camrender.kernels.fp8_quant_reference import (gelu_quantize_rows_ref, merge_heads_quantize_rows_ref,
                                                   quantize_rows_ref)


def assert_same_quantization(got, expected):
    (q, scale), (q_ref, scale_ref) = got, expected
    assert q.dtype == torch.float8_e4m3fn and q.shape == q_ref.shape and scale.shape == scale_ref.shape
    assert torch.equal(scale.cpu(), scale_ref.cpu())
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.cpu().view(torch.uint8))


def assert_gelu_quantization_close(q, scale, x):
    """(q, scale) of gelu_quantize_rows(x) against the reference's on x on the CPU: a row's scale within one
    ulp (the GELU of its max element may round the other way), the e4m3 values the same but for rare ones one
    e4m3 step apart."""
    q_ref, scale_ref = gelu_quantize_rows_ref(x.cpu())
    q, scale = q.cpu(), scale.cpu()
    assert torch.allclose(scale, scale_ref, rtol=2 ** -7, atol=0)
    same_scale = (scale == scale_ref).squeeze(1)
    differ = q[same_scale].float() != q_ref[same_scale].float()
    assert differ.float().mean() < 1e-3
    step = q_ref[same_scale].float().abs() * 2 ** -3 + 2 ** -9
    assert ((q[same_scale].float() - q_ref[same_scale].float()).abs() <= step).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 48), (3, 2100), (1, 16), (2, 16500)])  # the last read in two passes
def test_triton_equals_reference_bit_for_bit(dtype, shape):
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=generator) * torch.logspace(-3, 3, shape[0])[:, None]).to(dtype)
    x[0, :3] = 0.0
    if shape[0] > 2:
        x[2] = 0.0  # an all-zero row: scale at the floor, zeros out
    q, scale = quantize_rows(x, backend="triton")
    q_ref, scale_ref = quantize_rows_ref(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (shape[0], 1)
    assert torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gelu_inside_the_quantization(dtype):
    x = (torch.randn(9, 2100, generator=torch.Generator().manual_seed(5)) * 3).to(dtype)
    x[1] = 0.0  # gelu(0) = 0: scale at the floor
    q, scale = gelu_quantize_rows(x, backend="triton")
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (9, 1)
    assert_gelu_quantization_close(q, scale, x)
    q_plain, _ = quantize_rows(x, backend="triton")  # and the GELU did something
    assert not torch.equal(q.view(torch.uint8), q_plain.view(torch.uint8))


def test_rows_of_a_strided_view():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))[:, :32]  # row stride 64
    q, scale = quantize_rows(x, backend="triton")
    q_ref, scale_ref = quantize_rows_ref(x)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(scale, scale_ref)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_every_e4m3_rounding_case_against_torch(device):
    """Scale 1 (the row's max is 448): the kernel's rounding alone, on a dense sweep with every tie between
    two e4m3 neighbours (subnormal and normal) included. On the CPU the interpreter's rounding on the bits, on
    CUDA the compiled kernel's cast."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[values.isfinite()].unique()
    ties = (values[1:] + values[:-1]) / 2
    sweep = torch.linspace(-448, 448, 20001)
    x = torch.cat([torch.tensor([448.0]), values, ties, ties.nextafter(torch.tensor(1e9)), sweep])[None]
    q, scale = quantize_rows(x.to(device), backend="triton")
    assert scale.item() == 1.0
    assert torch.equal(q.cpu().view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))


def glue_inputs(dtype, device="cpu", channels=48):
    generator = torch.Generator(device=device).manual_seed(6)
    draw = lambda *shape: torch.randn(*shape, generator=generator, device=device).to(dtype)  # noqa: E731
    x, residual = draw(2, 12, channels) * 3, draw(2, 12, channels)
    x[1, 5] = 0.0  # with the residual added, a row that is not zero; without, a zero row's floor scale
    return x, residual, draw(2, 3, channels), draw(2, 3, channels)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_ada_norm_quantized_in_the_pass_equals_quantizing_its_output(dtype, norm):
    """ada_norm(..., quantize=True): the e4m3 rows and scales of its own x.dtype output, bit for bit, with and
    without modulation and residual, in the kernel and in the PyTorch path."""
    x, residual, shift, scale = glue_inputs(dtype)
    for backend in ("triton", "torch"):
        for mods in ((shift, scale), (None, None)):
            plain = ada_norm(x, *mods, norm=norm, backend=backend)
            got = ada_norm(x, *mods, norm=norm, backend=backend, quantize=True)
            assert_same_quantization(got, quantize_rows_ref(plain.reshape(-1, 48)))
        updated, plain = residual_ada_norm(x, residual, shift, scale, norm=norm, backend=backend)
        updated_q, got = residual_ada_norm(x, residual, shift, scale, norm=norm, backend=backend, quantize=True)
        assert torch.equal(updated_q, updated)
        assert_same_quantization(got, quantize_rows_ref(plain.reshape(-1, 48)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ada_norm_keeps_its_rows_beside_the_quantized_ones(dtype):
    """ada_norm(..., quantize=True, keep=True): a block attention's input, for its FP8 and its bf16 linears: the
    x.dtype rows of the plain call and their quantization, in one pass."""
    x, residual, shift, scale = glue_inputs(dtype, channels=40)  # 40: padded lanes in the kernel's rows
    for backend in ("triton", "torch"):
        plain = ada_norm(x, shift, scale, backend=backend)
        kept, rows = ada_norm(x, shift, scale, backend=backend, quantize=True, keep=True)
        assert torch.equal(kept, plain)
        assert_same_quantization(rows, quantize_rows_ref(plain.reshape(-1, 40)))
        updated, (kept, rows) = residual_ada_norm(x, residual, shift, scale, backend=backend, quantize=True,
                                                  keep=True)
        assert torch.equal(updated, x + residual)
        assert torch.equal(kept, ada_norm(updated, shift, scale, backend=backend))
        assert_same_quantization(rows, quantize_rows_ref(kept.reshape(-1, 40)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gated_residual_and_output_gate_quantize_what_they_write(dtype):
    """gated_residual(..., quantize=True) writes the residual stream and its rows quantized for the next FP8
    linear (the cross-attention's query); silu_gate(..., quantize=True) writes only the rows (the attention's
    output projection reads nothing else): both the bits of quantizing the plain result."""
    x, y, gate, _ = glue_inputs(dtype, channels=40)
    generator = torch.Generator().manual_seed(8)
    y2, extra = (torch.randn(2, 12, 40, generator=generator).to(dtype) for _ in range(2))
    for backend in ("triton", "torch"):
        plain = gated_residual(x, y, gate, y2=y2, extra=extra, backend=backend)
        out, rows = gated_residual(x, y, gate, y2=y2, extra=extra, backend=backend, quantize=True)
        assert torch.equal(out, plain)
        assert_same_quantization(rows, quantize_rows_ref(plain.reshape(-1, 40)))
        logits = y2 * 2
        plain = silu_gate(x, logits, b=y, backend=backend)
        assert_same_quantization(silu_gate(x, logits, b=y, backend=backend, quantize=True),
                                 quantize_rows_ref(plain.reshape(-1, 40)))
        assert_same_quantization(silu_gate(x, logits, backend=backend, quantize=True),
                                 quantize_rows_ref(silu_gate(x, logits, backend=backend).reshape(-1, 40)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_merge_heads_quantize_reads_the_transposed_attention_output(dtype):
    """An SDPA-layout output (B, H, N, D) seen as (B, N, H, D): merged and quantized in one pass, the bits of
    quantizing the merged rows; with LTX-2's output gate the reference's bits in bf16 (sigmoid rounded to bf16),
    within the gate's fp32 rounding in fp32."""
    generator = torch.Generator().manual_seed(7)
    o = torch.randn(2, 3, 7, 40, generator=generator).to(dtype).transpose(1, 2)  # D = 40: padded lanes
    logits = (torch.randn(2, 7, 3, generator=generator) * 3).to(dtype)
    assert not o.is_contiguous()
    got = merge_heads_quantize_rows(o, backend="triton")
    assert_same_quantization(got, quantize_rows_ref(o.reshape(14, 120)))
    gated = merge_heads_quantize_rows(o, logits, backend="triton")
    expected = merge_heads_quantize_rows_ref(o, logits)
    if dtype == torch.bfloat16:
        assert_same_quantization(gated, expected)
    else:
        assert torch.allclose(gated[1], expected[1], rtol=1e-6, atol=0)
        assert (gated[0].float() != expected[0].float()).float().mean() < 1e-2
    assert not torch.equal(gated[1], got[1])  # the gate did something
    with pytest.raises(ValueError, match="gate_logits"):
        merge_heads_quantize_rows(o, logits[:, :, :2], backend="triton")


@pytest.mark.gpu
def test_compiled_kernel_and_fp8_linear_on_cuda():
    """Compiled for the GPU: the kernel's bits equal the reference's (with the GELU inside: close to it), and `Fp8Linear` (the kernel, then
    `torch._scaled_mm` row-wise with bias) stays near the bf16 product. Needs FP8 tensor cores (sm >= 8.9)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a CUDA GPU with FP8 tensor cores")
    from camrender.model.fp8 import Fp8Linear

    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(300, 2240, device="cuda", generator=generator).to(torch.bfloat16)
    q, scale = quantize_rows(x, backend="triton")
    # the reference on the CPU (what the CPU tests hold it to)
    q_ref, scale_ref = quantize_rows_ref(x.cpu())
    assert torch.equal(scale.cpu(), scale_ref) and torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))
    x[1, :7] = torch.tensor([-1e4, -100.0, -20.0, -10.0, 10.0, 100.0, 1e4])  # exp(-2u) overflowing, and 0
    x[2, :] = -30.0  # a row whose GELU rounds to zero: the floor scale
    q, scale = gelu_quantize_rows(x, backend="triton")
    assert_gelu_quantization_close(q, scale, x)
    linear = torch.nn.Linear(2240, 1024, device="cuda", dtype=torch.bfloat16)
    reference = linear(x).float()
    out = Fp8Linear.from_linear(linear)(x).float()
    assert out.dtype == torch.float32 and out.shape == reference.shape
    assert ((out - reference).norm() / reference.norm()).item() < 0.05


@pytest.mark.gpu
def test_compiled_kernels_that_quantize_what_they_write():
    """Compiled: the adaLN glue's quantize=True (with keep), the gated residual's and the output gate's, and the
    head merge's quantization give the bits of quantizing their bf16 output (the reference's quantization on the
    CPU, as above)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x, residual, shift, scale = glue_inputs(torch.bfloat16, "cuda", channels=4096)
    plain = ada_norm(x, shift, scale, norm="rms")
    assert_same_quantization(ada_norm(x, shift, scale, norm="rms", quantize=True),
                             quantize_rows_ref(plain.reshape(-1, 4096).cpu()))
    _, plain = residual_ada_norm(x, residual, shift, scale, norm="rms")
    _, got = residual_ada_norm(x, residual, shift, scale, norm="rms", quantize=True)
    assert_same_quantization(got, quantize_rows_ref(plain.reshape(-1, 4096).cpu()))
    o = torch.randn(1, 32, 300, 128, device="cuda").to(torch.bfloat16).transpose(1, 2)
    assert_same_quantization(merge_heads_quantize_rows(o), quantize_rows_ref(o.reshape(300, 4096).cpu()))
    # stage 1's (C = 2240, LayerNorm): the attention input kept beside its rows, the gated residual, the output gate
    x, residual, shift, scale = glue_inputs(torch.bfloat16, "cuda", channels=2240)
    kept, rows = ada_norm(x, shift, scale, quantize=True, keep=True)
    assert torch.equal(kept, ada_norm(x, shift, scale))
    assert_same_quantization(rows, quantize_rows_ref(kept.reshape(-1, 2240).cpu()))
    out, rows = gated_residual(x, residual, shift, y2=scale.repeat_interleave(4, dim=1), quantize=True)
    assert torch.equal(out, gated_residual(x, residual, shift, y2=scale.repeat_interleave(4, dim=1)))
    assert_same_quantization(rows, quantize_rows_ref(out.reshape(-1, 2240).cpu()))
    plain = silu_gate(x, residual * 3, b=x)
    assert_same_quantization(silu_gate(x, residual * 3, b=x, quantize=True),
                             quantize_rows_ref(plain.reshape(-1, 2240).cpu()))
