"""Image transforms: per-sample callables, and Numba batch kernels for the standard CIFAR pipeline.

The batch path is the fast one: ``CifarTrainTransform`` draws every sample's crop offset and flip
for the whole batch with one vectorised call on ``np.random.default_rng(seed)``, then one
``nogil`` Numba kernel does pad + crop + flip + normalize + HWC uint8 -> CHW float32 in a single
pass over the pixels. ``seed`` comes from the loader (loader seed, epoch, batch index), so the
augmentation of a batch does not depend on which worker made it.

Per-sample transforms (``RandomCrop`` ...) follow torchvision's order and meaning; each worker
draws from its own stream of the transform's seed and its worker seed (``ProcessRng``), so a seeded
loader repeats its crops run after run, as long as the same worker makes the same samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._checks import check_callable, check_int
from .._interrupts import ctrl_c_held
from ..errors import ArgumentError, ArgumentTypeError
from ._jit import nogil_kernel
from ._process_rng import ProcessRng

# Per-channel statistics of the CIFAR-10 training set (pixels scaled to [0, 1]).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
# ... and of ImageNet's, as torchvision's recipes normalise by.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# --- per-sample transforms ---------------------------------------------------------------------


class Compose:
    """Apply transforms in order.

    Args:
        transforms: callables applied one after the other, each to the previous one's output.
    """

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        if isinstance(transforms, (str, bytes)) or not hasattr(transforms, "__iter__"):
            raise ArgumentTypeError(f"transforms must be a list of callables, got {transforms!r}")
        self.transforms = list(transforms)
        for k, t in enumerate(self.transforms):
            check_callable(f"transforms[{k}]", t)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x

    def from_bytes(self, data: bytes | memoryview, name: str, sample_index: int | None = None) -> Any:
        """Start from an encoded image: the first transform decodes it if it can (a crop decodes only
        its region), else it is decoded whole; ``name`` and ``sample_index`` go into errors."""
        from ._images import decode_image  # noqa: PLC0415 - Pillow only when an image is decoded

        first, rest = (self.transforms[0], self.transforms[1:]) if self.transforms else (None, [])
        from_bytes = getattr(first, "from_bytes", None)
        if callable(from_bytes):
            x = from_bytes(data, name, sample_index)
        else:
            x = decode_image(data, name, sample_index)
            if first is not None:
                x = first(x)
        for t in rest:
            x = t(x)
        return x

    def __repr__(self) -> str:
        return f"Compose({self.transforms!r})"


def _check_hwc(img: np.ndarray, who: str) -> np.ndarray:
    a = np.asarray(img)
    if a.ndim != 3:
        raise ArgumentError(f"{who} needs an H x W x C image, got shape {a.shape}")
    return a


class RandomCrop:
    """Zero-pad each side by ``padding``, then crop a random ``size`` x ``size`` window (HWC in, HWC out).

    Args:
        size: side of the square crop.
        padding: zeros added on each side first.
        seed: seeds the crop positions (None: fresh entropy).
    """

    def __init__(self, size: int, padding: int = 0, seed: int | None = None) -> None:
        if size <= 0 or padding < 0:
            raise ArgumentError(f"RandomCrop needs size > 0 and padding >= 0, got size={size}, padding={padding}")
        self.size, self.padding = int(size), int(padding)
        self._rng = ProcessRng(seed)

    def __call__(self, img: np.ndarray) -> np.ndarray:
        a = _check_hwc(img, "RandomCrop")
        p, s = self.padding, self.size
        h, w = a.shape[0] + 2 * p, a.shape[1] + 2 * p
        if s > h or s > w:
            raise ArgumentError(f"RandomCrop: crop {s} is larger than the padded image {h}x{w}")
        if p:
            a = np.pad(a, ((p, p), (p, p), (0, 0)))
        y, x = self._rng.get().integers(0, (h - s + 1, w - s + 1))
        return np.ascontiguousarray(a[y:y + s, x:x + s])

    def __repr__(self) -> str:
        return f"RandomCrop(size={self.size}, padding={self.padding})"


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p`` (HWC in, HWC out).

    Args:
        p: probability of a flip.
        seed: seeds the draws (None: fresh entropy).
    """

    def __init__(self, p: float = 0.5, seed: int | None = None) -> None:
        if not 0.0 <= p <= 1.0:
            raise ArgumentError(f"RandomHorizontalFlip needs 0 <= p <= 1, got {p}")
        self.p = float(p)
        self._rng = ProcessRng(seed)

    def __call__(self, img: np.ndarray) -> np.ndarray:
        a = _check_hwc(img, "RandomHorizontalFlip")
        return np.ascontiguousarray(a[:, ::-1]) if self._rng.get().random() < self.p else a

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class ToCHWFloat:
    """HWC (uint8) -> CHW float32, multiplied by ``scale`` (1/255 maps uint8 to [0, 1]).

    Args:
        scale: factor applied after the cast (1/255 maps uint8 to [0, 1]).
    """

    def __init__(self, scale: float = 1.0 / 255.0) -> None:
        self.scale = float(scale)

    def __call__(self, img: np.ndarray) -> np.ndarray:
        a = _check_hwc(img, "ToCHWFloat")
        out = a.transpose(2, 0, 1).astype(np.float32)
        out *= np.float32(self.scale)
        return out

    def __repr__(self) -> str:
        return f"ToCHWFloat(scale={self.scale})"


