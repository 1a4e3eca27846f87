"""kernels/fp8_quant.py: the Triton per-row e4m3 quantization gives its PyTorch reference's bits."""
import pytest
import torch

from camrender.kernels.fp8_quant import quantize_rows
from camrender.kernels.fp8_quant_reference import quantize_rows_ref


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
    """Compiled for the GPU: the kernel's bits equal the reference's, and `Fp8Linear` (the kernel, then
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
    linear = torch.nn.Linear(2240, 1024, device="cuda", dtype=torch.bfloat16)
    reference = linear(x).float()
    out = Fp8Linear.from_linear(linear)(x).float()
    assert out.dtype == torch.float32 and out.shape == reference.shape
    assert ((out - reference).norm() / reference.norm()).item() < 0.05
