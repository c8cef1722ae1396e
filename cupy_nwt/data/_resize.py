"""Pillow's antialiased bilinear resize, on NumPy arrays, in one ``nogil`` Numba kernel.

torchvision resizes PIL images with Pillow's ``resize(BILINEAR)``: a triangle filter widened by the
scale when it shrinks (antialiasing), weights rounded to 22-bit fixed point, a horizontal pass over
only the rows the vertical pass reads, rounded to uint8 in between, then the vertical pass. This is
that arithmetic, step for step, on uint8 H x W x C arrays of any channel count and straight from a
decoder's buffer: no copy into Pillow's four-byte pixels and back. Its output is Pillow's within one
level (tested): bit for bit where Pillow runs its horizontal pass first, while Pillow 13 runs the
vertical pass first for some shapes, rounding in between at another place. The vertical pass runs
along whole rows, which the compiler vectorises; on this machine the kernel takes well under
Pillow's time (the study measures both).
"""

from __future__ import annotations

import math

import numpy as np

from .._interrupts import ctrl_c_held
from ._jit import nogil_kernel

PRECISION_BITS = 32 - 8 - 2  # Pillow's: the weights' fraction bits, the literal 1 << 22 (and its half) below


@nogil_kernel
def _coefficients(in_size, in0, in1, out_size):  # pragma: no cover - JIT
    """Pillow's ``precompute_coeffs`` for the bilinear filter, then its rounding of the weights to fixed point
    with ``PRECISION_BITS`` (22) fraction bits, as Pillow does for 8-bit pixels (``normalize_coeffs_8bpc``)."""
    scale = (in1 - in0) / out_size
    filterscale = scale if scale > 1.0 else 1.0
    support = filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    bounds = np.empty((out_size, 2), np.int64)
    kk = np.zeros((out_size, ksize), np.int32)
    weights = np.empty(ksize, np.float64)
    ss = 1.0 / filterscale
    for xx in range(out_size):
        center = in0 + (xx + 0.5) * scale
        xmin = int(center - support + 0.5)
        if xmin < 0:
            xmin = 0
        xmax = int(center + support + 0.5)
        if xmax > in_size:
            xmax = in_size
        xmax -= xmin
        total = 0.0
        for x in range(xmax):
            t = (x + xmin - center + 0.5) * ss
            t = -t if t < 0 else t
            w = 1.0 - t if t < 1.0 else 0.0
            weights[x] = w
            total += w
        for x in range(xmax):
            w = weights[x] / total if total != 0.0 else 0.0
            kk[xx, x] = int(w * (1 << 22) + 0.5) if w >= 0 else int(w * (1 << 22) - 0.5)
        bounds[xx, 0] = xmin
        bounds[xx, 1] = xmax
    return bounds, kk


@nogil_kernel
def _weigh(rows, first, n, weights, acc, out, out_row):  # pragma: no cover - JIT
    """``out[out_row] = clip8(sum_k rows[first + k] * weights[k])`` along whole rows: vectorised."""
    m = acc.shape[0]
    for i in range(m):
        acc[i] = 1 << 21
    for k in range(n):
        wk = weights[k]
        row = rows[first + k]
        for i in range(m):
            acc[i] += np.int32(row[i]) * wk
    for i in range(m):
        v = acc[i] >> 22
        out[out_row, i] = 0 if v < 0 else (255 if v > 255 else v)


@nogil_kernel
def _horizontal(src, x0, y0, x1, y1, out_h, out_w, flip):  # pragma: no cover - JIT
    """Pillow's horizontal pass over the rows the vertical pass reads, mirrored if ``flip``; run on the
    transposed rows so that it too is a weighted sum of whole rows (the same sums in the same order).
    Returns the rows (rows x out_w*c uint8), the vertical bounds and weights, and the first row."""
    h, w, c = src.shape
    xb, xk = _coefficients(w, x0, x1, out_w)
    yb, yk = _coefficients(h, y0, y1, out_h)
    first = yb[0, 0]
    rows = yb[out_h - 1, 0] + yb[out_h - 1, 1] - first
    col0 = xb[0, 0]
    cols = xb[out_w - 1, 0] + xb[out_w - 1, 1] - col0
    src_t = np.empty((cols, rows * c), np.uint8)
    for y in range(rows):
        for x in range(cols):
            for ch in range(c):
                src_t[x, y * c + ch] = src[first + y, col0 + x, ch]
    tmp_t = np.empty((out_w, rows * c), np.uint8)
    acc = np.empty(rows * c, np.int32)
    for xx in range(out_w):
        _weigh(src_t, xb[xx, 0] - col0, xb[xx, 1], xk[xx], acc, tmp_t, xx)
    tmp = np.empty((rows, out_w * c), np.uint8)
    for xx in range(out_w):
        dst = (out_w - 1 - xx if flip else xx) * c
        for y in range(rows):
            for ch in range(c):
                tmp[y, dst + ch] = tmp_t[xx, y * c + ch]
    return tmp, yb, yk, first


