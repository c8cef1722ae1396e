"""JPEG samples as their encoded bytes, with the crop and flip already drawn: what workers make for GPU decoding.

A worker that hands the GPU encoded bytes does almost nothing per image: read the file, read its size
from the JPEG header, draw the crop box and the flip, copy the bytes into a fixed-width row. That row
(``jpeg``, zero-padded to ``max_bytes``) and its true length (``nbytes``) travel through the loader's
shared-memory ring like any array, so a batch is one ``N x max_bytes`` uint8 array that
``GpuJpegDecoder`` decodes in one call.

The draws depend only on ``(seed, epoch, index)``, never on which worker or process made the sample,
so batches are the same at any worker count. A file that is not a JPEG, or is cut short (no
end-of-image marker after its scan), fails here, in the worker, with the one-line
``CorruptImageError`` that names it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ArgumentError, CorruptImageError, DataError
from ._images import index_in
from .crops import random_resized_crop_box

# Start-of-frame markers (baseline, extended, progressive, lossless; Huffman or arithmetic): they hold the size.
_SOF = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))
_NO_LENGTH = frozenset((0x01, *range(0xD0, 0xD9)))  # TEM, RST0-7, SOI: markers without a segment

Box = tuple[int, int, int, int]
BoxSampler = Callable[[int, int, Any], Box]
_M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """splitmix64's finaliser: every input bit reaches every output bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


class SampleRng:
    """The random draws of one sample: a splitmix64 stream keyed by ``(seed, epoch, index)``.

    It has the three methods of ``np.random.Generator`` a crop needs (``random``, ``uniform``,
    ``integers``) at about a microsecond a draw, where creating a NumPy generator per sample costs
    tens of microseconds: a reader that only reads files would spend a third of its time on it.
    """

    def __init__(self, seed: int, epoch: int, index: int) -> None:
        self._state = _mix64(_mix64(_mix64(seed & _M64) ^ (epoch & _M64)) ^ (index & _M64))

    def _next(self) -> int:
        self._state = (self._state + 0x9E3779B97F4A7C15) & _M64
        return _mix64(self._state)

    def random(self) -> float:
        """A float in [0, 1) with 53 random bits."""
        return (self._next() >> 11) * (1.0 / (1 << 53))

    def uniform(self, low: float = 0.0, high: float = 1.0) -> float:
        return low + (high - low) * self.random()

    def integers(self, low: int, high: int | None = None) -> int:
        """An int in [low, high) (or [0, low) with one argument), by multiply-shift of 64 random bits."""
        if high is None:
            low, high = 0, low
        if high <= low:
            raise ArgumentError(f"integers needs low < high, got {low} and {high}")
        return low + ((self._next() * (high - low)) >> 64)


def jpeg_size(data: bytes | memoryview | np.ndarray, name: str = "image", sample_index: Any = None) -> tuple[int, int]:
    """``(height, width)`` from a JPEG's frame header; ``CorruptImageError`` naming ``name`` if it is no JPEG or cut short.

    Only markers are walked (no pixel is decoded). A JPEG must start with SOI, give its size in a
    start-of-frame segment before its first scan, and end with an EOI marker after that scan:
    a file cut short loses its EOI, which a decoder would otherwise meet only half-way (and
    nvImageCodec would fill in the rest of the image without a word).

    Args:
        data: the file's bytes, as read.
        name: the file or tar member the error names.
        sample_index: the sample the error names (None: not part of a dataset).
    """
    b = data if isinstance(data, bytes) else bytes(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data)
    size = jpeg_header(b)
    if isinstance(size, str):
        raise CorruptImageError(f"{name}: not a decodable JPEG ({size}, {len(b)} bytes)", sample_index)
    return size


