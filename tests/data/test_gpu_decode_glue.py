"""GpuJpegDecoder's GPU path without a GPU: a fake CuPy whose "kernel" is the float32 emulation of
``resize_normalize.cu`` (``test_resample.emulate_kernel``), reading the per-image table the stage builds
(addresses, row pitch, crop corner and size, flip) from memory as the kernel would.

What this checks is the glue: that the table the stage packs is what the kernel reads, for crops
decoded as a region (corner 0, 0) and for whole images read at an offset, with padded rows; and
that each batch's pixels are handed back to the codec only after the next batch's decode starts.
"""

from __future__ import annotations

import ctypes
import io
import types

import numpy as np
import pytest
from PIL import Image
from test_resample import emulate_kernel

from cupy_nwt import cuda
from cupy_nwt.data import GpuJpegDecoder, decode_image
from cupy_nwt.data.jpeg_codecs import Decoded
from cupy_nwt.data.resample import crop_resize_flip_normalize, normalize_affine
from cupy_nwt.errors import ArgumentError


class FakeDeviceArray:
    """Device memory as host bytes; a copy into it says which stream it was ordered on (None: the current one)."""

    def __init__(self, host: np.ndarray, copies: list[str]) -> None:
        self.host = host
        self.flags = host.flags

        def copy_from_host_async(src: int, nbytes: int, stream=None) -> None:
            ctypes.memmove(int(host.ctypes.data), src, nbytes)
            copies.append("current stream" if stream is None else "another stream")

        self.data = types.SimpleNamespace(ptr=int(host.ctypes.data), copy_from_host_async=copy_from_host_async)
        self.shape, self.dtype, self.nbytes = host.shape, host.dtype, host.nbytes


class DevicePixels:
    """Decoded pixels "in device memory": host bytes behind a ``__cuda_array_interface__`` with padded rows."""

    def __init__(self, image: np.ndarray, pad: int = 13) -> None:
        h, w, _ = image.shape
        self.buffer = np.zeros((h, w * 3 + pad), np.uint8)
        self.buffer[:, :w * 3] = image.reshape(h, w * 3)
        self.__cuda_array_interface__ = {"shape": (h, w, 3), "typestr": "|u1", "version": 3,
                                         "data": (int(self.buffer.ctypes.data), False), "strides": (w * 3 + pad, 3, 1)}


class FakeCupy:
    """What cupy_nwt.cuda calls on the stage's GPU path; the kernel runs the emulation on the host."""

    def __init__(self) -> None:
        self.launches: list[tuple] = []
        self.copies: list[str] = []
        fake = self

        class Event:
            def __init__(self, disable_timing: bool = False) -> None:
                self.synced = False

            def record(self, stream=None) -> None:
                pass

            def synchronize(self) -> None:
                self.synced = True

        def memcpy(dst, src, nbytes, kind):
            ctypes.memmove(dst, src, nbytes)
            fake.copies.append("legacy default stream")

        self.cuda = types.SimpleNamespace(
            Event=Event, get_current_stream=lambda: types.SimpleNamespace(ptr=0),
            runtime=types.SimpleNamespace(memcpy=memcpy, memcpyHostToDevice=1))

        def raw_kernel(source, name):
            assert name == "cupy_nwt_resize_normalize" and "extern \"C\" __global__" in source

            def launch(grid, block, args):
                meta, out, n, out_h, out_w, *affine = args
                fake.launches.append((grid, block, int(n)))
                assert grid[0] * block[0] >= int(n) * int(out_h) * int(out_w)
                scale, bias = np.array(affine[:3], np.float32), np.array(affine[3:], np.float32)
                for b, (ptr, pitch, top, left, h, w, flip) in enumerate(meta.host.reshape(int(n), 7)):
                    rows = (ctypes.c_uint8 * int(pitch * (top + h))).from_address(int(ptr))
                    pixels = np.ctypeslib.as_array(rows).reshape(top + h, pitch)[:, :(left + w) * 3]
                    out.host[b] = emulate_kernel(pixels.reshape(top + h, left + w, 3), int(top), int(left), int(h),
                                                 int(w), int(out_h), int(out_w), bool(flip), scale, bias)
            return launch

        self.RawKernel = raw_kernel

    def empty(self, shape, dtype):
        return FakeDeviceArray(np.zeros(shape, dtype), self.copies)


@pytest.fixture
def fake(monkeypatch):
    f = FakeCupy()
    monkeypatch.setattr(cuda, "_cupy", lambda: f)
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 1))
    return f