@nogil_kernel
def _resize(src, x0, y0, x1, y1, out_h, out_w, flip, out):  # pragma: no cover - JIT
    """Into ``out``: uint8 out_h x out_w x c."""
    c = src.shape[2]
    tmp, yb, yk, first = _horizontal(src, x0, y0, x1, y1, out_h, out_w, flip)
    acc = np.empty(out_w * c, np.int32)
    flat = out.reshape(out_h, out_w * c)
    for yy in range(out_h):
        _weigh(tmp, yb[yy, 0] - first, yb[yy, 1], yk[yy], acc, flat, yy)


@nogil_kernel
def _resize_normalize(src, x0, y0, x1, y1, out_h, out_w, flip, scale, bias, out):  # pragma: no cover - JIT
    """Into ``out``: float32 c x out_h x out_w, each uint8 result times ``scale[ch]`` plus ``bias[ch]``
    (torchvision's ToTensor then Normalize, in the vertical pass's last step)."""
    c = src.shape[2]
    tmp, yb, yk, first = _horizontal(src, x0, y0, x1, y1, out_h, out_w, flip)
    acc = np.empty(out_w * c, np.int32)
    row = np.empty((1, out_w * c), np.uint8)
    for yy in range(out_h):
        _weigh(tmp, yb[yy, 0] - first, yb[yy, 1], yk[yy], acc, row, 0)
        for ch in range(c):
            s = scale[ch]
            b = bias[ch]
            for xx in range(out_w):
                out[ch, yy, xx] = row[0, xx * c + ch] * s + b


def _load_kernel() -> None:
    """Compile (or load from Numba's cache) for the types ``resize_box`` passes, at import: forked
    workers then share it instead of each compiling on its first image."""
    from numba import types as nt  # noqa: PLC0415 - only for this signature

    u8, f32 = nt.Array(nt.uint8, 3, "C"), nt.Array(nt.float32, 1, "C")
    box = (nt.float64, nt.float64, nt.float64, nt.float64, nt.int64, nt.int64, nt.boolean)
    for src in (u8, nt.Array(nt.uint8, 3, "A")):
        _resize.compile((src, *box, u8))
        _resize_normalize.compile((src, *box, f32, f32, nt.Array(nt.float32, 3, "C")))


with ctrl_c_held():  # a Ctrl-C inside Numba's compiler callbacks would be lost (``_interrupts``)
    _load_kernel()


def resize_box(src: np.ndarray, box: tuple[float, float, float, float], out_h: int, out_w: int,
               flip: bool = False, normalize: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """``src``'s region ``box`` = (top, left, height, width) resized to ``out_h`` x ``out_w``.

    Within one level of Pillow's ``Image.fromarray(src).resize((out_w, out_h), BILINEAR, box=...)``;
    an integral box is first cut out (a view, no copy), as torchvision's ``crop`` then ``resize`` does,
    so the filter never reads outside it. ``flip`` mirrors the output left-right in the same pass.
    Returns uint8 out_h x out_w x C, or, with ``normalize=(scale, bias)`` (float32, one per channel),
    float32 C x out_h x out_w holding ``pixel * scale + bias``.
    """
    top, left, h, w = box
    if all(float(v).is_integer() for v in box):
        t, le, hh, ww = (int(v) for v in box)
        src = src[t:t + hh, le:le + ww]
        top = left = 0.0
    args = (src, float(left), float(top), float(left + w), float(top + h), int(out_h), int(out_w), bool(flip))
    if normalize is not None:
        out_f = np.empty((src.shape[2], out_h, out_w), np.float32)
        _resize_normalize(*args, normalize[0], normalize[1], out_f)
        return out_f
    out = np.empty((out_h, out_w, src.shape[2]), np.uint8)
    _resize(*args, out)
    return out