def jpeg_header(b: bytes) -> tuple[int, int] | str:
    """``jpeg_size``'s walk over the markers of ``b``: ``(height, width)``, or why ``b`` is not a whole JPEG."""
    n = len(b)
    if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
        return "no JPEG start-of-image marker"
    pos, size = 2, None
    while True:
        while pos < n and b[pos] != 0xFF:
            pos += 1  # stray bytes between segments: libjpeg skips them too
        while pos < n and b[pos] == 0xFF:
            pos += 1  # fill bytes
        if pos >= n:
            return "cut short before its image data"
        marker = b[pos]
        pos += 1
        if marker in _NO_LENGTH:
            continue
        if pos + 2 > n:
            return "cut short inside a header segment"
        length = (b[pos] << 8) | b[pos + 1]
        if length < 2 or pos + length > n:
            return f"cut short: a header segment of {length} bytes runs past the end"
        if marker in _SOF:
            if length < 8:
                return "a frame header too short to hold the image size"
            size = ((b[pos + 3] << 8) | b[pos + 4], (b[pos + 5] << 8) | b[pos + 6])
        elif marker == 0xDA:  # start of scan: the entropy-coded data follows
            break
        elif marker == 0xD9:
            return "end-of-image marker before any image data"
        pos += length
    if size is None or size[0] == 0 or size[1] == 0:
        return "no image size before its image data" if size is None else f"a frame of {size[0]}x{size[1]} pixels"
    if b.rfind(b"\xff\xd9", pos) < 0:
        return "cut short: no end-of-image marker after its image data"
    return size


def _center_crop_box(height: int, width: int, fraction: float = 224 / 256) -> Box:
    """The centred square of side ``fraction`` x the shorter side: ``Resize(256)`` + ``CenterCrop(224)``'s region."""
    side = max(1, int(round(min(height, width) * fraction)))
    return (height - side) // 2, (width - side) // 2, side, side


