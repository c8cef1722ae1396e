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

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def antialias_weights(in_size: int, out_size: int) -> np.ndarray:
    """The ``out_size`` x ``in_size`` matrix of the triangle filter (each row sums to one), float64."""
    if in_size < 1 or out_size < 1:
        raise ArgumentError(f"resampling needs sizes >= 1, got {in_size} -> {out_size}")
    scale = in_size / out_size
    support = max(scale, 1.0)
    centre = (np.arange(out_size) + 0.5) * scale
    first = np.maximum((centre - support + 0.5).astype(np.int64), 0)
    last = np.minimum((centre + support + 0.5).astype(np.int64), in_size)
    j = np.arange(in_size)
    w = np.maximum(0.0, 1.0 - np.abs((j[None, :] - centre[:, None] + 0.5) / support))
    w[(j[None, :] < first[:, None]) | (j[None, :] >= last[:, None])] = 0.0
    return w / w.sum(axis=1, keepdims=True)


def normalize_affine(mean: Sequence[float], std: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, bias)`` per channel so that ``pixel * scale + bias == (pixel / 255 - mean) / std``."""
    m = np.asarray(mean, dtype=np.float64)
    s = np.asarray(std, dtype=np.float64)
    if m.shape != (3,) or s.shape != (3,):
        raise ArgumentError(f"mean and std need 3 values (RGB), got {m.shape[0] if m.ndim else 1} and "
                            f"{s.shape[0] if s.ndim else 1}")
    if not np.all(s > 0):
        raise ArgumentError(f"std must be > 0 for every channel, got {tuple(s)}")
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
        mean, std: per-channel normalisation of ``pixel / 255``.
    """
    top, left, h, w = (int(v) for v in box)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ArgumentError(f"expected an H x W x 3 image, got shape {image.shape}")
    if h < 1 or w < 1 or top < 0 or left < 0 or top + h > image.shape[0] or left + w > image.shape[1]:
        raise ArgumentError(f"crop box {(top, left, h, w)} is not inside the {image.shape[0]}x{image.shape[1]} image")
    wy = antialias_weights(h, size[0])
    wx = antialias_weights(w, size[1])
    if flip:
        wx = wx[::-1]
    roi = image[top:top + h, left:left + w].astype(np.float64)
    out = np.einsum("yh,hwc,xw->cyx", wy, roi, wx, optimize=True)
    scale, bias = normalize_affine(mean, std)
    return (out * scale[:, None, None] + bias[:, None, None]).astype(np.float32)
