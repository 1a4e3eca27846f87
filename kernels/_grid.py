"""Launch arithmetic on the host as plain integer functions: `cdiv` and `next_power_of_2`, the values of
`triton.cdiv` and `triton.next_power_of_2` (newer Triton makes those constexpr functions, which cost a few
microseconds per call from Python; a forward computes a few hundred grids), and `channel_rows`, the tiles of the
kernels that read whole channel rows of channels-last activations."""


def cdiv(numerator: int, denominator: int) -> int:
    """ceil(numerator / denominator) for positive integers."""
    return -(-numerator // denominator)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for 0, as Triton's)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def channel_rows(channels: int) -> tuple:
    """(rows per program, BLOCK_C) for a kernel that holds whole channel rows of a channels-last activation in
    registers: about 4096 values a program, at most 64 rows."""
    block_c = next_power_of_2(channels)
    return max(1, min(64, 4096 // block_c)), block_c
