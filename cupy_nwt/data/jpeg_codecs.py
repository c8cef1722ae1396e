"""The JPEG decoders behind ``GpuJpegDecoder``: nvImageCodec on the GPU, Pillow on the CPU, and the one seam they share.

This is the only module that calls nvImageCodec (``nvidia.nvimgcodec``, from the ``nvidia-nvimgcodec-cu12``
or ``-cu13`` wheel). ``nvimgcodec_status()`` says whether it can be used and, if not, why, in one line.

A codec decodes a batch of encoded streams, each with its crop box, and answers per image: a
``Decoded`` (the pixels and where the crop starts inside them), or a string saying why that image
could not be decoded. It never raises for one bad image, so the stage can name exactly which
images failed and never hands out a batch with some images dropped or replaced.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import ArgumentError, CorruptImageError
from ._images import decode_image

BACKENDS = ("auto", "hardware", "cuda", "hybrid", "cpu")
ROI_MODES = ("decoder", "kernel")


@dataclass(frozen=True)
class Decoded:
    """One decoded image: HWC uint8 RGB ``pixels`` (host NumPy or device memory) and the crop's corner in them."""

    pixels: Any
    top: int
    left: int


class JpegCodec(Protocol):
    """Decodes a batch: ``streams[k]`` (uint8 bytes) cropped to ``boxes[k]`` (top, left, h, w) -> ``Decoded`` or a reason.

    ``on_device`` says where the pixels are: device memory (``__cuda_array_interface__``) or host memory
    (anything ``np.asarray`` reads). A codec may also have ``recycle(decoded)``: the stage hands back each
    batch's images once its kernel has read them.
    """

    on_device: bool

    def decode(self, streams: Sequence[np.ndarray], boxes: np.ndarray, cuda_stream: int = 0) -> list[Decoded | str]: ...


class PillowJpegCodec:
    """The CPU path: Pillow decodes each whole image; the crop is an offset into it."""

    on_device = False

    def decode(self, streams: Sequence[np.ndarray], boxes: np.ndarray, cuda_stream: int = 0) -> list[Decoded | str]:
        out: list[Decoded | str] = []
        for data, box in zip(streams, boxes):
            try:
                pixels = decode_image(np.ascontiguousarray(data).tobytes(), "image")
            except CorruptImageError as exc:
                text = str(exc).removeprefix("image: not a decodable image ")
                out.append(text[1:-1] if text.startswith("(") and text.endswith(")") else text)
                continue
            top, left, h, w = (int(v) for v in box)
            if top + h > pixels.shape[0] or left + w > pixels.shape[1]:
                out.append(f"crop box {(top, left, h, w)} is outside its {pixels.shape[0]}x{pixels.shape[1]} pixels")
                continue
            out.append(Decoded(pixels, top, left))
        return out


@functools.lru_cache(maxsize=1)
def nvimgcodec_status() -> tuple[bool, str | None]:
    """``(usable, reason)``: whether ``nvidia.nvimgcodec`` imports; the reason says why not in one line."""
    try:
        importlib.import_module("nvidia.nvimgcodec")
    except ImportError as exc:
        return False, (f"nvImageCodec is not installed ({exc}); install cupy-nwt[cuda12] or [cuda13] "
                       f"(nvidia-nvimgcodec-cu12/-cu13 with nvjpeg)")
    except Exception as exc:  # noqa: BLE001 - a broken install is one more reason, not a crash
        return False, f"nvImageCodec failed to load ({type(exc).__name__}: {exc})"
    return True, None


def _nvimgcodec() -> Any:
    return importlib.import_module("nvidia.nvimgcodec")


