"""A tiny PNG writer (numpy + zlib) and a horizontal bar chart of ratios.

matplotlib is not a dependency of hlofuse, so the chart is drawn into an RGB numpy array with
a built-in 5x7 bitmap font and written as a PNG by hand (signature, IHDR, IDAT, IEND chunks).
"""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np

# 5x7 glyphs: 7 rows of 5 columns separated by '|' ('#' = ink)
_FONT_SRC = {
    '0': " ### |#   #|#  ##|# # #|##  #|#   #| ### ",
    '1': "  #  | ##  |  #  |  #  |  #  |  #  | ### ",
    '2': " ### |#   #|    #|   # |  #  | #   |#####",
    '3': "#####|   # |  #  |   # |    #|#   #| ### ",
    '4': "   # |  ## | # # |#  # |#####|   # |   # ",
    '5': "#####|#    |#### |    #|    #|#   #| ### ",
    '6': "  ## | #   |#    |#### |#   #|#   #| ### ",
    '7': "#####|    #|   # |  #  | #   | #   | #   ",
    '8': " ### |#   #|#   #| ### |#   #|#   #| ### ",
    '9': " ### |#   #|#   #| ####|    #|   # | ##  ",
    'a': "     |     | ### |    #| ####|#   #| ####",
    'b': "#    |#    |# ## |##  #|#   #|#   #|#### ",
    'c': "     |     | ### |#    |#    |#   #| ### ",
    'd': "    #|    #| ## #|#  ##|#   #|#   #| ####",
    'e': "     |     | ### |#   #|#####|#    | ### ",
    'f': "  ## | #  #| #   |###  | #   | #   | #   ",
    'g': "     | ####|#   #|#   #| ####|    #| ### ",
    'h': "#    |#    |# ## |##  #|#   #|#   #|#   #",
    'i': "  #  |     | ##  |  #  |  #  |  #  | ### ",
    'j': "   # |     |  ## |   # |   # |#  # | ##  ",
    'k': "#    |#    |#  # |# #  |##   |# #  |#  # ",
    'l': " ##  |  #  |  #  |  #  |  #  |  #  | ### ",
    'm': "     |     |## # |# # #|# # #|#   #|#   #",
    'n': "     |     |# ## |##  #|#   #|#   #|#   #",
    'o': "     |     | ### |#   #|#   #|#   #| ### ",
    'p': "     |     |#### |#   #|#### |#    |#    ",
    'q': "     |     | ## #|#  ##| ####|    #|    #",
    'r': "     |     |# ## |##  #|#    |#    |#    ",
    's': "     |     | ### |#    | ### |    #|#### ",
    't': " #   | #   |###  | #   | #   | #  #|  ## ",
    'u': "     |     |#   #|#   #|#   #|#  ##| ## #",
    'v': "     |     |#   #|#   #|#   #| # # |  #  ",
    'w': "     |     |#   #|#   #|# # #|# # #| # # ",
    'x': "     |     |#   #| # # |  #  | # # |#   #",
    'y': "     |     |#   #|#   #| ####|    #| ### ",
    'z': "     |     |#####|   # |  #  | #   |#####",
    '_': "     |     |     |     |     |     |#####",
    '.': "     |     |     |     |     | ##  | ##  ",
    ',': "     |     |     |     | ##  |  #  | #   ",
    '/': "    #|    #|   # |  #  | #   |#    |#    ",
    '=': "     |     |#####|     |#####|     |     ",
    '-': "     |     |     |#####|     |     |     ",
    ':': "     | ##  | ##  |     | ##  | ##  |     ",
    ';': "     | ##  | ##  |     | ##  |  #  | #   ",
    '%': "##   |##  #|   # |  #  | #   |#  ##|   ##",
    '+': "     |  #  |  #  |#####|  #  |  #  |     ",
    '(': "   # |  #  | #   | #   | #   |  #  |   # ",
    ')': " #   |  #  |   # |   # |   # |  #  | #   ",
    '<': "   # |  #  | #   |#    | #   |  #  |   # ",
    '>': " #   |  #  |   # |    #|   # |  #  | #   ",
    ' ': "     |     |     |     |     |     |     ",
}

FONT = {ch: np.array([[c == "#" for c in row] for row in src.split("|")], bool)
        for ch, src in _FONT_SRC.items()}