class Normalize:
    """``(x - mean[c]) / std[c]`` on a C x H x W float image (use after ``ToCHWFloat``).

    Args:
        mean: per-channel mean.
        std: per-channel standard deviation.
    """

    def __init__(self, mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD) -> None:
        self.mean, self.std = _mean_std(mean, std)

    def __call__(self, img: np.ndarray) -> np.ndarray:
        a = np.asarray(img)
        if a.ndim != 3 or a.shape[0] != len(self.mean):
            raise ArgumentError(f"Normalize needs a C x H x W image with C = {len(self.mean)}, got shape {a.shape}")
        return ((a - self.mean[:, None, None]) / self.std[:, None, None]).astype(np.float32, copy=False)

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean.tolist()}, std={self.std.tolist()})"


def _mean_std(mean: Sequence[float], std: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    m = np.asarray(mean, dtype=np.float32).reshape(-1)
    s = np.asarray(std, dtype=np.float32).reshape(-1)
    if m.shape != s.shape or m.size == 0:
        raise ArgumentError(f"mean and std need one value per channel, got {m.size} and {s.size}")
    if not (np.isfinite(m).all() and np.isfinite(s).all() and (s > 0).all()):
        raise ArgumentError(f"mean must be finite and std finite and positive, got mean={mean!r}, std={std!r}")
    return m, s


# --- the batch kernel --------------------------------------------------------------------------


@nogil_kernel
def _crop_flip_normalize(images, oy, ox, flip, pad, out_h, out_w, scale, bias, out):  # pragma: no cover - JIT
    n, h, w, c = images.shape
    for k in range(n):
        y0 = oy[k] - pad
        x0 = ox[k] - pad
        mirrored = flip[k]
        for ch in range(c):
            s = scale[ch]
            b = bias[ch]
            for i in range(out_h):
                sy = y0 + i
                inside_y = 0 <= sy < h
                for j in range(out_w):
                    sx = x0 + (out_w - 1 - j if mirrored else j)
                    if inside_y and 0 <= sx < w:
                        out[k, ch, i, j] = images[k, sy, sx, ch] * s + b
                    else:
                        out[k, ch, i, j] = b


@nogil_kernel
def _normalize_to_chw(images, scale, bias, out):  # pragma: no cover - JIT
    n, h, w, c = images.shape
    for k in range(n):
        src = images[k].reshape(h * w, c)
        dst = out[k].reshape(c, h * w)
        for ch in range(c):
            s = scale[ch]
            b = bias[ch]
            plane = dst[ch]
            for p in range(h * w):  # one channel plane at a time: a branch-free loop the compiler vectorises
                plane[p] = src[p, ch] * s + b


def _load_kernel() -> None:
    """Compile the kernel, or load it from Numba's disk cache, for the types ``crop_flip_normalize`` passes.

    Done at import, not at the first call, so that a process importing this module once shares the
    loaded kernel with every worker it forks (forkserver's server imports it too): left to the first
    call, each worker would load it on its own, most of a forked worker's start-up.
    Other types (a read-only or strided array) still compile on first use.
    """
    from numba import types as nt  # noqa: PLC0415 - only for this signature

    def arr(dtype: Any, ndim: int) -> Any:
        return nt.Array(dtype, ndim, "C")

    i64 = arr(nt.int64, 1)
    _crop_flip_normalize.compile((arr(nt.uint8, 4), i64, i64, arr(nt.boolean, 1), nt.int64, nt.int64, nt.int64,
                                  arr(nt.float32, 1), arr(nt.float32, 1), arr(nt.float32, 4)))
    _normalize_to_chw.compile((arr(nt.uint8, 4), arr(nt.float32, 1), arr(nt.float32, 1), arr(nt.float32, 4)))


with ctrl_c_held():  # a Ctrl-C inside Numba's compiler callbacks would be lost (``_interrupts``)
    _load_kernel()


def crop_flip_normalize(images: np.ndarray, oy: np.ndarray, ox: np.ndarray, flip: np.ndarray, *,
                        size: int | tuple[int, int], padding: int, mean: Sequence[float] = CIFAR10_MEAN,
                        std: Sequence[float] = CIFAR10_STD, out: np.ndarray | None = None) -> np.ndarray:
    """Pad by ``padding`` (zeros), crop at (oy[k], ox[k]) in the padded image, mirror where ``flip[k]``,
    normalize, and write N x C x size x size float32 (into ``out`` if given, e.g. a shared-memory slot).

    Padding pixels are zeros before normalizing, so they come out as ``-mean/std``, as in torchvision.

    Args:
        images: N x H x W x C uint8 images.
        oy: per image, the crop's top row in the padded image.
        ox: per image, the crop's left column in the padded image.
        flip: per image, whether to mirror it.
        size: the crop's side (or (height, width)).
        padding: zeros added on each side before cropping.
        mean: per-channel mean, subtracted after scaling to [0, 1].
        std: per-channel standard deviation, divided by.
        out: an N x C x size x size float32 array to write into (e.g. a ring slot), else a new one.
    """
    a = np.asarray(images)
    if a.dtype != np.uint8 or a.ndim != 4:
        raise ArgumentError(f"need uint8 images shaped N x H x W x C, got {a.dtype} {a.shape}")
    n, h, w, c = a.shape
    oh, ow = (size, size) if isinstance(size, (int, np.integer)) else size
    oh, ow, pad = int(oh), int(ow), int(padding)
    if oh <= 0 or ow <= 0 or pad < 0:
        raise ArgumentError(f"need a positive crop size and padding >= 0, got size={size}, padding={padding}")
    if oh > h + 2 * pad or ow > w + 2 * pad:
        raise ArgumentError(f"crop {oh}x{ow} does not fit the padded image {h + 2 * pad}x{w + 2 * pad}")
    m, s = _mean_std(mean, std)
    if m.size not in (1, c):
        raise ArgumentError(f"mean/std have {m.size} values but the images have {c} channels")
    m, s = np.broadcast_to(m, (c,)), np.broadcast_to(s, (c,))
    scale = np.ascontiguousarray(1.0 / (255.0 * s), dtype=np.float32)
    bias = np.ascontiguousarray(-m / s, dtype=np.float32)
    oy = np.ascontiguousarray(oy, dtype=np.int64).reshape(-1)
    ox = np.ascontiguousarray(ox, dtype=np.int64).reshape(-1)
    flip = np.ascontiguousarray(flip, dtype=np.bool_).reshape(-1)
    if not len(oy) == len(ox) == len(flip) == n:
        raise ArgumentError(f"need one crop offset and flip per image ({n}), got {len(oy)}, {len(ox)}, {len(flip)}")
    if n and (oy.min() < 0 or ox.min() < 0 or oy.max() > h + 2 * pad - oh or ox.max() > w + 2 * pad - ow):
        raise ArgumentError("crop offsets fall outside the padded image")
    if out is None:
        out = np.empty((n, c, oh, ow), dtype=np.float32)
    elif out.shape != (n, c, oh, ow) or out.dtype != np.float32:
        raise ArgumentError(f"out must be float32 {(n, c, oh, ow)}, got {out.dtype} {out.shape}")
    _crop_flip_normalize(np.ascontiguousarray(a), oy, ox, flip, pad, oh, ow, scale, bias, out)
    return out


@dataclass(frozen=True)
class AugmentParams:
    """The random draws for one batch: crop offsets in the padded image, and which samples are mirrored."""

    oy: np.ndarray
    ox: np.ndarray
    flip: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        return {"oy": self.oy.tolist(), "ox": self.ox.tolist(), "flip": self.flip.tolist()}


def _split_batch(batch: Any, who: str) -> tuple[np.ndarray, Callable[[np.ndarray], Any]]:
    """The images of a ``(images, labels, ...)`` batch and a function that puts new images back."""
    if not isinstance(batch, (tuple, list)) or not batch:
        raise ArgumentError(f"{who} needs a batch (images, labels, ...), got {type(batch).__name__}")
    images = np.asarray(batch[0])
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ArgumentError(f"{who} needs uint8 images shaped N x H x W x C, got {images.dtype} {images.shape}")

    def rebuild(new: np.ndarray) -> Any:
        rest = list(batch[1:])
        return (new, *rest) if isinstance(batch, tuple) else [new, *rest]

    return images, rebuild


class CifarTrainTransform:
    """The standard CIFAR-10 training augmentation as a loader ``batch_transform``: ``(batch, seed) -> batch``.

    Random crop ``size`` after zero padding ``padding``, horizontal flip with probability ``flip_p``,
    normalize by ``mean``/``std``, HWC uint8 -> CHW float32. Same seed, same batch -> same output.

    Args:
        size: side of the random crop.
        padding: zeros added on each side before cropping.
        flip_p: probability of a horizontal flip.
        mean: per-channel mean, subtracted after scaling to [0, 1].
        std: per-channel standard deviation, divided by.
    """

    def __init__(self, size: int = 32, padding: int = 4, flip_p: float = 0.5,
                 mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD) -> None:
        if size <= 0 or padding < 0 or not 0.0 <= flip_p <= 1.0:
            raise ArgumentError(f"need size > 0, padding >= 0 and 0 <= flip_p <= 1, got {size}, {padding}, {flip_p}")
        self.size, self.padding, self.flip_p = int(size), int(padding), float(flip_p)
        self.mean, self.std = (tuple(float(v) for v in x) for x in _mean_std(mean, std))

    def params(self, n: int, height: int, width: int, seed: int | None) -> AugmentParams:
        """Draw the batch's crop offsets and flips, vectorised, from ``default_rng(seed)``."""
        span_y = height + 2 * self.padding - self.size + 1
        span_x = width + 2 * self.padding - self.size + 1
        if span_y <= 0 or span_x <= 0:
            raise ArgumentError(f"crop {self.size} does not fit {height}x{width} images padded by {self.padding}")
        rng = np.random.default_rng(check_int("seed", seed, ge=0, optional=True))
        return AugmentParams(oy=rng.integers(0, span_y, n), ox=rng.integers(0, span_x, n),
                             flip=rng.random(n) < self.flip_p)

    def __call__(self, batch: Any, seed: int | None = None) -> Any:
        images, rebuild = _split_batch(batch, "CifarTrainTransform")
        n, h, w, _ = images.shape
        p = self.params(n, h, w, seed)
        return rebuild(crop_flip_normalize(images, p.oy, p.ox, p.flip, size=self.size, padding=self.padding,
                                           mean=self.mean, std=self.std))

    def __repr__(self) -> str:
        return f"CifarTrainTransform(size={self.size}, padding={self.padding}, flip_p={self.flip_p})"


class NormalizeBatch:
    """A loader ``batch_transform``: normalize by ``mean``/``std`` and HWC uint8 -> CHW float32, in one pass.

    The per-batch end of the ImageNet recipe (``RandomResizedCrop`` and a flip per sample, this per
    batch); ``seed`` is ignored.

    Args:
        mean: per-channel mean of pixels scaled to [0, 1].
        std: per-channel standard deviation, likewise.
    """

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> None:
        self.mean, self.std = (tuple(float(v) for v in x) for x in _mean_std(mean, std))

    def __call__(self, batch: Any, seed: int | None = None) -> Any:
        images, rebuild = _split_batch(batch, type(self).__name__)
        n, h, w, c = images.shape
        m, s = _mean_std(self.mean, self.std)
        if m.size not in (1, c):
            raise ArgumentError(f"mean/std have {m.size} values but the images have {c} channels")
        m, s = np.broadcast_to(m, (c,)), np.broadcast_to(s, (c,))
        scale = np.ascontiguousarray(1.0 / (255.0 * s), dtype=np.float32)
        bias = np.ascontiguousarray(-m / s, dtype=np.float32)
        out = np.empty((n, c, h, w), dtype=np.float32)
        _normalize_to_chw(np.ascontiguousarray(images), scale, bias, out)
        return rebuild(out)

    def __repr__(self) -> str:
        return f"NormalizeBatch(mean={list(self.mean)}, std={list(self.std)})"


class CifarEvalTransform:
    """Evaluation counterpart: normalize and HWC uint8 -> CHW float32 only (``seed`` is ignored).

    Args:
        mean: per-channel mean of the training set, subtracted after scaling to [0, 1].
        std: per-channel standard deviation, divided by.
    """

    def __init__(self, mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD) -> None:
        self.mean, self.std = (tuple(float(v) for v in x) for x in _mean_std(mean, std))

    def __call__(self, batch: Any, seed: int | None = None) -> Any:
        images, rebuild = _split_batch(batch, "CifarEvalTransform")
        n, h, w, _ = images.shape
        zeros = np.zeros(n, dtype=np.int64)
        return rebuild(crop_flip_normalize(images, zeros, zeros, zeros.astype(np.bool_), size=(h, w), padding=0,
                                           mean=self.mean, std=self.std))

    def __repr__(self) -> str:
        return "CifarEvalTransform()"
