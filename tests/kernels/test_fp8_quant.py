"""kernels/fp8_quant.py: the Triton per-row e4m3 quantization gives its PyTorch reference's bits; with the GELU
inside, the reference's up to the GELU's fp32 rounding."""
import pytest
import torch

from camrender.kernels.fp8_quant import gelu_quantize_rows, quantize_rows
from camrender.kernels.fp8_quant_reference import gelu_quantize_rows_ref, quantize_rows_ref


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
@pytest.mark.parametrize("shape", [(5, 48), (3, 2100), (1, 16)])
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


def test_every_e4m3_rounding_case_against_torch():
    """Scale 1 (the row's max is 448): the kernel's rounding alone, on a dense sweep with every tie between
    two e4m3 neighbours (subnormal and normal) included."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[values.isfinite()].unique()
    ties = (values[1:] + values[:-1]) / 2
    sweep = torch.linspace(-448, 448, 20001)
    x = torch.cat([torch.tensor([448.0]), values, ties, ties.nextafter(torch.tensor(1e9)), sweep])[None]
    q, scale = quantize_rows(x, backend="triton")
    assert scale.item() == 1.0
    assert torch.equal(q.view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))


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
    # the reference on the CPU: on CUDA, PyTorch divides by a scalar through its reciprocal (not rounded
    # once), so the scales could differ there in the last bit
    q_ref, scale_ref = quantize_rows_ref(x.cpu())
    assert torch.equal(scale.cpu(), scale_ref) and torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))
    q, scale = gelu_quantize_rows(x, backend="triton")
    assert_gelu_quantization_close(q, scale, x)
    linear = torch.nn.Linear(2240, 1024, device="cuda", dtype=torch.bfloat16)
    reference = linear(x).float()
    out = Fp8Linear.from_linear(linear)(x).float()
    assert out.dtype == torch.float32 and out.shape == reference.shape
    assert ((out - reference).norm() / reference.norm()).item() < 0.05
