"""A tiny built-in 5x7 bitmap font to stamp text on uint8 frames (no font files needed)."""
from __future__ import annotations

import numpy as np

# Each glyph: 7 rows of 5 columns, "#" = ink. Lower-case letters only where the overlay needs them;
# unknown characters render as a hollow box.
_GLYPHS_TEXT = {
    "0": [" ### ", "#   #", "#  ##", "# # #", "##  #", "#   #", " ### "],
    "1": ["  #  ", " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "],
    "2": [" ### ", "#   #", "    #", "   # ", "  #  ", " #   ", "#####"],
    "3": ["#####", "   # ", "  #  ", "   # ", "    #", "#   #", " ### "],
    "4": ["   # ", "  ## ", " # # ", "#  # ", "#####", "   # ", "   # "],
    "5": ["#####", "#    ", "#### ", "    #", "    #", "#   #", " ### "],
    "6": ["  ## ", " #   ", "#    ", "#### ", "#   #", "#   #", " ### "],
    "7": ["#####", "    #", "   # ", "  #  ", " #   ", " #   ", " #   "],
    "8": [" ### ", "#   #", "#   #", " ### ", "#   #", "#   #", " ### "],
    "9": [" ### ", "#   #", "#   #", " ####", "    #", "   # ", " ##  "],
    ".": ["     ", "     ", "     ", "     ", "     ", " ##  ", " ##  "],
    "-": ["     ", "     ", "     ", "#####", "     ", "     ", "     "],
    "+": ["     ", "  #  ", "  #  ", "#####", "  #  ", "  #  ", "     "],
    ":": ["     ", " ##  ", " ##  ", "     ", " ##  ", " ##  ", "     "],
    "/": ["     ", "    #", "   # ", "  #  ", " #   ", "#    ", "     "],
    " ": ["     "] * 7,
    "a": ["     ", "     ", " ### ", "    #", " ####", "#   #", " ####"],
    "c": ["     ", "     ", " ### ", "#    ", "#    ", "#   #", " ### "],
    "d": ["    #", "    #", " ## #", "#  ##", "#   #", "#   #", " ####"],
    "e": ["     ", "     ", " ### ", "#   #", "#####", "#    ", " ### "],
    "f": ["  ## ", " #  #", " #   ", "###  ", " #   ", " #   ", " #   "],
    "h": ["#    ", "#    ", "# ## ", "##  #", "#   #", "#   #", "#   #"],
    "i": ["  #  ", "     ", " ##  ", "  #  ", "  #  ", "  #  ", " ### "],
    "l": [" ##  ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "],
    "m": ["     ", "     ", "## # ", "# # #", "# # #", "#   #", "#   #"],
    "o": ["     ", "     ", " ### ", "#   #", "#   #", "#   #", " ### "],
    "p": ["     ", "     ", "#### ", "#   #", "#### ", "#    ", "#    "],
    "r": ["     ", "     ", "# ## ", "##  #", "#    ", "#    ", "#    "],
    "t": [" #   ", " #   ", "###  ", " #   ", " #   ", " #  #", "  ## "],
    "v": ["     ", "     ", "#   #", "#   #", "#   #", " # # ", "  #  "],
    "w": ["     ", "     ", "#   #", "#   #", "# # #", "# # #", " # # "],
    "x": ["     ", "     ", "#   #", " # # ", "  #  ", " # # ", "#   #"],
    "y": ["     ", "     ", "#   #", "#   #", " ####", "    #", " ### "],
    "z": ["     ", "     ", "#####", "   # ", "  #  ", " #   ", "#####"],
}
_UNKNOWN = ["#####", "#   #", "#   #", "#   #", "#   #", "#   #", "#####"]
GLYPH_W, GLYPH_H = 5, 7


def _bitmap(rows):
    return np.array([[ch == "#" for ch in row] for row in rows], bool)


_GLYPHS = {ch: _bitmap(rows) for ch, rows in _GLYPHS_TEXT.items()}
_UNKNOWN_GLYPH = _bitmap(_UNKNOWN)


def text_mask(text: str, scale: int = 1) -> np.ndarray:
    """(7*scale, 6*len(text)*scale) bool ink mask of one line (1-column gap between glyphs)."""
    if not text:
        return np.zeros((GLYPH_H * scale, 0), bool)
    cells = []
    for ch in text:
        glyph = _GLYPHS.get(ch)
        if glyph is None:
            glyph = _GLYPHS.get(ch.lower(), _UNKNOWN_GLYPH)
        cells.append(np.pad(glyph, ((0, 0), (0, 1))))
    mask = np.concatenate(cells, axis=1)
    return np.kron(mask, np.ones((scale, scale), bool))


def draw_text(image: np.ndarray, lines: list[str], *, scale: int | None = None, origin=(None, None)) -> None:
    """Stamp `lines` in white on a darkened box at the top-left of `image` ((H, W, 3) uint8), in place.

    scale: pixel size of a font dot (default: height // 240, at least 1).
    """
    height, width = image.shape[:2]
    scale = scale or max(1, height // 240)
    pad = 2 * scale
    top = origin[0] if origin[0] is not None else pad
    left = origin[1] if origin[1] is not None else pad
    masks = [text_mask(line, scale) for line in lines]
    line_h = (GLYPH_H + 3) * scale
    box_w = max((m.shape[1] for m in masks), default=0) + 2 * pad
    box_h = line_h * len(masks) + 2 * pad
    v1, u1 = min(height, top + box_h), min(width, left + box_w)
    if v1 <= top or u1 <= left:
        return
    box = image[top:v1, left:u1]
    box //= 3  # darken for contrast (in place)
    for i, mask in enumerate(masks):
        r0 = top + pad + i * line_h
        mh = min(mask.shape[0], height - r0)
        mw = min(mask.shape[1], width - left - pad)
        if mh <= 0 or mw <= 0:
            continue
        region = image[r0:r0 + mh, left + pad:left + pad + mw]
        region[mask[:mh, :mw]] = 255