def write_png(path: str, rgb: np.ndarray) -> None:
    """Write an (H, W, 3) uint8 array as an 8-bit RGB PNG."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))  # filter type 0 per row

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    with open(path, "wb") as fh:
        fh.write(png)


def draw_text(img: np.ndarray, x: int, y: int, text: str, color=(0, 0, 0), scale: int = 2) -> int:
    """Draw ``text`` with its top-left corner at (x, y); returns the x after the last glyph."""
    for ch in text.lower():
        g = FONT.get(ch, FONT[" "])
        big = np.kron(g, np.ones((scale, scale), bool))
        h, w = big.shape
        ys, xs = slice(max(y, 0), min(y + h, img.shape[0])), slice(max(x, 0), min(x + w, img.shape[1]))
        sub = big[ys.start - y:ys.stop - y, xs.start - x:xs.stop - x]
        img[ys, xs][sub] = color
        x += (5 + 1) * scale
    return x


def text_width(text: str, scale: int = 2) -> int:
    return len(text) * 6 * scale


def bar_chart(path: str, labels: list[str], values: list[float], *, lo: list | None = None,
              hi: list | None = None, goals: list | None = None, title: str = "",
              ref: float = 1.0) -> None:
    """Horizontal bars of ``values`` (e.g. time ratios) with a reference line at ``ref``.

    Bars are green below ``ref - 2%``, red above ``ref + 2%``, grey in between; ``lo``/``hi``
    draw whiskers (e.g. quartiles of per-round ratios); ``goals`` draws a blue tick per bar.
    """
    write_png(path, bar_image(labels, values, lo=lo, hi=hi, goals=goals, title=title, ref=ref))


def stack(images: list[np.ndarray]) -> np.ndarray:
    """Images one below the other on a white background (for charts with several panels)."""
    w = max(im.shape[1] for im in images)
    return np.concatenate([np.pad(im, ((0, 0), (0, w - im.shape[1]), (0, 0)), constant_values=255)
                           for im in images], axis=0)


def bar_image(labels: list[str], values: list[float], *, lo: list | None = None,
              hi: list | None = None, goals: list | None = None, title: str = "",
              ref: float = 1.0) -> np.ndarray:
    """:func:`bar_chart`'s picture as an (H, W, 3) uint8 array."""
    n = len(labels)
    scale = 2
    row_h = 34
    left = max([text_width(s, scale) for s in labels] + [60]) + 20
    right_pad = 110
    plot_w = 600
    top = 50 if title else 20
    h = top + n * row_h + 50
    w = left + plot_w + right_pad
    img = np.full((h, w, 3), 255, np.uint8)
    finite = [v for v in values + (hi or []) + (goals or []) if v is not None and math.isfinite(v)]
    vmax = max([ref * 1.25] + [v * 1.05 for v in finite])
    px = lambda v: left + int(round(plot_w * max(0.0, min(v, vmax)) / vmax))  # noqa: E731
    if title:
        draw_text(img, 10, 12, title, (0, 0, 0), scale)
    for i, (lab, v) in enumerate(zip(labels, values)):
        y0 = top + i * row_h
        draw_text(img, left - 10 - text_width(lab, scale), y0 + 10, lab, (0, 0, 0), scale)
        if v is None or not math.isfinite(v):
            draw_text(img, left + 5, y0 + 10, "n/a", (120, 120, 120), scale)
            continue
        color = (40, 160, 70) if v < ref * 0.98 else (200, 50, 50) if v > ref * 1.02 else (150, 150, 150)
        img[y0 + 6:y0 + row_h - 6, left:px(v)] = color
        if lo and hi and lo[i] is not None and hi[i] is not None and math.isfinite(lo[i]) and math.isfinite(hi[i]):
            yc = y0 + row_h // 2
            img[yc - 1:yc + 1, px(lo[i]):px(hi[i]) + 1] = (0, 0, 0)
            for e in (lo[i], hi[i]):
                img[yc - 5:yc + 5, px(e):px(e) + 1] = (0, 0, 0)
        if goals and goals[i] is not None and math.isfinite(goals[i]):
            img[y0 + 2:y0 + row_h - 2, px(goals[i]) - 1:px(goals[i]) + 2] = (30, 80, 220)
        draw_text(img, left + plot_w + 14, y0 + 10, f"{v:.2f}", (0, 0, 0), scale)
    # reference line and axis ticks
    img[top - 5:top + n * row_h + 5, px(ref):px(ref) + 2] = (0, 0, 0)
    ya = top + n * row_h + 10
    img[ya:ya + 1, left:left + plot_w] = (0, 0, 0)
    step = 0.25 if vmax <= 2.5 else 0.5 if vmax <= 5 else 1.0
    t = 0.0
    while t <= vmax + 1e-9:
        img[ya:ya + 6, px(t):px(t) + 1] = (0, 0, 0)
        lab = f"{t:g}"
        draw_text(img, px(t) - text_width(lab, scale) // 2, ya + 10, lab, (0, 0, 0), scale)
        t += step
    return img
