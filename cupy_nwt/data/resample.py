"""The resampling of the JPEG decode stage, written once in NumPy: the reference its CUDA kernel must match.

The filter is the one Pillow's ``BILINEAR`` resize and torchvision's ``resize(..., antialias=True)`` use:
a triangle whose support widens with the downscaling factor, so a downscaled pixel averages every
source pixel under it (antialiased) instead of sampling two. Output pixel ``i`` of ``n`` taken from
``m`` source pixels is centred at ``(i + 0.5) * m / n``; its taps are the source pixels within
``max(m / n, 1)`` of that centre, weighted ``1 - |distance| / max(m / n, 1)`` and normalised to sum
to one (at the edges too). Height and width are resampled separably, in floating point with no
rounding to uint8 between them (torchvision rounds a uint8 tensor after each pass, Pillow too: the
difference is under one level of 255).

``crop_resize_flip_normalize`` is the whole CPU path of ``GpuJpegDecoder`` after decoding, and the
reference its kernel (``cuda_src/resize_normalize.cu``) is tested against.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ArgumentError
from .transforms import IMAGENET_MEAN, IMAGENET_STD


def antialias_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The triangle filter as a band: ``first[i]``, the first source pixel of output ``i``, and ``weights[i, t]``,
    the weight of source pixel ``first[i] + t`` (zero past the output's last tap); each row sums to one."""
    if in_size < 1 or out_size < 1:
        raise ArgumentError(f"resampling needs sizes >= 1, got {in_size} -> {out_size}")
    scale = in_size / out_size
    support = max(scale, 1.0)
    centre = (np.arange(out_size) + 0.5) * scale
    first = np.maximum((centre - support + 0.5).astype(np.int64), 0)
    last = np.minimum((centre + support + 0.5).astype(np.int64), in_size)
    j = first[:, None] + np.arange(int((last - first).max()))[None, :]
    w = np.maximum(0.0, 1.0 - np.abs((j - centre[:, None] + 0.5) / support))
    w[j >= last[:, None]] = 0.0
    return first, w / w.sum(axis=1, keepdims=True)


def antialias_weights(in_size: int, out_size: int) -> np.ndarray:
    """The same filter as the dense ``out_size`` x ``in_size`` matrix (float64)."""
    first, band = antialias_taps(in_size, out_size)
    dense = np.zeros((out_size, in_size))
    for t in range(band.shape[1]):
        inside = first + t < in_size
        dense[np.flatnonzero(inside), (first + t)[inside]] = band[inside, t]
    return dense


def normalize_affine(mean: Sequence[float], std: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, bias)`` per channel so that ``pixel * scale + bias == (pixel / 255 - mean) / std``."""
    m = np.asarray(mean, dtype=np.float64)
    s = np.asarray(std, dtype=np.float64)
    if m.shape != (3,) or s.shape != (3,):
        raise ArgumentError(f"mean and std need 3 values (RGB), got {m.shape[0] if m.ndim else 1} and "
                            f"{s.shape[0] if s.ndim else 1}")
    if not np.all(s > 0) or not np.isfinite(s).all():
        raise ArgumentError(f"std must be finite and > 0 for every channel, got {tuple(s.tolist())}")
    if not np.isfinite(m).all():
        raise ArgumentError(f"mean must be finite for every channel, got {tuple(m.tolist())}")
    return 1.0 / (255.0 * s), -m / s


def crop_resize_flip_normalize(image: np.ndarray, box: Sequence[int], size: tuple[int, int], flip: bool,
                               mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                               ) -> np.ndarray:
    """One uint8 HWC RGB image -> float32 CHW: crop ``box``, resize to ``size``, mirror if ``flip``, normalise.

    Args:
        image: decoded pixels, H x W x 3 uint8 (the box is in its coordinates).
        box: ``(top, left, height, width)`` of the crop, inside the image.
        size: ``(height, width)`` of the output.
        flip: mirror the output left to right (torchvision's flip after the resized crop).
        mean: per-channel mean subtracted from ``pixel / 255``.
        std: per-channel divisor after the mean.
    """
    top, left, h, w = (int(v) for v in box)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ArgumentError(f"expected an H x W x 3 image, got shape {image.shape}")
    if h < 1 or w < 1 or top < 0 or left < 0 or top + h > image.shape[0] or left + w > image.shape[1]:
        raise ArgumentError(f"crop box {(top, left, h, w)} is not inside the {image.shape[0]}x{image.shape[1]} image")
    roi = image[top:top + h, left:left + w]
    rows = _resample_axis(roi, size[0], axis=0)  # out_h x w x 3, float64
    out = _resample_axis(rows, size[1], axis=1)  # out_h x out_w x 3
    if flip:
        out = out[:, ::-1]
    scale, bias = normalize_affine(mean, std)
    return (out.transpose(2, 0, 1) * scale[:, None, None] + bias[:, None, None]).astype(np.float32)


def _resample_axis(a: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    """``antialias_taps`` applied along ``axis`` (0 or 1) of ``a``, one tap at a time."""
    in_size = a.shape[axis]
    first, band = antialias_taps(in_size, out_size)
    out = np.zeros((out_size, *a.shape[1:]) if axis == 0 else (a.shape[0], out_size, *a.shape[2:]), np.float64)
    for t in range(band.shape[1]):
        j = np.minimum(first + t, in_size - 1)  # past the last tap the weight is zero
        if axis == 0:
            out += band[:, t, None, None] * a[j]
        else:
            out += band[None, :, t, None] * a[:, j]
    return out
