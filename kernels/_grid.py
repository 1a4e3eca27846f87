"""Launch arithmetic on the host as plain integer functions: `cdiv` and `next_power_of_2`, the values of
`triton.cdiv` and `triton.next_power_of_2` (newer Triton makes those constexpr functions, which cost a few
microseconds per call from Python; a forward computes a few hundred grids), `channel_rows`, the tiles of the
kernels that read whole channel rows of channels-last activations, and `filling_tile`, a token tile small
enough for a segment's few thousand tokens to fill the GPU."""


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


def filling_tile(tokens: int, batch: int, tile: int, processors: int, smallest: int = 4) -> int:
    """`tile` (a power of two: tokens per program) halved, down to `smallest`, while the grid holds fewer than two
    programs per streaming multiprocessor (`processors`; 0 off a GPU: `tile` as given), so that launches tuned on a
    whole clip's tens of thousands of tokens still fill the GPU on a segment's 2640: 165 programs of 16 tokens for
    132 multiprocessors (most of them holding one program of four warps) become 330 of 8. Whether that pays is the
    kernel's own matter: it did for the camera encodes, not for the softmax camera decode (an H200's kernel profile:
    bench/results/2026-12-05_segment_targets_75df780_h200.json)."""
    while tile > smallest and cdiv(tokens, tile) * batch < 2 * processors:
        tile //= 2
    return tile
