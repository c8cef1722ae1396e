"""The ImageNet crops with torchvision's meaning, told to the decoder so that it makes only what they keep.

``RandomResizedCrop`` (training) and ``Resize`` then ``CenterCrop`` (evaluation) are per-sample
transforms, as in torchvision: called on a uint8 H x W x C array they crop and resize it. Given to
``ImageFolder``, ``TarImageDataset``, ``SyntheticCIFAR10`` or ``ShardedTarStream`` as ``transform=``
(alone or first in a ``Compose``), they are handed the encoded bytes instead (``from_bytes``): the
box is drawn from the size in the file's header, and the JPEG is decoded at the smallest DCT scale
that still holds the output (see ``_region_decode``), then resized once.

``random_resized_crop_box`` is the one place the training box is drawn; the GPU path draws its
boxes with it too, so both paths crop alike for the same generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._checks import check_int, check_number
from ..errors import ArgumentError
from ._process_rng import ProcessRng
from ._region_decode import EncodedImage, check_backend
from ._resize import resize_box
from .transforms import _mean_std

Box = tuple[int, int, int, int]


def _size_pair(size: int | Sequence[int], who: str) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        pair = (int(size), int(size))
    elif isinstance(size, Sequence) and len(size) in (1, 2):
        pair = (int(size[0]), int(size[-1]))
    else:
        raise ArgumentError(f"{who}: size must be an int or (height, width), got {size!r}")
    for v in pair:
        check_int(f"{who} size", v, ge=1)
    return pair


def _range(name: str, value: Sequence[float], who: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ArgumentError(f"{who}: {name} must be a (min, max) pair of numbers, got {value!r}") from None
    if not (0 < lo <= hi and math.isfinite(hi)):
        raise ArgumentError(f"{who}: {name} must satisfy 0 < min <= max, got {value!r}")
    return lo, hi


def random_resized_crop_box(height: int, width: int, rng: np.random.Generator,
                            scale: tuple[float, float] = (0.08, 1.0),
                            ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> Box:
    """A random crop box ``(top, left, h, w)`` of a ``height`` x ``width`` image, as torchvision draws it.

    Up to ten tries: an area of ``scale`` times the image's (uniform) and an aspect ratio w/h
    log-uniform in ``ratio``; the first whose rounded box fits the image is placed uniformly. When
    none fits, the centred crop of the whole image clamped to ``ratio``, at least one pixel a side
    (torchvision's rounds a 1-pixel-thin image's to an empty box). Draws from ``rng``
    (NumPy's generator), so the boxes equal torchvision's in law, not draw for draw.

    Args:
        height: the image's height in pixels.
        width: the image's width in pixels.
        rng: where the random numbers come from.
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's aspect ratio (width / height).
    """
    area = check_int("height", height, ge=1) * check_int("width", width, ge=1)
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, max(1, int(round(width / min(ratio))))
    elif in_ratio > max(ratio):
        h, w = height, max(1, int(round(height * max(ratio))))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def resized_shape(height: int, width: int, size: int | tuple[int, int]) -> tuple[int, int]:
    """torchvision's ``Resize`` output (height, width): an int sets the shorter side, keeping the aspect.

    Args:
        height: the image's height in pixels.
        width: the image's width in pixels.
        size: the shorter side's length, or the output's (height, width).
    """
    if isinstance(size, tuple):
        return size
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def center_crop_box(height: int, width: int, out_h: int, out_w: int) -> Box:
    """torchvision's ``CenterCrop`` box (top, left, h, w) for a crop no larger than the image.

    Args:
        height: the image's height in pixels.
        width: the image's width in pixels.
        out_h: the crop's height.
        out_w: the crop's width.
    """
    return int(round((height - out_h) / 2.0)), int(round((width - out_w) / 2.0)), out_h, out_w


class _DecodingTransform:
    """A per-sample transform that can also start from the encoded bytes (see ``from_bytes``)."""

    backend: str
    flip_p: float = 0.0
    _normalize: tuple[np.ndarray, np.ndarray] | None = None
    _rng: ProcessRng | None = None

    def _box(self, height: int, width: int) -> tuple[Box, int, int]:
        raise NotImplementedError

    def _flip(self) -> bool:
        return self._rng is not None and self.flip_p > 0 and bool(self._rng.get().random() < self.flip_p)

    def from_bytes(self, data: bytes | memoryview, name: str, sample_index: int | None = None) -> np.ndarray:
        """Decode only what the crop keeps. ``name`` and ``sample_index`` go into errors."""
        enc = EncodedImage(data, name, sample_index, self.backend)
        try:
            box, out_h, out_w = self._box(enc.height, enc.width)
            return enc.region(box, out_h, out_w, self._flip(), self._normalize)
        finally:
            enc.close()

    def __call__(self, img: np.ndarray) -> np.ndarray:
        a = np.asarray(img)
        if a.ndim != 3 or a.dtype != np.uint8 or 0 in a.shape:
            raise ArgumentError(f"{type(self).__name__} needs a non-empty uint8 H x W x C image, got {a.dtype} {a.shape}")
        if self._normalize is not None and a.shape[2] != 3:  # one mean and std per RGB channel, as torchvision's
            raise ArgumentError(f"{type(self).__name__}(normalize=...) takes RGB images (H x W x 3), got {a.shape[2]} "
                                "channel(s): convert the image to RGB first, or leave normalize out")
        box, out_h, out_w = self._box(a.shape[0], a.shape[1])
        return resize_box(a, box, out_h, out_w, self._flip(), self._normalize)


def _scale_bias(normalize: tuple[Sequence[float], Sequence[float]] | None) -> tuple[np.ndarray, np.ndarray] | None:
    if normalize is None:
        return None
    try:
        mean, std = normalize
    except (TypeError, ValueError):
        raise ArgumentError(f"normalize must be (mean, std) or None, got {normalize!r}") from None
    m, s = _mean_std(mean, std)
    if m.size not in (1, 3):
        raise ArgumentError(f"normalize needs one mean and std per RGB channel, got {m.size}")
    m, s = np.broadcast_to(m, (3,)), np.broadcast_to(s, (3,))
    return (np.ascontiguousarray(1.0 / (255.0 * s), dtype=np.float32),
            np.ascontiguousarray(-m / s, dtype=np.float32))


def _per_channel(normalize: tuple[Sequence[float], Sequence[float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(mean, std)`` as three floats each (a checked ``normalize``: ``_scale_bias`` has passed it)."""
    mean, std = (np.broadcast_to(np.asarray(v, np.float64).reshape(-1), (3,)) for v in normalize)
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


class RandomResizedCrop(_DecodingTransform):
    """torchvision's ``RandomResizedCrop``: a random box (``random_resized_crop_box``) resized to ``size``.

    Bilinear, antialiased (Pillow's arithmetic, as torchvision's on PIL images, in a Numba kernel).
    From encoded JPEG bytes the crop is decoded at the DCT scale that still holds ``size``
    (``_region_decode``'s rule). Output: uint8 H x W x 3, the layout of every image dataset here.

    The rest of torchvision's ImageNet recipe can ride in the resize's last pass instead of costing
    passes of its own: ``flip_p`` is ``RandomHorizontalFlip(flip_p)``, and ``normalize=(mean, std)``
    is ``ToTensor()`` then ``Normalize(mean, std)``: the output is then float32 3 x H x W.

    Args:
        size: output side, or (height, width).
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's aspect ratio (width / height).
        seed: seeds the draws: each worker draws from this seed and its worker seed (``ProcessRng``).
        backend: ``"auto"`` (the libjpeg-turbo region decoder where built, else simplejpeg, else Pillow),
            ``"libjpeg"``, ``"simplejpeg"`` or ``"pillow"``.
        flip_p: probability of mirroring the crop left-right.
        normalize: ``(mean, std)`` per channel of pixels scaled to [0, 1] (e.g. ``IMAGENET_MEAN``,
            ``IMAGENET_STD``), or None for uint8 output; kept as ``normalize``, three of each.
    """

    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), seed: int | None = None, backend: str = "auto", *,
                 flip_p: float = 0.0, normalize: tuple[Sequence[float], Sequence[float]] | None = None) -> None:
        self.size = _size_pair(size, "RandomResizedCrop")
        self.scale = _range("scale", scale, "RandomResizedCrop")
        self.ratio = _range("ratio", ratio, "RandomResizedCrop")
        self.backend = check_backend(backend)
        self.flip_p = check_number("flip_p", flip_p, ge=0, le=1)
        self._normalize = _scale_bias(normalize)
        self.normalize = None if normalize is None else _per_channel(normalize)
        self._rng = ProcessRng(seed)

    def box(self, height: int, width: int, rng: np.random.Generator | None = None) -> Box:
        """The crop box ``(top, left, h, w)`` for a ``height`` x ``width`` image (this process's generator by default)."""
        assert self._rng is not None
        return random_resized_crop_box(height, width, self._rng.get() if rng is None else rng, self.scale, self.ratio)

    def _box(self, height: int, width: int) -> tuple[Box, int, int]:
        return self.box(height, width), *self.size

    def __repr__(self) -> str:
        return (f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, flip_p={self.flip_p}, "
                f"normalized={self._normalize is not None})")