class NvImageCodecJpeg:
    """nvImageCodec's batched decoder: hardware JPEG engines where the GPU has them, CUDA (nvJPEG) otherwise.

    Args:
        device_id: the CUDA device to decode on (ignored with ``backend="cpu"``).
        backend: ``"auto"`` (hardware decoder first, CUDA for what it does not take), ``"hardware"``,
            ``"cuda"``, ``"hybrid"`` (Huffman decoding on the CPU, the rest on the GPU) or ``"cpu"``
            (nvImageCodec's own CPU decoder: host pixels, no GPU needed).
        roi: ``"decoder"`` hands the crop to nvImageCodec as a region of interest, so pixels outside
            it are not made; ``"kernel"`` decodes whole images and the resize kernel reads the crop
            out of them (the hardware decoder may be faster on whole images).
        max_cpu_threads: host threads nvImageCodec may use (parsing, and Huffman decoding with
            ``"hybrid"`` or ``"cpu"``).
        hardware_load: with ``"auto"``, the fraction of each batch offered to the hardware decoder
            (nvImageCodec's load hint); the rest, and whatever it cannot take, goes to the CUDA decoder,
            so both work at once.
    """

    def __init__(self, device_id: int = 0, backend: str = "auto", roi: str = "decoder", max_cpu_threads: int = 2,
                 hardware_load: float = 1.0) -> None:
        if backend not in BACKENDS:
            raise ArgumentError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if roi not in ROI_MODES:
            raise ArgumentError(f"roi must be one of {', '.join(ROI_MODES)}, got {roi!r}")
        if isinstance(hardware_load, bool) or not isinstance(hardware_load, (int, float)) or not 0 <= hardware_load <= 1:
            raise ArgumentError(f"hardware_load must be a fraction in [0, 1], got {hardware_load!r}")
        usable, reason = nvimgcodec_status()
        if not usable:
            raise ArgumentError(reason or "nvImageCodec is not usable")
        n = _nvimgcodec()
        kinds = {"auto": ("HW_GPU_ONLY", "GPU_ONLY"), "hardware": ("HW_GPU_ONLY",), "cuda": ("GPU_ONLY",),
                 "hybrid": ("HYBRID_CPU_GPU",), "cpu": ("CPU_ONLY",)}[backend]
        backends = [n.Backend(getattr(n.BackendKind, k), load_hint=float(hardware_load) if k == "HW_GPU_ONLY" else 1.0)
                    for k in kinds]
        self.on_device = backend != "cpu"
        self.backend, self.roi = backend, roi
        device = device_id if self.on_device else n.NVIMGCODEC_DEVICE_CPU_ONLY
        # fancy (triangle) chroma upsampling, as libjpeg-turbo and so Pillow do by default
        self._decoder = n.Decoder(device_id=device, max_num_cpu_threads=max_cpu_threads, backends=backends,
                                  options=":fancy_upsampling=1")
        try:
            self._params = n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.SRGB,
                                          sample_format=n.SampleFormat.I_RGB)
        except (AttributeError, TypeError):  # nvImageCodec before 0.7: interleaved RGB is the default
            self._params = n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.SRGB)
        self._n = n
        self._spare: list[Any] = []

    def recycle(self, decoded: Sequence[Decoded | str]) -> None:
        """Give back a batch's images once nothing reads them any more: the next batch of as many decodes into them.

        nvImageCodec then resizes those buffers where it must instead of allocating (and later freeing)
        one per image per batch.
        """
        self._spare = [d.pixels for d in decoded if isinstance(d, Decoded)]

    def _source(self, stream: Any, box: np.ndarray) -> Any:
        n = self._n
        if self.roi == "kernel":
            return stream
        top, left, h, w = (int(v) for v in box)
        region = n.Region(top, left, top + h, left + w)
        if hasattr(stream, "get_sub_code_stream"):
            return stream.get_sub_code_stream(region=region)
        return n.DecodeSource(stream, region)  # nvImageCodec before 0.7

    def decode(self, streams: Sequence[np.ndarray], boxes: np.ndarray, cuda_stream: int = 0) -> list[Decoded | str]:
        n = self._n
        out: list[Decoded | str] = ["" for _ in streams]
        sources, where = [], []
        for k, (data, box) in enumerate(zip(streams, boxes)):
            try:  # the header is parsed lazily: its first reader may raise too
                stream = n.CodeStream(np.ascontiguousarray(data))
                codec, height, width = stream.codec_name, int(stream.height), int(stream.width)
            except Exception as exc:  # noqa: BLE001 - nvImageCodec raises RuntimeError on bytes it cannot parse
                out[k] = f"nvImageCodec cannot read its header: {exc}"
                continue
            top, left, h, w = (int(v) for v in box)
            if codec != "jpeg":
                out[k] = f"a {codec} image, not a JPEG"
            elif top + h > height or left + w > width:
                out[k] = f"crop box {(top, left, h, w)} is outside its {height}x{width} pixels"
            else:
                sources.append(self._source(stream, box))
                where.append(k)
        reuse = self._spare if len(self._spare) == len(sources) else None
        self._spare = []
        images = (self._decoder.decode(sources, images=reuse, params=self._params, cuda_stream=cuda_stream)
                  if sources else [])
        for k, image in zip(where, images):
            top, left, h, w = (int(v) for v in boxes[k])
            if image is None:
                out[k] = "nvImageCodec could not decode it"
                continue
            corner = (top, left) if self.roi == "kernel" else (0, 0)
            shape = tuple(image.shape)
            if len(shape) != 3 or shape[2] != 3 or shape[0] < corner[0] + h or shape[1] < corner[1] + w:
                out[k] = f"nvImageCodec gave pixels of shape {shape} for crop box {(top, left, h, w)}"
                continue
            out[k] = Decoded(image, *corner)  # host images read as NumPy through __array_interface__
        return out
