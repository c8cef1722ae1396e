"""Images: decoding (with errors that name the file), fast PNG encoding, and the base of image datasets.

A file that does not decode is a ``CorruptImageError`` (``cupy_nwt.errors``, like every error here): one
of the errors that mean "the data is bad", as opposed to bad arguments, which ``cupy-nwt`` gives their
own exit code.
"""

from __future__ import annotations

import io
import operator
import re
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._checks import check_callable
from ..errors import ArgumentError, ArgumentTypeError, CorruptImageError, OutOfRangeError

#: the file endings ``ImageFolder`` reads by default: torchvision's, plus ``.gif``
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp")

Transform = Callable[[np.ndarray], Any]

#: the first bytes of a macOS AppleDouble file (``._photo.jpg``: the metadata macOS writes beside a file on
#: a disk or in an archive that cannot hold it); named like an image, never one
APPLE_DOUBLE_MAGIC = b"\x00\x05\x16\x07"


def is_apple_double(name: str, read_head: Callable[[], bytes]) -> bool:
    """Whether ``name`` is macOS metadata rather than an image: a ``._`` name whose first bytes say so.

    Args:
        name: the file or member name (a path; its last part is judged).
        read_head: reads the first bytes (at least 4); called only for a ``._`` name.
    """
    return name.rstrip("/").rpartition("/")[2].startswith("._") and read_head()[:4] == APPLE_DOUBLE_MAGIC


_ADDRESS = re.compile(r" <[^<>]* at 0x[0-9a-fA-F]+>")


def decode_image(data: bytes | memoryview, name: str, sample_index: int | None = None) -> np.ndarray:
    """Decode PNG/JPEG/... bytes to a writable uint8 HWC RGB array; ``name`` goes into the error.

    Args:
        data: the encoded bytes.
        name: the file or archive member, named by a ``CorruptImageError``.
        sample_index: the dataset index, kept on the error.
    """
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415 - Pillow import is slow-ish

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            rgb = img if img.mode == "RGB" else img.convert("RGB")
            return np.array(rgb, dtype=np.uint8)
    except UnidentifiedImageError as exc:
        raise CorruptImageError(f"{name}: not a decodable image (no known image format in its "
                                f"{len(data)} bytes)", sample_index) from exc
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        # Pillow's messages may name its in-memory buffer ("<_io.BytesIO object at 0x...>"): noise here
        reason = _ADDRESS.sub("", str(exc)) or type(exc).__name__
        raise CorruptImageError(f"{name}: not a decodable image ({reason})", sample_index) from exc


def index_in(i: Any, n: int) -> int:
    """``i`` as an index into ``n`` samples (negative counts from the end), else ``OutOfRangeError`` (an
    ``IndexError``) or ``ArgumentTypeError`` (a ``TypeError``) naming the index as the caller gave it."""
    try:
        k = operator.index(i)
    except TypeError:
        raise ArgumentTypeError(f"a dataset index must be an integer, got {i!r}") from None
    if not -n <= k < n:
        raise OutOfRangeError(f"index {k} out of range for a dataset of {n} samples")
    return k + n if k < 0 else k


def transformed_image(data: bytes | memoryview, name: str, sample_index: int | None,
                      transform: Transform | None) -> Any:
    """Decode and transform one sample: a transform with ``from_bytes`` (a crop that tells the decoder its
    region, a ``Compose`` starting with one) gets the encoded bytes, any other the decoded pixels. A class
    given as the transform is only called: its ``from_bytes`` (``int.from_bytes``) is no such method."""
    from_bytes = None if isinstance(transform, type) else getattr(transform, "from_bytes", None)
    if callable(from_bytes):
        return from_bytes(data, name, sample_index)
    img = decode_image(data, name, sample_index)
    return img if transform is None else transform(img)


