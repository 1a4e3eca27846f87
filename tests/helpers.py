"""Helpers shared by the test files (importable as `helpers`: pytest puts tests/ on sys.path)."""


def rel(a, b) -> float:
    """Relative error ||a - b|| / ||b|| in float64 (Frobenius norms over all elements)."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()