class EncodedJpegs:
    """A map-style dataset of JPEG samples as padded encoded bytes plus their crop box and flip, for ``GpuJpegDecoder``.

    Each sample is a dict: ``jpeg`` (``max_bytes`` uint8, the file's bytes then zeros), ``nbytes``
    (int64), ``box`` (int64 ``top, left, height, width`` in the image), ``flip`` (bool), ``index``
    (the sample's index, so an error can name its file) and ``label`` (int64; -1 if the source has none).

    Args:
        source: where the bytes come from: an ``ImageFolder`` (``path(i)``), a ``TarImageDataset``
            (``read_bytes(i)``), or any sized object with one of those two methods; its ``labels``
            and ``sample_source`` are used when it has them.
        max_bytes: the width of a row: a file larger than this is a ``DataError`` naming it. The
            ring holds ``batch_size x max_bytes`` per slot, so keep it near the largest file.
        crop: ``"random-resized"`` (torchvision's ``RandomResizedCrop`` with ``scale`` and ``ratio``),
            ``"center"`` (the centred square of 224/256 of the shorter side), ``"full"`` (the whole image), or a callable
            ``(height, width, rng) -> (top, left, h, w)``, or an object with that as its ``box`` method (a crop
            transform that also serves the CPU path); ``rng`` is a ``SampleRng`` (``random``, ``uniform`` and
            ``integers``, as on ``np.random.Generator``).
        flip_p: the probability of a horizontal flip.
        scale: ``RandomResizedCrop``'s range of the crop's area (with ``crop="random-resized"``).
        ratio: ``RandomResizedCrop``'s range of the crop's aspect ratio (with ``crop="random-resized"``).
        seed: the draws' seed (with the epoch and the index); None draws one now, shared by every worker.
    """

    def __init__(self, source: Any, max_bytes: int = 256 * 1024, crop: str | BoxSampler | Any = "random-resized",
                 flip_p: float = 0.5, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), seed: int | None = None) -> None:
        if not (hasattr(source, "read_bytes") or hasattr(source, "path")) or not hasattr(source, "__len__"):
            raise ArgumentError(f"EncodedJpegs needs a sized source with read_bytes(i) or path(i) (an ImageFolder or a "
                                f"TarImageDataset), got {type(source).__name__}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 4:
            raise ArgumentError(f"max_bytes must be an int >= 4, got {max_bytes!r}")
        if not (isinstance(crop, str) and crop in ("random-resized", "center", "full")) and not callable(crop) \
                and not callable(getattr(crop, "box", None)):
            raise ArgumentError(f"crop must be 'random-resized', 'center', 'full', a callable or an object with a "
                                f"box(height, width, rng) method, got {crop!r}")
        if not 0.0 <= float(flip_p) <= 1.0:
            raise ArgumentError(f"flip_p must be in [0, 1], got {flip_p!r}")
        if not (0 < scale[0] <= scale[1] <= 1.0) or not (0 < ratio[0] <= ratio[1]):
            raise ArgumentError(f"scale must satisfy 0 < lo <= hi <= 1 and ratio 0 < lo <= hi, got {scale} and {ratio}")
        self.source, self.max_bytes, self.crop, self.flip_p = source, max_bytes, crop, float(flip_p)
        self.scale, self.ratio = (float(scale[0]), float(scale[1])), (float(ratio[0]), float(ratio[1]))
        self.seed = int(np.random.SeedSequence().generate_state(2, np.uint64)[0] >> np.uint64(1)) if seed is None else int(seed)
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.source)

    def set_epoch(self, epoch: int) -> None:
        """New draws each epoch (the loader calls this on every worker's copy)."""
        self.epoch = int(epoch)

    def sample_source(self, i: int) -> str:
        """The file or archive member of sample ``i``, as the source names it."""
        named = getattr(self.source, "sample_source", None)
        return str(named(i)) if named is not None else f"sample {index_in(i, len(self))}"

    def read_bytes(self, i: int) -> bytes:
        read = getattr(self.source, "read_bytes", None)
        return read(i) if read is not None else self.source.path(i).read_bytes()

    def box(self, height: int, width: int, rng: Any) -> Box:
        if self.crop == "random-resized":
            return random_resized_crop_box(height, width, rng, self.scale, self.ratio)
        if self.crop == "center":
            return _center_crop_box(height, width)
        if self.crop == "full":
            return 0, 0, height, width
        crop: Any = self.crop
        draw = crop.box if callable(getattr(crop, "box", None)) else crop
        top, left, h, w = (int(v) for v in draw(height, width, rng))
        if h < 1 or w < 1 or top < 0 or left < 0 or top + h > height or left + w > width:
            raise ArgumentError(f"crop gave box {(top, left, h, w)}, not inside the {height}x{width} image")
        return top, left, h, w

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = index_in(i, len(self))
        data = self.read_bytes(i)
        if len(data) > self.max_bytes:
            raise DataError(f"{self.sample_source(i)} (sample {i}): {len(data)} bytes, more than "
                            f"max_bytes={self.max_bytes}; raise EncodedJpegs' max_bytes")
        size = jpeg_header(data)
        if isinstance(size, str):
            raise CorruptImageError(f"{self.sample_source(i)} (sample {i}): not a decodable JPEG ({size}, "
                                    f"{len(data)} bytes)", i)
        height, width = size
        rng = SampleRng(self.seed, self.epoch, i)
        box = self.box(height, width, rng)
        flip = bool(rng.random() < self.flip_p)
        row = np.zeros(self.max_bytes, np.uint8)  # calloc'd: the padding costs no pass of its own
        row[:len(data)] = np.frombuffer(data, np.uint8)
        labels = getattr(self.source, "labels", None)
        return {"jpeg": row, "nbytes": np.int64(len(data)), "box": np.asarray(box, np.int64), "flip": np.bool_(flip),
                "index": np.int64(i), "label": np.int64(labels[i] if labels is not None else -1)}

    def __repr__(self) -> str:
        return f"EncodedJpegs({self.source!r}, max_bytes={self.max_bytes}, crop={self.crop!r}, flip_p={self.flip_p})"