class DeviceCodec:
    """Pillow decodes; the pixels are handed over as device memory, cropped (``"decoder"``) or whole (``"kernel"``)."""

    on_device = True

    def __init__(self, roi: str) -> None:
        self.roi = roi
        self.recycled: list[list] = []
        self.pending: list = []  # the batch handed out and not yet given back

    def recycle(self, decoded):
        assert [d.pixels for d in decoded] == [d.pixels for d in self.pending]
        self.recycled.append(decoded)
        self.pending = []

    def decode(self, streams, boxes, cuda_stream=0):
        assert not self.pending, "the previous batch's pixels must be given back before the next decode"
        out = []
        for data, (top, left, h, w) in zip(streams, boxes):
            full = decode_image(data.tobytes(), "x")
            if self.roi == "decoder":
                out.append(Decoded(DevicePixels(np.ascontiguousarray(full[top:top + h, left:left + w])), 0, 0))
            else:
                out.append(Decoded(DevicePixels(full), int(top), int(left)))
        self.pending = out
        return out


def jpeg(h: int, w: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.clip(np.stack([yy * 2, xx * 2, (yy + xx) % 256], -1) + rng.integers(-30, 31, (h, w, 3)), 0, 255)
    buf = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def batch(shapes, boxes, flips, width=16384):
    rows = np.zeros((len(shapes), width), np.uint8)
    sizes = []
    for k, (h, w) in enumerate(shapes):
        data = jpeg(h, w, seed=k)
        rows[k, :len(data)] = np.frombuffer(data, np.uint8)
        sizes.append(len(data))
    return {"jpeg": rows, "nbytes": np.array(sizes), "box": np.array(boxes), "flip": np.array(flips),
            "index": np.arange(len(shapes))}


@pytest.mark.parametrize("roi", ["decoder", "kernel"])
def test_the_table_the_stage_packs_is_the_one_the_kernel_reads(fake, roi):
    b = batch([(60, 80), (75, 50), (40, 40)], [(5, 7, 40, 60), (0, 0, 75, 50), (10, 3, 12, 20)], [True, False, True])
    codec = DeviceCodec(roi)
    decoder = GpuJpegDecoder((24, 32), codec=codec)
    assert decoder.path == "gpu"
    out = decoder(b).host
    assert out.shape == (3, 3, 24, 32) and out.dtype == np.float32
    for k in range(3):
        pixels = decode_image(b["jpeg"][k, :b["nbytes"][k]].tobytes(), "x")
        ref = crop_resize_flip_normalize(pixels, b["box"][k], (24, 32), bool(b["flip"][k]))
        assert np.abs(out[k] - ref).max() < 2e-4
    assert fake.launches == [((-(-3 * 24 * 32 // 256),), (256,), 3)]


def test_pixels_go_back_to_the_codec_only_after_their_kernel_and_the_next_batch_starts(fake):
    codec = DeviceCodec("decoder")
    decoder = GpuJpegDecoder(16, codec=codec)
    b = batch([(30, 40), (30, 40)], [(0, 0, 30, 40), (2, 2, 20, 20)], [False, False])
    decoder(b)
    assert codec.recycled == []  # still read by the kernel just launched
    decoder(b)
    decoder(b)
    assert len(codec.recycled) == 2 and len(fake.launches) == 3


def test_the_kernels_table_is_copied_in_the_current_streams_order(fake):
    """Its memory comes from the current stream's pool, maybe freed by a kernel still queued there: a copy on
    the legacy default stream (which a non-blocking stream does not wait for) could overwrite it under that kernel."""
    b = batch([(30, 40), (30, 40)], [(0, 0, 30, 40), (2, 2, 20, 20)], [False, True])
    GpuJpegDecoder(16, codec=DeviceCodec("decoder"))(b)
    assert fake.copies == ["current stream"]


def test_the_normalisation_reaches_the_kernel(fake):
    b = batch([(20, 20)], [(0, 0, 20, 20)], [False])
    out = GpuJpegDecoder(20, mean=(0.5, 0.25, 0.0), std=(0.5, 1.0, 2.0), codec=DeviceCodec("decoder"))(b).host[0]
    scale, bias = normalize_affine((0.5, 0.25, 0.0), (0.5, 1.0, 2.0))
    pixels = decode_image(b["jpeg"][0, :b["nbytes"][0]].tobytes(), "x").transpose(2, 0, 1)
    np.testing.assert_allclose(out, pixels * scale[:, None, None] + bias[:, None, None], atol=2e-5)


def test_pixels_that_do_not_hold_the_crop_are_refused_before_any_launch(fake):
    class Small(DeviceCodec):
        def decode(self, streams, boxes, cuda_stream=0):
            return [Decoded(DevicePixels(np.zeros((10, 10, 3), np.uint8)), 0, 0) for _ in streams]

    b = batch([(30, 40)], [(0, 0, 30, 40)], [False])
    with pytest.raises(ArgumentError, match=r"do not hold crop \(0, 0, 30, 40\)"):
        GpuJpegDecoder(16, codec=Small("decoder"))(b)
    assert fake.launches == []
