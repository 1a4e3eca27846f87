"""Every case of the kernel table (camrender.kernels.cases, shared with `camrender selftest`).

CPU: each fused kernel through the Triton interpreter against its PyTorch reference, at every small
size of its case, precision "ieee". GPU (`gpu` marker, `python3 -m pytest -m gpu`): the same cases
compiled for CUDA, at "ieee" and, for kernels that have one, at the "tf32" precision the renders use.
"""
import pytest
import torch

from camrender.kernels.cases import CASES, compare, within

PARAMS = [pytest.param(case, sizes, id=f"{case.name}-{case.label(sizes).replace(' ', '')}")
          for case in CASES for sizes in case.sizes]
TF32_PARAMS = [param for param in PARAMS if param.values[0].tf32_tolerance is not None]


def check(case, sizes, device, precision):
    actual, expected = case.run(sizes, device, precision=precision)
    error, scale = compare(actual, expected)
    for a, e in zip(*(out if isinstance(out, tuple) else (out,) for out in (actual, expected))):
        assert a.device.type == torch.device(device).type and a.dtype == e.dtype
    assert within(error, scale, case.bound(precision)), (case.name, error, scale)
    return error


@pytest.mark.parametrize("case, sizes", PARAMS)
def test_kernel_matches_reference_in_the_interpreter(case, sizes):
    check(case, sizes, "cpu", "ieee")


def test_table_covers_every_kernel_once_per_name():
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))
    assert {"delta_scan", "camera_branch", "main_branch", "short_conv", "glu_depthwise", "cam_softmax_encode",
            "residual_ada_norm"} <= set(names)
    assert any(sizes.dim == 112 for case in CASES for sizes in case.sizes)  # the release head dim


def test_a_wrong_kernel_fails_its_case():
    """The table's pass rule catches an error just above the tolerance."""
    case = next(case for case in CASES if case.name == "silu_gate")
    actual, expected = case.run(case.sizes[0], "cpu")
    error, scale = compare(actual + 2 * case.tolerance * max(1.0, float(expected.abs().max())), expected)
    assert not within(error, scale, case.tolerance)
    with pytest.raises(ValueError, match="outputs"):
        compare((actual, actual), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("case, sizes", PARAMS)
def test_compiled_kernel_matches_reference(case, sizes):
    check(case, sizes, "cuda", "ieee")


@pytest.mark.gpu
@pytest.mark.parametrize("case, sizes", TF32_PARAMS)
def test_compiled_kernel_tf32_matches_reference(case, sizes):
    """The tf32 path (tf32 dots, fp16 scan operands) stays within its tolerance, and differs from the
    ieee path's output (the fast path really ran)."""
    check(case, sizes, "cuda", "tf32")
    fast, _ = case.run(sizes, "cuda", precision="tf32")
    exact, _ = case.run(sizes, "cuda", precision="ieee")
    error, _ = compare(fast, exact)
    assert error > 0.0, case.name
