"""kernels/_grid.py: the host's launch arithmetic gives Triton's own values."""
import triton

from camrender.kernels._grid import cdiv, next_power_of_2


def test_plain_grid_arithmetic_equals_tritons():
    for n in list(range(0, 5000)) + [2 ** 20 - 1, 2 ** 20, 2 ** 20 + 1, 2640 * 2240]:
        assert next_power_of_2(n) == triton.next_power_of_2(n)
        for d in (1, 3, 16, 64, 640):
            assert cdiv(n, d) == triton.cdiv(n, d)


def test_channel_rows_hold_whole_rows_of_about_4096_values():
    from camrender.kernels._grid import channel_rows

    assert channel_rows(128) == (32, 128)
    assert channel_rows(48) == (64, 64)  # at most 64 rows
    assert channel_rows(2240) == (1, 4096)  # a row wider than 4096 values' worth still gets its program
    assert channel_rows(8192) == (1, 8192)


def test_filling_tile_halves_the_tile_for_a_segments_few_tokens():
    from camrender.kernels._grid import filling_tile

    assert filling_tile(2 * 21 * 880, 1, 16, 132) == 16  # a whole clip fills an H200 at 16 tokens a program
    assert filling_tile(2640, 1, 16, 132) == 8  # a segment: 165 programs -> 330
    assert filling_tile(2640, 2, 16, 132) == 16  # two guidance rows: 330 programs already
    assert filling_tile(100, 1, 16, 132, smallest=4) == 4
    assert filling_tile(2640, 1, 16, 132, smallest=16) == 16  # never below `smallest`
    assert filling_tile(2640, 1, 16, 0) == 16  # off a GPU
