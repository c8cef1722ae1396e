"""Decoding JPEG batches on the GPU: encoded bytes in, a normalised float32 N x 3 x H x W batch out.

Workers only read files (``EncodedJpegs``): the ring carries each batch's encoded bytes as one
zero-padded ``N x max_bytes`` uint8 array with their lengths, crop boxes and flips. ``GpuJpegDecoder``
then decodes the whole batch with nvImageCodec (the GPU's hardware JPEG decoder where it has one,
CUDA otherwise; each crop handed over as a region of interest, so pixels outside it are never
made), and one launch of the project's kernel (``experiments/cuda_src/resize_normalize.cu``)
resizes, mirrors and normalises every crop into the batch, on the caller's current stream.

Without a GPU or without nvImageCodec the same call takes the CPU path: Pillow decodes, and
``resample.crop_resize_flip_normalize`` (the NumPy reference of the kernel) does the rest; this is
said once per process. Either way the batch has the layout of the CPU image transforms: float32
``N x 3 x H x W`` (CuPy on the GPU path, NumPy on the CPU path).

An image that cannot be decoded fails the whole batch with one ``CorruptImageError`` naming its file
(or archive member) and sample: no batch is ever handed out with an image dropped or replaced.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import cuda
from ..errors import ArgumentError, CorruptImageError, NoGPUError
from .jpeg_bytes import jpeg_header
from .jpeg_codecs import BACKENDS, ROI_MODES, Decoded, JpegCodec, NvImageCodecJpeg, PillowJpegCodec, nvimgcodec_status
from .resample import IMAGENET_MEAN, IMAGENET_STD, crop_resize_flip_normalize, normalize_affine

KERNEL_PATH = Path(__file__).resolve().parents[1] / "experiments" / "cuda_src" / "resize_normalize.cu"
KERNEL_NAME = "cupy_nwt_resize_normalize"
THREADS_PER_BLOCK = 256
META_FIELDS = 7  # per image: address, row pitch, crop top, left, height, width, flip

_cpu_path_said = False


def _say_cpu_path_once(reason: str) -> None:
    global _cpu_path_said
    if not _cpu_path_said:
        _cpu_path_said = True
        warnings.warn(f"GpuJpegDecoder decodes on the CPU (Pillow and NumPy): {reason}", RuntimeWarning, stacklevel=3)


def gpu_decode_status() -> tuple[bool, str | None]:
    """``(usable, reason)``: whether JPEGs can be decoded on the GPU here; the reason is one line."""
    status = cuda.gpu_status()
    if not status.available:
        return False, status.reason or "no usable GPU"
    return nvimgcodec_status()


def _size(size: int | Sequence[int]) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) and not isinstance(size, bool) else tuple(size)  # type: ignore[arg-type]
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in pair):
        raise ArgumentError(f"size must be an int >= 1 or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


def _host(name: str, value: Any) -> np.ndarray:
    if value is None:
        raise ArgumentError(f"the batch has no {name!r}")
    return cuda.as_numpy(value) if cuda.is_device_array(value) else np.asarray(value)


def _whole_jpegs(data: np.ndarray, lengths: np.ndarray) -> list[str | None]:
    """Per row, why it is not a whole JPEG (``jpeg_header``), or None: a cut-short stream fails here, not silently later.

    A row that ends in EOI (nearly every JPEG) costs one vectorised look; only the others are walked.
    """
    rows = np.arange(len(data))
    ends = (lengths >= 4) & (data[rows, np.maximum(lengths - 2, 0)] == 0xFF) & (data[rows, lengths - 1] == 0xD9)
    starts = (data[:, 0] == 0xFF) & (data[:, 1] == 0xD8) if data.shape[1] >= 2 else np.zeros(len(data), bool)
    out: list[str | None] = [None] * len(data)
    for k in np.flatnonzero(~(ends & starts)):
        header = jpeg_header(data[k, :lengths[k]].tobytes())
        out[k] = header if isinstance(header, str) else None
    return out


class GpuJpegDecoder:
    """Decode, crop, resize, flip and normalise a batch of ``EncodedJpegs`` samples, on the GPU where it can.

    Call it on each batch the loader yields (``decoder(batch)``); run the loader with ``device="cpu"`` and
    ``zero_copy=True``: nvImageCodec reads the encoded bytes from host memory, straight from the ring's
    slot, and is done with them when the call returns.

    Args:
        size: the output ``(height, width)`` (or one int for a square).
        mean: per-channel mean subtracted from ``pixel / 255`` (ImageNet's by default).
        std: per-channel divisor after the mean (ImageNet's by default).
        device: ``"auto"`` (the GPU if one and nvImageCodec are usable, else the CPU path, said once),
            ``"cuda"`` (the GPU or ``NoGPUError`` with the reason) or ``"cpu"``.
        backend: nvImageCodec's decoder: "auto", "hardware", "cuda", "hybrid" or "cpu" (``NvImageCodecJpeg``).
        roi: where the crop is taken: "decoder" (nvImageCodec's region of interest) or "kernel".
        max_cpu_threads: nvImageCodec's host threads.
        hardware_load: the share of each batch offered to the hardware decoder.
        source: names sample ``i`` in errors (``EncodedJpegs.sample_source``); default ``"sample i"``.
        codec: the decoder of encoded bytes, for tests or another library (default: nvImageCodec on
            the GPU path, Pillow on the CPU path). Its ``on_device`` decides where resizing runs.
    """

    def __init__(self, size: int | Sequence[int] = 224, mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD, *, device: str = "auto", backend: str = "auto",
                 roi: str = "decoder", max_cpu_threads: int = 2, hardware_load: float = 1.0,
                 source: Callable[[int], str] | None = None, codec: JpegCodec | None = None) -> None:
        self.size = _size(size)
        self.mean, self.std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
        self._scale, self._bias = normalize_affine(self.mean, self.std)
        if device not in ("auto", "cuda", "cpu"):
            raise ArgumentError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}")
        if backend not in BACKENDS or roi not in ROI_MODES:
            raise ArgumentError(f"backend must be one of {', '.join(BACKENDS)} and roi one of {', '.join(ROI_MODES)}, "
                                f"got {backend!r} and {roi!r}")
        if isinstance(hardware_load, bool) or not isinstance(hardware_load, (int, float)) or not 0 <= hardware_load <= 1:
            raise ArgumentError(f"hardware_load must be a fraction in [0, 1], got {hardware_load!r}")
        if isinstance(max_cpu_threads, bool) or not isinstance(max_cpu_threads, int) or max_cpu_threads < 0:
            raise ArgumentError(f"max_cpu_threads must be an int >= 0 (0: one per core), got {max_cpu_threads!r}")
        if source is not None and not callable(source):
            raise ArgumentError(f"source must be a callable index -> name, got {type(source).__name__}")
        self.source = source
        self.reason: str | None = None
        if codec is None:
            usable, why = gpu_decode_status() if device != "cpu" else (False, "device='cpu' was asked for")
            if device == "cuda" and not usable:
                raise NoGPUError(f"GpuJpegDecoder(device='cuda'): {why}")
            if usable:
                codec = NvImageCodecJpeg(cuda.current_device(), backend, roi, max_cpu_threads, hardware_load)
            else:
                self.reason = why
                if device == "auto":
                    _say_cpu_path_once(why or "no GPU decoding here")
                codec = PillowJpegCodec()
        elif codec.on_device:
            cuda.require_gpu()
        self.codec: JpegCodec = codec
        self.path = "gpu" if codec.on_device else "cpu"
        self._kernel: Any = None
        self._held: tuple[Any, ...] = ()

    def __call__(self, batch: Mapping[str, Any]) -> Any:
        """The images of one collated ``EncodedJpegs`` batch (its ``jpeg``, ``nbytes``, ``box``, ``flip``, ``index``)."""
        if not isinstance(batch, Mapping):
            raise ArgumentError(f"GpuJpegDecoder takes a batch of EncodedJpegs samples (a dict), got {type(batch).__name__}")
        return self.decode(batch.get("jpeg"), batch.get("nbytes"), batch.get("box"), batch.get("flip"), batch.get("index"))

    def decode(self, jpeg: Any, nbytes: Any, box: Any, flip: Any = None, index: Any = None) -> Any:
        """Decode ``jpeg[k, :nbytes[k]]`` cropped to ``box[k]`` (top, left, h, w), mirrored where ``flip[k]``.

        Returns float32 ``N x 3 x H x W``: CuPy on the GPU path, NumPy on the CPU path.
        """
        data, lengths, boxes = _host("jpeg", jpeg), _host("nbytes", nbytes).astype(np.int64), _host("box", box)
        n = len(data)
        if data.dtype != np.uint8 or data.ndim != 2:
            raise ArgumentError(f"jpeg must be an N x max_bytes uint8 array, got {data.dtype} of shape {data.shape}")
        flips = np.zeros(n, bool) if flip is None else _host("flip", flip).astype(bool).reshape(-1)
        indices = np.arange(n) if index is None else _host("index", index).astype(np.int64).reshape(-1)
        if lengths.shape != (n,) or boxes.shape != (n, 4) or flips.shape != (n,) or indices.shape != (n,):
            raise ArgumentError(f"a batch of {n} needs nbytes ({n},), box ({n}, 4), flip ({n},) and index ({n},); got "
                                f"{lengths.shape}, {boxes.shape}, {flips.shape}, {indices.shape}")
        boxes = boxes.astype(np.int64)
        if n and (lengths.min() < 1 or lengths.max() > data.shape[1]):
            raise ArgumentError(f"nbytes must be within 1..{data.shape[1]} (the rows' width), got {lengths.min()}..{lengths.max()}")
        if n and (boxes[:, :2].min() < 0 or boxes[:, 2:].min() < 1):
            k = int(np.flatnonzero((boxes[:, :2] < 0).any(1) | (boxes[:, 2:] < 1).any(1))[0])
            raise ArgumentError(f"{self._name(int(indices[k]))}: crop box {tuple(int(v) for v in boxes[k])} has a negative corner or an empty side")
        streams = [data[k, :lengths[k]] for k in range(n)]
        self._check(_whole_jpegs(data, lengths), indices)  # before decoding: a cut-short stream may "decode"
        stream_ptr = 0
        if self.codec.on_device:
            stream_ptr = int(cuda.current_stream().ptr)
            self._release_held()
        answers = self.codec.decode(streams, boxes, stream_ptr)
        decoded: list[Decoded | str] = [d if isinstance(d, (Decoded, str)) else f"the decoder gave {d!r}, no image"
                                        for d in answers]
        self._check(decoded, indices)
        images = [d for d in decoded if isinstance(d, Decoded)]  # all of them: any failure raised above
        if self.codec.on_device:
            return self._resample_on_gpu(images, boxes, flips)
        out = np.empty((n, 3, *self.size), np.float32)
        for k, d in enumerate(images):
            out[k] = crop_resize_flip_normalize(np.asarray(d.pixels), (d.top, d.left, boxes[k, 2], boxes[k, 3]),
                                                self.size, bool(flips[k]), self.mean, self.std)
        return out

    def _name(self, i: int) -> str:
        name = self.source(i) if self.source is not None else f"sample {i}"
        return name if re.search(rf"\bsample {i}\b", name) else f"{name} (sample {i})"

    def _check(self, decoded: Sequence[Decoded | str | None], indices: np.ndarray) -> None:
        """Raise for the first image answered with a reason (a str) instead of pixels; None means "fine so far"."""
        failed = [k for k, d in enumerate(decoded) if isinstance(d, str)]
        if len(decoded) != len(indices):
            raise ArgumentError(f"the codec answered {len(decoded)} images for a batch of {len(indices)}")
        if failed:
            k = failed[0]
            others = f"; {len(failed) - 1} more of the batch's {len(indices)} failed too" if len(failed) > 1 else ""
            raise CorruptImageError(f"{self._name(int(indices[k]))}: not a decodable JPEG ({decoded[k]}){others}",
                                    int(indices[k]))

    def _resample_on_gpu(self, images: Sequence[Decoded], boxes: np.ndarray, flips: np.ndarray) -> Any:
        if self._kernel is None:
            self._kernel = cuda.compile_kernel(KERNEL_PATH.read_text(encoding="utf-8"), KERNEL_NAME)
        n = len(images)
        meta = np.empty((n, META_FIELDS), np.int64)
        for k, d in enumerate(images):
            face = d.pixels.__cuda_array_interface__
            shape, strides = tuple(face["shape"]), face.get("strides")
            if (face.get("typestr") != "|u1" or len(shape) != 3 or shape[2] != 3 or d.top < 0 or d.left < 0
                    or shape[0] < d.top + boxes[k, 2] or shape[1] < d.left + boxes[k, 3]
                    or (strides is not None and tuple(strides[1:]) != (3, 1))):
                raise ArgumentError(f"the codec gave pixels {face.get('typestr')} {shape} (strides {strides}) that do not "
                                    f"hold crop {tuple(int(v) for v in boxes[k])} at ({d.top}, {d.left}) as interleaved RGB bytes")
            meta[k] = (int(face["data"][0]), int(strides[0]) if strides else shape[1] * 3,
                       d.top, d.left, boxes[k, 2], boxes[k, 3], int(flips[k]))
        h, w = self.size
        out = cuda.device_empty((n, 3, h, w), np.float32)
        if n:
            meta_dev = cuda.device_empty(meta.shape, meta.dtype)  # from the current stream's pool: written in its order
            cuda.memcpy_h2d(meta_dev, meta)
            total = n * h * w
            s, b = self._scale.astype(np.float32), self._bias.astype(np.float32)
            self._kernel((-(-total // THREADS_PER_BLOCK),), (THREADS_PER_BLOCK,),
                         (meta_dev, out, np.int32(n), np.int32(h), np.int32(w), s[0], s[1], s[2], b[0], b[1], b[2]))
            done = cuda.event(timing=False)
            done.record()
            self._held = (images, meta_dev, done)  # the decoded pixels live until this launch has read them
        return out

    def _release_held(self) -> None:
        """Once the previous batch's kernel has read its pixels (long done, as a rule), give them back to the codec."""
        if not self._held:
            return
        images, _, done = self._held
        self._held = ()
        done.synchronize()
        recycle = getattr(self.codec, "recycle", None)
        if recycle is not None:
            recycle(images)
