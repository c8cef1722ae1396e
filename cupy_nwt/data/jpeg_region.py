"""A JPEG's rectangle at a DCT scale, through libjpeg-turbo's partial-decode calls (an optional extension).

simplejpeg and Pillow decode whole files: a crop of a photograph pays for the entropy decoding of
every row and the inverse DCT of every column. The extension ``_libjpeg_region`` (C, built by
``pip install`` where the libjpeg-turbo headers are: ``libjpeg62-turbo-dev`` or
``libjpeg-turbo8-dev``) asks libjpeg-turbo for the rectangle alone: ``jpeg_crop_scanline`` leaves the
iMCU columns outside it untransformed, ``jpeg_skip_scanlines`` passes the rows above it without the
IDCT, and ``jpeg_abort_decompress`` stops after its last row, so the rows below are never decoded.
The pixels equal a whole decode's, cropped (a margin each side is decoded, one chroma sample wide on
the right, so that fancy upsampling sees the same neighbours; tested against simplejpeg's whole
decode, bit for bit, down to one-column crops at every column).

A file that does not end in the EOI marker (truncated, or with bytes after it) is read to its end,
so truncation is still an error. Damage inside the rows below a crop is not looked at, as in any
region-of-interest decoder: the image is only as damaged as the rows its crops keep.

Where the extension is not built, or ``CUPY_NWT_NO_LIBJPEG_REGION=1`` is set (the public seam for
testing and comparing the fallback), ``available()`` is False and the crops decode with simplejpeg,
said once at the ``info`` level of the ``cupy_nwt.data`` logger.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

import numpy as np

from .._checks import check_int
from ..errors import ArgumentError

ENV_DISABLE = "CUPY_NWT_NO_LIBJPEG_REGION"
_log = logging.getLogger("cupy_nwt.data")
_MODULE: ModuleType | None = None
_TRIED = False


def _module() -> ModuleType | None:
    global _MODULE, _TRIED
    if not _TRIED:
        _TRIED = True
        if os.environ.get(ENV_DISABLE, "") not in ("", "0"):
            _log.info("cupy_nwt: %s is set; JPEG crops decode with simplejpeg (every row entropy-decoded)",
                      ENV_DISABLE)
        else:
            try:
                _MODULE = importlib.import_module("._libjpeg_region", __package__)
            except ImportError as exc:
                _log.info("cupy_nwt: the libjpeg-turbo region decoder is not built (%s); JPEG crops decode "
                          "with simplejpeg (every row entropy-decoded). Install libjpeg62-turbo-dev or "
                          "libjpeg-turbo8-dev, then reinstall cupy-nwt, to build it.", exc)
    return _MODULE


def available() -> bool:
    """Whether the extension is built, importable and not switched off by ``CUPY_NWT_NO_LIBJPEG_REGION``."""
    return _module() is not None


def libjpeg_turbo_version() -> str | None:
    """The libjpeg-turbo version the extension was built against, or None without it."""
    m = _module()
    return None if m is None else str(m.LIBJPEG_TURBO_VERSION)


def scaled_size(height: int, width: int, scale: int) -> tuple[int, int]:
    """The image's size when decoded at 1/``scale``: libjpeg rounds up."""
    return -(-height // scale), -(-width // scale)


def decode_region(data: bytes | memoryview, box: tuple[int, int, int, int], scale: int = 1) -> np.ndarray:
    """Rows ``top..top+height`` and columns ``left..left+width`` of the JPEG decoded at 1/``scale``.

    The box is in the scaled image's pixels. Raises ``ValueError`` (libjpeg's message) for any
    error or warning libjpeg reports, and ``ArgumentError`` without the extension or for a bad box.

    Args:
        data: the encoded JPEG.
        box: ``(top, left, height, width)`` in the 1/``scale`` image.
        scale: the DCT scale's denominator: 1, 2, 4 or 8.

    Returns:
        uint8 height x width x 3, RGB.
    """
    m = _module()
    if m is None:
        raise ArgumentError("the libjpeg-turbo region decoder is not available (see cupy_nwt.data.jpeg_region)")
    if scale not in (1, 2, 4, 8):
        raise ArgumentError(f"scale must be 1, 2, 4 or 8, got {scale!r}")
    top, left, height, width = (check_int(n, v, ge=lo) for n, v, lo in
                                zip(("top", "left", "height", "width"), box, (0, 0, 1, 1), strict=True))
    out = np.empty((height, width, 3), np.uint8)
    m.decode_region(data, scale, top, left, height, width, out)
    return out
