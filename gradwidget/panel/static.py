"""The panel's static image, straight from the heatmap arrays the page draws: viridis on the same
log scale, the same marks, the cursor column; encoded as a PNG with zlib. No matplotlib layout:
it costs milliseconds, so it can be remade after every cell without the user waiting for it
(``plots.panel_figure`` is the annotated figure for reports)."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from .._look import VIRIDIS_HEX
from .protocol import FLAG_EXPLODING, FLAG_NODATA, FLAG_NONFINITE, FLAG_VANISHING, MARKS

#: the image's size in pixels, at most (cells are repeated to fill it, at most MAX_CELL pixels a
#: cell: a small run's image is readable at its own size, where no stylesheet stretches it).
MAX_WIDTH, MAX_HEIGHT, MAX_CELL = 900, 480, 24
_LUT: np.ndarray | None = None


def viridis() -> np.ndarray:
    """viridis as 256 RGB rows (uint8), the page's colour map (``_look.VIRIDIS_HEX``)."""
    global _LUT
    if _LUT is None:
        _LUT = np.frombuffer(bytes.fromhex(VIRIDIS_HEX), np.uint8).reshape(256, 3)
    return _LUT


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)], np.uint8)


def colorize(heat: np.ndarray, flags: np.ndarray, scale: tuple[float, float]) -> np.ndarray:
    """``(rows, cols, 3)`` uint8: viridis on log10 over ``scale``, then the marks (the page's
    precedence: non-finite, exploding, vanishing, no data)."""
    lo, hi = scale
    with np.errstate(divide="ignore", invalid="ignore"):
        pos = (np.log10(heat.astype(np.float64)) - lo) / (hi - lo if hi > lo else 1.0)
    idx = np.clip(np.nan_to_num(pos, nan=0.0, posinf=1.0, neginf=0.0) * 255, 0, 255).astype(np.uint8)
    rgb = viridis()[idx]
    rgb[~np.isfinite(heat) | (heat <= 0)] = _rgb(MARKS["nodata"])
    for bit, name in (
        (FLAG_NODATA, "nodata"),
        (FLAG_VANISHING, "vanishing"),
        (FLAG_EXPLODING, "exploding"),
        (FLAG_NONFINITE, "nonfinite"),
    ):
        rgb[(flags & bit) != 0] = _rgb(MARKS[name])
    return rgb


def png_bytes(rgb: np.ndarray) -> bytes:
    """A truecolour PNG of an ``(h, w, 3)`` uint8 image."""
    h, w, _ = rgb.shape
    raw = np.empty((h, 1 + 3 * w), np.uint8)
    raw[:, 0] = 0  # filter: none
    raw[:, 1:] = rgb.reshape(h, 3 * w)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6))
        + chunk(b"IEND", b"")
    )


def heat_png(heat: np.ndarray, flags: np.ndarray, scale: tuple[float, float], cursor: int | None = None) -> bytes:
    """The heatmap (``(layers, cols)``, depth order) as the page shows it: input side at the top,
    each cell repeated to a readable size, the cursor's column in white."""
    rows, cols = heat.shape
    if rows == 0 or cols == 0:
        return png_bytes(np.full((1, 1, 3), 255, np.uint8))
    # more cells than pixels: every k-th row / column (a thumbnail; the live view has them all)
    kr, kc = -(-rows // MAX_HEIGHT), -(-cols // MAX_WIDTH)
    rgb = colorize(heat[::kr, ::kc], flags[::kr, ::kc], scale)
    if cursor is not None and 0 <= cursor < cols:
        rgb[:, cursor // kc] = 255
    rh = int(np.clip(MAX_HEIGHT // rows, 1, MAX_CELL))
    cw = int(np.clip(MAX_WIDTH // cols, 1, MAX_CELL))
    return png_bytes(np.repeat(np.repeat(rgb, rh, axis=0), cw, axis=1))
