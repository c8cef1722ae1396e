"""Decode only as much of an encoded image as a crop to a given output size needs.

A crop to 224 x 224 of a 4000 x 3000 photograph needs a fraction of its pixels at full resolution.
libjpeg-turbo can run its inverse DCT at 1/2, 1/4 or 1/8 of the image's size for far less work
(the 8 x 8 block transform becomes 4 x 4, 2 x 2 or its DC term alone), and colour conversion and
upsampling then touch 4, 16 or 64 times fewer pixels. The rule used here:

    the DCT scale is the largest s in (8, 4, 2, 1) with crop_height >= s * out_height and
    crop_width >= s * out_width,

that is: the crop, at 1/s of its size, still holds at least the output's pixels in both directions,
so the one resize that follows (``_resize``: Pillow's antialiased bilinear arithmetic, torchvision's
on PIL images) never has to invent detail. At s = 1 the result is torchvision's within one level a
pixel (the same libjpeg-turbo decode, the same crop, Pillow's resize arithmetic); at s > 1 the DCT's
own low-pass replaces the first part of the resize's, which the tests bound.

Three bindings decode. ``libjpeg`` (the default where built): the project's own extension
(``jpeg_region``) decodes the crop's rectangle alone, plus the few pixels the resize's filter
reads around it: columns outside it are not transformed and rows below it not even entropy-decoded;
only the rows above it are still entropy-decoded (a JPEG's Huffman stream cannot be entered in the
middle). Its pixels equal a whole decode's cropped, so the output equals the ``simplejpeg`` path's
bit for bit. simplejpeg (libjpeg-turbo inside its wheel) decodes whole images at the DCT scale:
the fallback where the extension is not built, and the fastest whole-file binding measured (see
``bench/studies/how_fast_do_jpegs_decode_to_224``). Pillow's ``draft`` is used where neither can turn
the JPEG into RGB (CMYK, YCCK) or simplejpeg is missing.
Other formats (PNG, ...) are decoded whole by Pillow and cropped after.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from ..errors import ArgumentError, CorruptImageError, DataError
from . import jpeg_region
from ._images import _ADDRESS, decode_image
from ._resize import resize_box

DCT_SCALES = (8, 4, 2, 1)
BACKENDS = ("auto", "libjpeg", "simplejpeg", "pillow")
_SIMPLEJPEG: Any = None
_SIMPLEJPEG_TRIED = False
_RGB_SPACES = ("YCbCr", "Gray", "RGB")


def simplejpeg_module() -> Any:
    """The simplejpeg module, or None when it is not installed (imported once per process)."""
    global _SIMPLEJPEG, _SIMPLEJPEG_TRIED
    if not _SIMPLEJPEG_TRIED:
        try:
            import simplejpeg  # type: ignore[import-untyped]  # noqa: PLC0415 - optional, on first use
        except ImportError:
            simplejpeg = None
        _SIMPLEJPEG, _SIMPLEJPEG_TRIED = simplejpeg, True
    return _SIMPLEJPEG


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ArgumentError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend in ("simplejpeg", "libjpeg") and simplejpeg_module() is None:
        raise ArgumentError(f"backend={backend!r} needs simplejpeg: pip install simplejpeg")
    if backend == "libjpeg" and not jpeg_region.available():
        raise ArgumentError("backend='libjpeg' needs cupy_nwt's libjpeg-turbo extension, which is not built here "
                            "(install libjpeg62-turbo-dev or libjpeg-turbo8-dev, then reinstall cupy-nwt)")
    return backend


def is_jpeg(data: bytes | memoryview) -> bool:
    return bytes(data[:3]) == b"\xff\xd8\xff"


def dct_scale(crop_h: int, crop_w: int, out_h: int, out_w: int) -> int:
    """The largest s in (8, 4, 2, 1) whose 1/s-scaled crop still holds ``out_h`` x ``out_w`` pixels."""
    for s in DCT_SCALES:
        if crop_h >= s * out_h and crop_w >= s * out_w:
            return s
    return 1


def _pillow_bomb() -> type[Exception]:
    from PIL import Image  # noqa: PLC0415 - Pillow is imported where it decodes

    return Image.DecompressionBombError


def _refuse_bomb(height: int, width: int, name: str, sample_index: int | None) -> None:
    """Refuse, before any decoder allocates for it, a size Pillow (so torchvision) refuses at open: over twice
    ``PIL.Image.MAX_IMAGE_PIXELS`` (None: no limit). A few hundred bytes can declare 65500 x 65500, and
    simplejpeg set up 12 GiB for such a progressive file before failing."""
    from PIL import Image  # noqa: PLC0415

    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and height * width > 2 * limit:
        raise CorruptImageError(f"{name}: not a decodable image (its header declares {width} x {height}, "
                                f"{height * width:,} pixels, over Pillow's limit of {2 * limit:,}: a decompression "
                                "bomb, or raise PIL.Image.MAX_IMAGE_PIXELS)", sample_index)


def _corrupt(name: str, sample_index: int | None, exc: BaseException) -> CorruptImageError:
    reason = " ".join(_ADDRESS.sub("", str(exc)).split()) or type(exc).__name__
    return CorruptImageError(f"{name}: not a decodable image ({reason})", sample_index)


class EncodedImage:
    """One encoded image, opened far enough to know its size; ``region`` decodes a crop of it.

    Args:
        data: the file's bytes.
        name: the file or archive member, for errors.
        sample_index: the dataset index, for errors (None where there is none).
        backend: ``"auto"`` (the extension where built, else simplejpeg, else Pillow), ``"libjpeg"``,
            ``"simplejpeg"`` or ``"pillow"``.
    """

    def __init__(self, data: bytes | memoryview, name: str, sample_index: int | None = None,
                 backend: str = "auto") -> None:
        self.data, self.name, self.sample_index = data, name, sample_index
        self.backend = "other"
        self._pil: Any = None
        self._array: np.ndarray | None = None
        sj = simplejpeg_module() if backend != "pillow" else None
        if is_jpeg(data) and sj is not None:
            try:
                h, w, space, _ = sj.decode_jpeg_header(data)
            except ValueError:
                space = None  # Pillow's verdict, below
            if space in _RGB_SPACES:
                _refuse_bomb(int(h), int(w), name, sample_index)
                region = backend != "simplejpeg" and jpeg_region.available()
                self.backend, self.height, self.width = "libjpeg" if region else "simplejpeg", int(h), int(w)
                return
        if is_jpeg(data):
            try:
                self._open_with_pillow()
            except (OSError, SyntaxError, ValueError, _pillow_bomb()) as exc:
                raise _corrupt(name, sample_index, exc) from exc
            return
        self._array = decode_image(data, name, sample_index)
        self.height, self.width = self._array.shape[:2]

    def _open_with_pillow(self) -> None:
        from PIL import Image  # noqa: PLC0415 - UnidentifiedImageError is an OSError

        self._pil = Image.open(io.BytesIO(self.data))
        self.backend = "pillow"
        self.width, self.height = self._pil.size

    def region(self, box: tuple[int, int, int, int], out_h: int, out_w: int, flip: bool = False,
               normalize: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """The crop ``box`` = (top, left, height, width) resized to ``out_h`` x ``out_w``: uint8 HWC RGB,
        mirrored if ``flip``; float32 CHW ``pixel * scale + bias`` with ``normalize=(scale, bias)``."""
        top, left, h, w = box
        if not (0 <= top and 0 <= left and 0 < h and 0 < w and top + h <= self.height and left + w <= self.width):
            raise ArgumentError(f"crop box {box} does not lie inside the {self.height}x{self.width} image {self.name}")
        s = dct_scale(h, w, out_h, out_w) if self.backend != "other" else 1
        try:
            if self.backend == "libjpeg":
                return self._region(box, s, out_h, out_w, flip, normalize)
            img = self._decoded(s)
        except (OSError, SyntaxError, ValueError) as exc:
            if self.backend not in ("libjpeg", "simplejpeg"):
                raise _corrupt(self.name, self.sample_index, exc) from exc
            # simplejpeg refuses what libjpeg only warns about ("extraneous bytes before marker"),
            # which Pillow, and so torchvision, decodes: the same file gets Pillow's verdict here
            try:
                self._open_with_pillow()
                img = self._decoded(s)
            except (OSError, SyntaxError, ValueError, _pillow_bomb()) as again:
                raise _corrupt(self.name, self.sample_index, again) from exc
        return resize_box(img, (top / s, left / s, h / s, w / s), out_h, out_w, flip, normalize)

    def _region(self, box: tuple[int, int, int, int], s: int, out_h: int, out_w: int, flip: bool,
                normalize: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        """The crop through the extension: its rectangle at 1/s, widened by the pixels the resize's
        filter reads beyond a fractional box (its support, plus one), so the output is the whole decode's."""
        top, left, h, w = (v / s for v in box)
        sh, sw = jpeg_region.scaled_size(self.height, self.width, s)
        margin = 0 if s == 1 else math.ceil(max(h / out_h, w / out_w, 1.0)) + 1
        r0, c0 = max(int(top) - margin, 0), max(int(left) - margin, 0)
        r1, c1 = min(math.ceil(top + h) + margin, sh), min(math.ceil(left + w) + margin, sw)
        img = jpeg_region.decode_region(self.data, (r0, c0, r1 - r0, c1 - c0), s)
        return resize_box(img, (top - r0, left - c0, h, w), out_h, out_w, flip, normalize)

    def _decoded(self, s: int) -> np.ndarray:
        """The whole image at 1/s of its size: uint8 H x W x 3."""
        if self.backend == "simplejpeg":
            sh, sw = -(-self.height // s), -(-self.width // s)
            a = simplejpeg_module().decode_jpeg(self.data, colorspace="RGB", min_height=sh, min_width=sw)
            if a.shape[:2] != (sh, sw):  # simplejpeg chose another factor: never expected, refused loudly
                raise DataError(f"decoded at {a.shape[:2]}, not at the 1/{s} scale {sh}x{sw}")
            return a
        if self.backend == "pillow":
            im = self._pil
            if s > 1:
                im.draft("RGB", (self.width // s, self.height // s))  # Pillow picks the largest s that fits
                if im.size != (-(-self.width // s), -(-self.height // s)):
                    raise DataError(f"Pillow's draft gave {im.size}, not the 1/{s} scale")
            im.load()
            return np.asarray(im if im.mode == "RGB" else im.convert("RGB"))
        assert self._array is not None
        return self._array

    def close(self) -> None:
        if self._pil is not None:
            self._pil.close()
            self._pil = None
