"""The kernels' call convention (kernels/__init__.py): every module that launches a Triton kernel
has a `<name>_reference.py` beside it; every `<op>_ref` there answers an op `<op>` of `<name>.py` with
the op's arguments less its launch knobs; a reference module imports neither Triton nor its op's module;
every public op (an op module's `__all__`) has its reference, takes `backend`, and, when it carries a state,
`initial_state` and `output_final_state` as its reference does. Read from the source (AST) and the live
signatures."""
import ast
import importlib
import inspect
from pathlib import Path

import pytest

from camrender.kernels._validate import MATMUL_PRECISIONS
from camrender.kernels.cases import public_ops, stateful

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
# the fast path's knobs a reference does without (launch and layout choices, output buffers)
KNOBS = {"backend", "matmul_precision", "out", "tuning", "num_warps", "f16_operands", "k_out", "kv_out", "return_k_pre",
         "keep_unrotated", "head_dim", "out_dtype", "col_split"}


def launches_a_kernel(path: Path) -> bool:
    """Whether the module calls `some_kernel[grid](...)` (a Triton launch) or wraps another op module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("_kernel"):
            return True
    return False


OP_MODULES = sorted(path.stem for path in KERNELS.glob("[!_]*.py")
                    if not path.stem.endswith("_reference") and launches_a_kernel(path))
REFERENCE_MODULES = sorted(path.stem for path in KERNELS.glob("*_reference.py"))


def test_every_op_module_has_its_reference_module_beside_it():
    assert OP_MODULES, "no Triton launches found: the AST rule is broken"
    missing = [name for name in OP_MODULES if not (KERNELS / f"{name}_reference.py").is_file()]
    assert not missing, f"op modules without a reference module: {missing}"
    orphans = [name for name in REFERENCE_MODULES if not (KERNELS / f"{name[:-len('_reference')]}.py").is_file()]
    assert not orphans, f"reference modules without an op module: {orphans}"


@pytest.mark.parametrize("name", REFERENCE_MODULES)
def test_references_take_their_ops_arguments(name):
    op_module = importlib.import_module(f"camrender.kernels.{name[:-len('_reference')]}")
    references = importlib.import_module(f"camrender.kernels.{name}")
    refs = [ref for ref in vars(references) if ref.endswith("_ref") and not ref.startswith("_")
            and inspect.isfunction(getattr(references, ref))
            and getattr(references, ref).__module__ == references.__name__]
    assert refs, f"{name} defines no <op>_ref"
    for ref in refs:
        op = getattr(op_module, ref[:-len("_ref")], None)
        assert callable(op), f"{name}.{ref} has no op {ref[:-4]} in {op_module.__name__}"
        op_params = list(inspect.signature(op).parameters)
        ref_params = list(inspect.signature(getattr(references, ref)).parameters)
        assert set(ref_params) - set(op_params) - KNOBS == set(), f"{ref} takes arguments {op.__name__} lacks"
        assert set(op_params) - set(ref_params) <= KNOBS, f"{ref} lacks {set(op_params) - set(ref_params) - KNOBS}"
        positional = [p for p in op_params if p in ref_params]
        assert [p for p in ref_params if p in op_params] == positional, f"{ref}: arguments out of the op's order"


@pytest.mark.parametrize("name", REFERENCE_MODULES + ["_reference_parts"])
def test_reference_modules_are_plain_pytorch(name):
    imported = set()
    for node in ast.walk(ast.parse((KERNELS / f"{name}.py").read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(("." * node.level) + (node.module or ""))
    assert not {module for module in imported if module.split(".")[0] == "triton"}, f"{name} imports Triton"
    op = "." + name[:-len("_reference")]
    assert op not in imported, f"{name} imports its op's module"


OPS = public_ops()


def test_every_public_op_has_its_reference():
    assert len(OPS) >= 20, "the public ops are the op modules' __all__: some are missing"
    for name, op in OPS.items():
        references = importlib.import_module(f"{op.__module__}_reference")
        assert callable(getattr(references, f"{name}_ref", None)), f"{name} has no {name}_ref in {references.__name__}"


@pytest.mark.parametrize("name", sorted(OPS))
def test_ops_take_the_backend_and_one_state_signature(name):
    """Every op takes backend="auto"; a stateful one (initial_state) takes output_final_state=False, as its
    reference does; the kernels' matrix-product precision is named matmul_precision, never precision."""
    parameters = inspect.signature(OPS[name]).parameters
    assert parameters["backend"].default == "auto" and parameters["backend"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "precision" not in parameters
    if "matmul_precision" in parameters:
        assert parameters["matmul_precision"].default in MATMUL_PRECISIONS
    reference = inspect.signature(getattr(importlib.import_module(f"{OPS[name].__module__}_reference"),
                                          f"{name}_ref")).parameters
    for signature in (parameters, reference):
        assert ("initial_state" in signature) == stateful(OPS[name])
        if stateful(OPS[name]):
            assert signature["initial_state"].default is None and signature["output_final_state"].default is False