class Resize(_DecodingTransform):
    """torchvision's ``Resize``: an int sets the shorter side (aspect kept), a pair the exact (height, width).

    From encoded JPEG bytes the image is decoded at the DCT scale that still holds the output.

    Args:
        size: the shorter side's length, or (height, width).
        backend: as ``RandomResizedCrop``'s.
    """

    def __init__(self, size: int | Sequence[int], backend: str = "auto") -> None:
        pair = _size_pair(size, "Resize")
        self.size: int | tuple[int, int] = pair if isinstance(size, Sequence) and len(size) == 2 else pair[0]
        self.backend = check_backend(backend)

    def _box(self, height: int, width: int) -> tuple[Box, int, int]:
        return (0, 0, height, width), *resized_shape(height, width, self.size)

    def __repr__(self) -> str:
        return f"Resize(size={self.size})"


class CenterCrop:
    """torchvision's ``CenterCrop`` on a uint8 H x W x C array; an image smaller than ``size`` is zero-padded first.

    Args:
        size: output side, or (height, width).
    """

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _size_pair(size, "CenterCrop")

    def __call__(self, img: np.ndarray) -> np.ndarray:
        a = np.asarray(img)
        if a.ndim != 3:
            raise ArgumentError(f"CenterCrop needs an H x W x C image, got shape {a.shape}")
        out_h, out_w = self.size
        h, w = a.shape[:2]
        if out_h > h or out_w > w:
            pad_h, pad_w = max(out_h - h, 0), max(out_w - w, 0)
            a = np.pad(a, ((pad_h // 2, (pad_h + 1) // 2), (pad_w // 2, (pad_w + 1) // 2), (0, 0)))
            h, w = a.shape[:2]
        top, left, _, _ = center_crop_box(h, w, out_h, out_w)
        return np.ascontiguousarray(a[top:top + out_h, left:left + out_w])

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size})"


def takes_bytes(transform: Any) -> bool:
    """Whether a dataset should hand ``transform`` the encoded bytes (``from_bytes``) rather than pixels."""
    return callable(getattr(transform, "from_bytes", None))
