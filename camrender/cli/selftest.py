"""`camrender selftest`: every public kernel op against its PyTorch reference on small shapes, op by op.

Runs on the GPU when one is present, else through the Triton interpreter on the CPU
(TRITON_INTERPRET=1 must be set before triton is imported; when it is not and triton is
already loaded, the test re-runs itself in a fresh interpreter process).

Cases come from the kernel table `camrender.kernels.cases.CASES` (the kernel tests parametrize over
the same table), via `default_cases()`. A case here is a `SelftestCase`: `op`, `shape` (a label),
`run(device) -> (actual, expected)` where both are tensors or equal-length tuples of tensors,
`tolerance` (the case passes when max |actual - expected| <= tolerance * max(1, max |expected|)) and
`variant` (what sets it apart from the op's other cases). The table lists the cases op by op; an op passes
when all its cases do.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from typing import Callable

import click


@dataclasses.dataclass
class SelftestCase:
    op: str
    shape: str
    run: Callable
    tolerance: float = 1e-4
    variant: str = ""


@dataclasses.dataclass
class SelftestResult:
    op: str
    variant: str
    shape: str
    max_error: float
    time_ms: float
    passed: bool
    error: str = ""


def default_cases() -> list:
    """Every case of the kernel table (camrender.kernels.cases) at each of its small sizes, op by op."""
    # lazy: keeps `camrender --help` free of torch, triton
    from camrender.kernels.cases import CASES

    def runner(case, sizes):
        return lambda device: case.run(sizes, device)

    return [SelftestCase(case.op, case.label(sizes), runner(case, sizes), case.tolerance, case.variant)
            for case in CASES for sizes in case.sizes]


# ----------------------------------------------------------------------------- running
def compare(actual, expected) -> tuple[float, float]:
    """(max abs error, max |expected|) over all paired tensors (see camrender.kernels.cases.compare)."""
    # lazy: keeps `camrender --help` free of torch, triton
    from camrender.kernels.cases import compare as compare_outputs

    return compare_outputs(actual, expected)


def run_case(case: SelftestCase, device) -> SelftestResult:
    # lazy: keeps `camrender --help` free of torch, triton
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    from camrender.kernels.cases import within

    try:
        if device.type == "cuda":
            case.run(device)  # compile and warm up; the timed run below is the measured one
        sync()
        start = time.perf_counter()
        actual, expected = case.run(device)
        sync()
        elapsed = (time.perf_counter() - start) * 1e3
        error, scale = compare(actual, expected)
        passed = within(error, scale, case.tolerance)
        return SelftestResult(case.op, case.variant, case.shape, error, elapsed, passed)
    except Exception as exc:  # a crashing kernel is a failed case, reported like the others
        return SelftestResult(case.op, case.variant, case.shape, float("nan"), float("nan"), False,
                              f"{type(exc).__name__}: {exc}")


def by_op(results) -> dict:
    """{op: [its results]}, ops in the order of their first case."""
    grouped = {}
    for r in results:
        grouped.setdefault(r.op, []).append(r)
    return grouped


def format_table(results, mode: str) -> str:
    """The results op by op (the op named on its first row), then the cases' errors and the counts."""
    rows = [("op", "case", "shape", "max error", "time", "pass")]
    groups = by_op(results)
    for op, group in groups.items():
        for index, r in enumerate(group):
            time_text = "-" if math.isnan(r.time_ms) else f"{r.time_ms:.1f} ms"
            rows.append((op if index == 0 else "", r.variant, r.shape, f"{r.max_error:.2e}", time_text,
                         "ok" if r.passed else "FAIL"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"camrender selftest ({mode})"]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    lines += [f"{r.op}{'+' + r.variant if r.variant else ''} [{r.shape}]: {r.error}" for r in results if r.error]
    passed = sum(r.passed for r in results)
    ops_passed = sum(all(r.passed for r in group) for group in groups.values())
    lines.append(f"{ops_passed}/{len(groups)} ops passed ({passed}/{len(results)} cases)")
    return "\n".join(lines)


def _needs_fresh_interpreter() -> bool:
    # lazy: keeps `camrender --help` free of torch
    import torch

    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if "triton" in sys.modules:
        return True
    os.environ["TRITON_INTERPRET"] = "1"  # triton not imported yet: the setting still takes effect
    return False


def main(as_json: bool = False, cases=None) -> int:
    """Run the cases, print the table (or JSON); return 0 when all pass, 1 otherwise."""
    if cases is None and _needs_fresh_interpreter():
        env = dict(os.environ, TRITON_INTERPRET="1")
        argv = [sys.executable, "-m", "camrender.cli.selftest"] + (["--json"] if as_json else [])
        return subprocess.run(argv, env=env).returncode
    # lazy: keeps `camrender --help` free of torch
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mode = f"GPU: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "CPU, Triton interpreter"
    results = [run_case(case, device) for case in (default_cases() if cases is None else cases)]
    ok = bool(results) and all(r.passed for r in results)
    if as_json:
        payload = {"device": mode, "passed": ok,
                   "ops": {op: all(r.passed for r in group) for op, group in by_op(results).items()},
                   "cases": [dataclasses.asdict(r) for r in results]}
        print(json.dumps(payload, indent=2, allow_nan=True))
    else:
        print(format_table(results, mode))
    return 0 if ok else 1



@click.command("selftest")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def command(as_json):
    """Check every kernel op against its PyTorch reference on small shapes.

    Runs on the GPU when there is one, else through the Triton interpreter on the CPU.
    Exit code 1 when any kernel disagrees with its reference.
    """
    sys.exit(main(as_json=as_json))


if __name__ == "__main__":
    sys.exit(main(as_json="--json" in sys.argv[1:]))