class ImageDataset:
    """Shared by the image-decoding datasets: ``__getitems__`` is a loop over ``__getitem__``."""

    _transform: Transform | None = None

    @property
    def transform(self) -> Transform | None:
        """Applied to each decoded image; checked when set, so ``transform=5`` fails here, not in a worker."""
        return self._transform

    @transform.setter
    def transform(self, transform: Transform | None) -> None:
        check_callable("transform", transform, optional=True)
        self._transform = transform

    def _encoded(self, i: int) -> tuple[bytes, str]:
        """Sample ``i``'s encoded bytes and the name errors give it (its file or archive member)."""
        raise NotImplementedError

    def _image(self, i: int) -> np.ndarray:
        data, name = self._encoded(i)
        return decode_image(data, name, i)

    def _label(self, i: int) -> int:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def sample_source(self, i: int) -> str:
        """Where sample ``i`` comes from, for error messages (a file, an archive member)."""
        return f"sample {index_in(i, len(self))}"

    def __getitem__(self, i: int) -> tuple[Any, int]:
        i = index_in(i, len(self))
        data, name = self._encoded(i)
        return transformed_image(data, name, i, self.transform), self._label(i)

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, int]]:
        return [self[i] for i in indices]


# --- encoding ----------------------------------------------------------------------------------


def encode_png_batch(images: np.ndarray) -> list[bytes]:
    """Valid PNGs of N same-shaped uint8 images (N x H x W, or N x H x W x C with C in 1, 3, 4).

    Pillow spends most of a 32x32 encode in per-call overhead and filter search, which would make
    building 50 000 images take tens of seconds. Here the PNG "Sub" filter runs vectorised over the
    whole batch (so a decoder still has to un-filter), and each image is deflated with Huffman
    coding only (no LZ77 match search: several times faster to encode, about as small for noisy
    pixels, and a decoder still has to inflate it).

    Args:
        images: N same-shaped uint8 images, N x H x W or N x H x W x C.
    """
    a = np.asarray(images)
    if a.dtype != np.uint8:
        raise ArgumentError(f"PNG encoding needs uint8 pixels, got {a.dtype}")
    if a.ndim == 3:
        a = a[..., None]
    if a.ndim != 4 or a.shape[3] not in (1, 3, 4) or 0 in a.shape[1:3]:
        raise ArgumentError(f"PNG encoding needs N x H x W [x C] images with 1, 3 or 4 channels, got shape {a.shape}")
    n, h, w, c = a.shape
    rows = a.reshape(n, h, w * c)
    filtered = np.empty((n, h, w * c + 1), dtype=np.uint8)
    filtered[:, :, 0] = 1
    filtered[:, :, 1:c + 1] = rows[:, :, :c]
    np.subtract(rows[:, :, c:], rows[:, :, :-c], out=filtered[:, :, c + 1:])
    head = b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, {1: 0, 3: 2, 4: 6}[c], 0, 0, 0))
    tail = _png_chunk(b"IEND", b"")
    out = []
    for f in filtered:
        z = zlib.compressobj(1, zlib.DEFLATED, 15, 8, zlib.Z_HUFFMAN_ONLY)
        out.append(head + _png_chunk(b"IDAT", z.compress(f) + z.flush()) + tail)
    return out


def encode_png(image: np.ndarray) -> bytes:
    """A valid PNG of one uint8 HW / HWC image (see ``encode_png_batch``).

    Args:
        image: a uint8 H x W or H x W x C image.
    """
    a = np.asarray(image)
    if a.ndim not in (2, 3):
        raise ArgumentError(f"PNG encoding needs an HW or HWC image, got shape {a.shape}")
    return encode_png_batch(a[None])[0]


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(tag)))


def encode_image(image: np.ndarray, fmt: str = "png", quality: int = 90) -> bytes:
    """PNG (the fast encoder above) or JPEG (Pillow) bytes of a uint8 HWC image.

    Args:
        image: a uint8 H x W x C image.
        fmt: "png" or "jpeg".
        quality: JPEG quality (ignored for PNG).
    """
    fmt = fmt.lower()
    if fmt == "png":
        return encode_png(image)
    if fmt in ("jpeg", "jpg"):
        from PIL import Image  # noqa: PLC0415

        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(image)).save(buf, format="JPEG", quality=quality)
        return buf.getvalue()
    raise ArgumentError(f"unknown image format {fmt!r}: use 'png' or 'jpeg'")
