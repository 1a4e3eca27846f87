"""Every case of the kernel table (camrender.kernels.cases, shared with `camrender selftest`).

CPU: each op's Triton kernels through the interpreter against its PyTorch reference, at every small size of its
case, matmul precision "ieee"; and each op on backend "torch" gives its reference's output, bit for bit. GPU (`gpu`
marker, `python3 -m pytest -m gpu`): the same cases compiled for CUDA, at "ieee" and, for ops that have one, at the
"tf32" matmul precision the renders use.
"""
import pytest
import torch

from camrender.kernels.cases import CASES, as_tuple, by_op, compare, public_ops, stateful, within

PARAMS = [pytest.param(case, sizes, id=f"{case.name}-{case.label(sizes).replace(' ', '')}")
          for case in CASES for sizes in case.sizes]
TF32_PARAMS = [param for param in PARAMS if param.values[0].tf32_tolerance is not None]


def check(case, sizes, device, matmul_precision):
    actual, expected = case.run(sizes, device, matmul_precision=matmul_precision)
    error, scale = compare(actual, expected)
    for a, e in zip(as_tuple(actual), as_tuple(expected)):
        assert a.device.type == torch.device(device).type and a.dtype == e.dtype
    assert within(error, scale, case.bound(matmul_precision)), (case.name, error, scale)
    return error


def bits(t):
    """t, or its bytes for a float8 tensor (torch.equal does not take float8)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


@pytest.mark.parametrize("case, sizes", PARAMS)
def test_kernel_matches_reference_in_the_interpreter(case, sizes):
    check(case, sizes, "cpu", "ieee")


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_torch_backend_runs_the_reference(case):
    """backend "torch": the op returns its reference's outputs (the same structure, dtypes and bits)."""
    actual, expected = case.run(case.sizes[0], "cpu", backend="torch")
    assert len(as_tuple(actual)) == len(as_tuple(expected))
    for a, e in zip(as_tuple(actual), as_tuple(expected)):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert torch.equal(bits(a), bits(e)), case.name


def test_table_covers_every_public_op():
    """Each public op (an op module's `__all__`) has a case; each stateful one a case carrying its state, whose
    outputs end with the final state (a tensor, or a tuple of them: not None)."""
    ops, cases = public_ops(), by_op()
    assert set(cases) == set(ops)
    assert {"delta_scan", "camera_branch", "main_branch", "short_conv"} <= {op for op in ops if stateful(ops[op])}
    for op, function in ops.items():
        if stateful(function):
            carried = [case for case in cases[op] if case.state]
            assert carried, f"no case of {op} carries a state"
            actual, _ = carried[0].run(carried[0].sizes[0], "cpu", backend="torch")
            assert isinstance(actual, tuple) and actual[-1] is not None, op
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))
    assert list(cases) == list(dict.fromkeys(case.op for case in CASES))  # grouped: an op's cases side by side
    assert names.index("camera_branch+no_downscale") == names.index("camera_branch") + 1
    assert any(sizes.dim == 112 for case in CASES for sizes in case.sizes)  # the release head dim


def test_a_wrong_kernel_fails_its_case():
    """The table's pass rule catches an error just above the tolerance."""
    case = next(case for case in CASES if case.name == "silu_gate")
    actual, expected = case.run(case.sizes[0], "cpu")
    error, scale = compare(actual + 2 * case.tolerance * max(1.0, float(expected.abs().max())), expected)
    assert not within(error, scale, case.tolerance)
    with pytest.raises(ValueError, match="outputs"):
        compare((actual, actual), expected)


def test_nested_outputs_are_compared_tensor_by_tensor():
    """A final state of several tensors (the main branch's (kv, z)) is compared like the outputs around it."""
    out, kv, z = torch.zeros(3), torch.ones(2), torch.full((1,), 5.0)
    assert compare((out, (kv, z)), (out, (kv, z + 0.5))) == (0.5, 5.5)
    with pytest.raises(ValueError, match="outputs"):
        compare((out, (kv, z)), (out, kv))


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
    fast, _ = case.run(sizes, "cuda", matmul_precision="tf32")
    exact, _ = case.run(sizes, "cuda", matmul_precision="ieee")
    error, _ = compare(fast, exact)
    assert error > 0.0, case.name
