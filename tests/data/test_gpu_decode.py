"""GpuJpegDecoder: its CPU path, its errors (one bad image names itself, never a silently short batch), nvImageCodec's
own CPU decoder behind the same seam, and on a GPU machine the GPU path against the CPU path and the NumPy reference."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cupy_nwt import DataLoader, cuda
from cupy_nwt.data import EncodedJpegs, GpuJpegDecoder, ImageFolder, decode_image, gpu_decode_status
from cupy_nwt.data.jpeg_codecs import Decoded, NvImageCodecJpeg, PillowJpegCodec, nvimgcodec_status
from cupy_nwt.data.resample import crop_resize_flip_normalize
from cupy_nwt.errors import ArgumentError, CorruptImageError, NoGPUError

GPU = gpu_decode_status()[0]
needs_nvimgcodec = pytest.mark.skipif(not nvimgcodec_status()[0], reason=str(nvimgcodec_status()[1]))
# GPU against CPU decoding: nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's to the bit. After the
# resize (which averages), in levels of 255: the mean difference per batch, and the largest one anywhere.
CROSS_DECODER_MEAN_LEVELS = 0.5
CROSS_DECODER_MAX_LEVELS = 8.0
STD_LEVEL = 1 / (255 * 0.229)  # one level of 255 in the normalised output, at the smallest std


def photo(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([yy * 255 // (h - 1), xx * 255 // (w - 1), ((yy // 8 + xx // 8) % 2) * 200], -1)
    return np.clip(base + rng.integers(-20, 21, (h, w, 3)), 0, 255).astype(np.uint8)


def jpeg(h: int, w: int, seed: int, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(photo(h, w, seed)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for c in range(2):
        (tmp_path / f"c{c}").mkdir()
        for i in range(4):
            (tmp_path / f"c{c}" / f"{i}.jpg").write_bytes(jpeg(96 + 8 * i, 128 - 4 * i, seed=10 * c + i))
    return tmp_path


def batch_of(ds: EncodedJpegs, indices: Sequence[int]) -> dict[str, np.ndarray]:
    samples = [ds[i] for i in indices]
    return {k: np.stack([s[k] for s in samples]) for k in samples[0]}


def reference(ds: EncodedJpegs, batch: dict[str, np.ndarray], size: int | tuple[int, int] = 32) -> np.ndarray:
    hw = (size, size) if isinstance(size, int) else size
    return np.stack([crop_resize_flip_normalize(decode_image(ds.read_bytes(int(i)), "x"), box, hw, bool(f))
                     for i, box, f in zip(batch["index"], batch["box"], batch["flip"])])


class FakeCodec:
    """Decodes with Pillow, but answers ``reason`` for the images at ``fail``: a GPU decoder's None, on the CPU."""

    on_device = False

    def __init__(self, fail: dict[int, str]) -> None:
        self.fail = fail
        self.calls = 0

    def decode(self, streams, boxes, cuda_stream=0):
        self.calls += 1
        out = PillowJpegCodec().decode(streams, boxes)
        return [self.fail.get(k, d) for k, d in enumerate(out)]


def test_cpu_path_is_the_reference_in_the_cpu_transforms_layout(folder):
    ds = EncodedJpegs(ImageFolder(folder), max_bytes=32768, seed=1)
    batch = batch_of(ds, range(8))
    out = GpuJpegDecoder(32, device="cpu")(batch)
    assert isinstance(out, np.ndarray) and out.shape == (8, 3, 32, 32) and out.dtype == np.float32
    np.testing.assert_array_equal(out, reference(ds, batch))


@pytest.mark.parametrize("codec", ["pillow", "nvimgcodec-cpu"])
def test_through_the_loader_straight_from_the_ring(folder, codec):
    if codec == "nvimgcodec-cpu" and not nvimgcodec_status()[0]:
        pytest.skip(str(nvimgcodec_status()[1]))
    ds = EncodedJpegs(ImageFolder(folder), max_bytes=32768, seed=2)
    chosen = NvImageCodecJpeg(backend="cpu", max_cpu_threads=1) if codec != "pillow" else None
    decoder = GpuJpegDecoder((24, 40), device="cpu", source=ds.sample_source, codec=chosen)
    seen = []
    # zero_copy: the batch is a read-only view of the ring's slot, decoded before the next batch is asked for
    with DataLoader(ds, batch_size=3, num_workers=2, shuffle=True, seed=0, zero_copy=True, device="cpu",
                    output="numpy") as dl:
        for batch in dl:
            assert not batch["jpeg"].flags.writeable
            images = decoder(batch)
            assert images.shape == (len(batch["label"]), 3, 24, 40) and np.isfinite(images).all()
            ref = reference(ds, {k: np.array(v) for k, v in batch.items()}, (24, 40))
            assert np.abs(images - ref).max() <= (0 if chosen is None else 2 * STD_LEVEL)  # libjpeg-turbo both
            seen += batch["index"].tolist()
    assert sorted(seen) == list(range(8))


def test_one_image_the_decoder_cannot_make_fails_the_batch_naming_it(folder):
    ds = EncodedJpegs(ImageFolder(folder), max_bytes=32768)
    batch = batch_of(ds, [5, 2, 7, 0])
    decoder = GpuJpegDecoder(32, source=ds.sample_source, codec=FakeCodec({1: "nvImageCodec could not decode it"}))
    with pytest.raises(CorruptImageError) as err:
        decoder(batch)
    assert str(err.value) == f"{ds.sample_source(2)} (sample 2): not a decodable JPEG (nvImageCodec could not decode it)"
    assert err.value.sample_index == 2
    several = GpuJpegDecoder(32, codec=FakeCodec({3: "bad", 1: "worse"}))
    with pytest.raises(CorruptImageError, match=r"^sample 2: not a decodable JPEG \(worse\); 1 more of the batch's 4"):
        several(batch)


def test_a_cut_short_stream_fails_even_where_the_decoder_would_fill_it_in(folder):
    ds = EncodedJpegs(ImageFolder(folder), max_bytes=32768)
    batch = batch_of(ds, [0, 1, 2])
    batch["nbytes"][1] -= 500  # the ring's row is cut: the decoder itself would paint the rest grey
    with pytest.raises(CorruptImageError, match=rf"^{ds.sample_source(1)} \(sample 1\): not a decodable JPEG \(cut short"):
        GpuJpegDecoder(32, source=ds.sample_source, codec=FakeCodec({}))(batch)


def test_a_codec_answering_none_is_a_failure_of_that_image(folder):
    class NoneFor(FakeCodec):
        def decode(self, streams, boxes, cuda_stream=0):
            out = super().decode(streams, boxes)
            out[1] = None  # what nvImageCodec itself answers for an image it could not decode
            return out

    batch = batch_of(EncodedJpegs(ImageFolder(folder), max_bytes=32768), [4, 5, 6])
    with pytest.raises(CorruptImageError, match=r"^sample 5: not a decodable JPEG \(the decoder gave None, no image\)$"):
        GpuJpegDecoder(32, codec=NoneFor({}))(batch)


def test_a_codec_answering_for_fewer_images_is_an_error_not_a_short_batch(folder):
    class Short(FakeCodec):
        def decode(self, streams, boxes, cuda_stream=0):
            return super().decode(streams, boxes)[:-1]

    batch = batch_of(EncodedJpegs(ImageFolder(folder), max_bytes=32768), [0, 1])
    with pytest.raises(ArgumentError, match="answered 1 images for a batch of 2"):
        GpuJpegDecoder(32, codec=Short({}))(batch)


def test_bad_batches_and_options_are_one_line_errors(folder):
    batch = batch_of(EncodedJpegs(ImageFolder(folder), max_bytes=32768), [0, 1])
    decoder = GpuJpegDecoder(16, device="cpu")
    for key, value, match in [("nbytes", np.array([0, 5]), "nbytes must be within"),
                              ("box", np.array([[0, 0, 4, 4]]), r"needs nbytes \(2,\), box \(2, 4\)"),
                              ("box", np.array([[0, -1, 4, 4], [0, 0, 4, 4]]), "negative corner"),
                              ("jpeg", batch["jpeg"].astype(np.int16), "uint8")]:
        with pytest.raises(ArgumentError, match=match):
            decoder({**batch, key: value})
    with pytest.raises(ArgumentError, match="no 'jpeg'"):
        decoder({})
    with pytest.raises(ArgumentError, match="a dict"):
        decoder([batch])
    for kwargs, match in [({"size": 0}, "size"), ({"size": (3, 4, 5)}, "size"), ({"device": "gpu"}, "device"),
                          ({"std": (1, 0, 1)}, "std"), ({"backend": "gpu"}, "backend must be"),
                          ({"roi": "crop"}, "roi one of"), ({"max_cpu_threads": -1}, "max_cpu_threads"),
                          ({"hardware_load": 1.5}, "hardware_load")]:
        with pytest.raises(ArgumentError, match=match):
            GpuJpegDecoder(**kwargs)


@pytest.mark.skipif(GPU, reason="checks the machine without a GPU")
def test_without_a_gpu_auto_takes_the_cpu_path_and_says_so_once():
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from cupy_nwt.data import GpuJpegDecoder\n"
            "a = GpuJpegDecoder(); b = GpuJpegDecoder(); c = GpuJpegDecoder(device='cpu')\n"
            "print(a.path, b.path, c.path, a.reason == b.reason)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.split() == ["cpu", "cpu", "cpu", "True"]
    said = [line for line in proc.stderr.splitlines() if "GpuJpegDecoder decodes on the CPU" in line]
    assert len(said) == 1 and cuda.gpu_status().reason in said[0]
    with pytest.raises(NoGPUError, match=r"^GpuJpegDecoder\(device='cuda'\): "):
        GpuJpegDecoder(device="cuda")


@needs_nvimgcodec
@pytest.mark.parametrize("roi", ["decoder", "kernel"])
def test_nvimgcodec_on_the_cpu_behind_the_same_seam(folder, roi):
    ds = EncodedJpegs(ImageFolder(folder), max_bytes=32768, seed=4)
    batch = batch_of(ds, range(8))
    out = GpuJpegDecoder(32, codec=NvImageCodecJpeg(backend="cpu", roi=roi, max_cpu_threads=1))(batch)
    # both are libjpeg-turbo: the same pixels, so the same batch, up to the decoders' builds
    assert np.abs(out - reference(ds, batch)).max() <= 2 * STD_LEVEL


@needs_nvimgcodec
def test_nvimgcodec_none_for_one_image_names_it(folder):
    ds = EncodedJpegs(ImageFolder(folder), max_bytes=32768)
    batch = batch_of(ds, [3, 4, 6])
    row = batch["jpeg"][2]
    sof = row.tobytes().find(b"\xff\xc0")
    row[sof + 4] = 16  # a 16-bit baseline frame: the header parses, the decode itself fails (nvImageCodec: None)
    codec = NvImageCodecJpeg(backend="cpu", max_cpu_threads=1)
    assert [isinstance(d, Decoded) for d in codec.decode([r[:n] for r, n in zip(batch["jpeg"], batch["nbytes"])],
                                                         batch["box"])] == [True, True, False]
    with pytest.raises(CorruptImageError, match=rf"^{ds.sample_source(6)} \(sample 6\): not a decodable JPEG "
                                                r"\(nvImageCodec could not decode it\)$"):
        GpuJpegDecoder(32, source=ds.sample_source, codec=codec)(batch)


@needs_nvimgcodec
def test_nvimgcodec_options_are_checked():
    with pytest.raises(ArgumentError, match="backend must be"):
        NvImageCodecJpeg(backend="gpu")
    with pytest.raises(ArgumentError, match="roi must be"):
        NvImageCodecJpeg(roi="crop")
    with pytest.raises(ArgumentError, match="hardware_load"):
        NvImageCodecJpeg(hardware_load=-0.1)


# ---------------------------------------------------------------- on a GPU machine


class Keeping:
    """nvImageCodec on the GPU, keeping a host copy of every crop it decoded (for the reference)."""

    on_device = True

    def __init__(self, **kwargs) -> None:
        self.codec = NvImageCodecJpeg(cuda.current_device(), **kwargs)
        self.crops: list[np.ndarray] = []

    def decode(self, streams, boxes, cuda_stream=0):
        out = self.codec.decode(streams, boxes, cuda_stream)
        cuda.synchronize()
        self.crops = []
        for d, (_, _, h, w) in zip(out, boxes):
            pixels = np.asarray(d.pixels.cpu())  # nvImageCodec's own device -> host copy
            self.crops.append(pixels[d.top:d.top + h, d.left:d.left + w])
        return out


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason=str(gpu_decode_status()[1]))
@pytest.mark.parametrize("roi", ["decoder", "kernel"])
def test_gpu_kernel_output_is_the_reference_of_the_pixels_it_decoded(folder, roi):
    ds = EncodedJpegs(ImageFolder(folder), max_bytes=32768, seed=5)
    batch = batch_of(ds, range(8))
    keeping = Keeping(roi=roi)
    out = cuda.as_numpy(GpuJpegDecoder(48, codec=keeping)(batch))
    ref = np.stack([crop_resize_flip_normalize(c, (0, 0, *c.shape[:2]), (48, 48), bool(f))
                    for c, f in zip(keeping.crops, batch["flip"])])
    assert np.abs(out - ref).max() < 2e-4  # float32 in the kernel against float64 in NumPy


@pytest.fixture
def smooth_folder(tmp_path: Path) -> Path:
    """Photo-like JPEGs without hard colour edges: where decoders differ most (chroma upsampling) they differ least."""
    rng = np.random.default_rng(7)
    (tmp_path / "c0").mkdir()
    for i in range(8):
        h, w = 180 + 10 * i, 240 - 8 * i
        yy, xx = np.mgrid[0:h, 0:w] / 40.0
        phase = rng.uniform(0, 6, 3)
        img = 128 + 90 * np.stack([np.sin(yy + phase[0]), np.cos(xx + phase[1]), np.sin(yy + xx + phase[2])], -1)
        img = np.clip(img + rng.normal(0, 4, img.shape), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(tmp_path / "c0" / f"{i}.jpg", quality=90)
    return tmp_path


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason=str(gpu_decode_status()[1]))
@pytest.mark.parametrize("backend", ["auto", "cuda"])
def test_gpu_path_gives_the_cpu_paths_images(smooth_folder, backend):
    ds = EncodedJpegs(ImageFolder(smooth_folder), max_bytes=65536, seed=6)
    batch = batch_of(ds, range(8))
    gpu = GpuJpegDecoder(64, device="cuda", backend=backend)
    assert gpu.path == "gpu"
    levels = np.abs(cuda.as_numpy(gpu(batch)) - GpuJpegDecoder(64, device="cpu")(batch)) / STD_LEVEL
    assert levels.mean() <= CROSS_DECODER_MEAN_LEVELS and levels.max() <= CROSS_DECODER_MAX_LEVELS


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason=str(gpu_decode_status()[1]))
def test_gpu_decode_failure_of_one_image_names_it(folder):
    ds = EncodedJpegs(ImageFolder(folder), max_bytes=32768)
    batch = batch_of(ds, [1, 2, 3])
    row = batch["jpeg"][0]
    row[row.tobytes().find(b"\xff\xc0") + 4] = 16
    with pytest.raises(CorruptImageError, match=rf"^{ds.sample_source(1)} \(sample 1\): not a decodable JPEG"):
        GpuJpegDecoder(32, device="cuda", source=ds.sample_source)(batch)


@needs_nvimgcodec
def test_recycled_images_are_decoded_into_again(folder):
    ds = EncodedJpegs(ImageFolder(folder), max_bytes=32768, crop="full")
    codec = NvImageCodecJpeg(backend="cpu", max_cpu_threads=1)

    def run(indices):
        batch = batch_of(ds, indices)
        return codec.decode([r[:n] for r, n in zip(batch["jpeg"], batch["nbytes"])], batch["box"])

    first = run([0, 1, 2])
    codec.recycle(first)
    second = run([7, 6, 5])  # other sizes: the buffers are resized, not replaced
    assert all(a.pixels is b.pixels for a, b in zip(first, second))
    for k, d in zip([7, 6, 5], second):
        np.testing.assert_array_equal(np.asarray(d.pixels), decode_image(ds.read_bytes(k), "x"))
    assert all(isinstance(d, Decoded) for d in run([0, 1]))  # another count: fresh images


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason=str(gpu_decode_status()[1]))
def test_gpu_path_through_the_loader_straight_from_the_ring(smooth_folder):
    ds = EncodedJpegs(ImageFolder(smooth_folder), max_bytes=65536, seed=8)
    gpu, cpu = GpuJpegDecoder(56, device="cuda", source=ds.sample_source), GpuJpegDecoder(56, device="cpu")
    seen = []
    with DataLoader(ds, batch_size=3, num_workers=2, shuffle=True, seed=0, zero_copy=True, device="cpu",
                    output="numpy") as dl:
        for batch in dl:
            images = gpu(batch)
            assert cuda.is_device_array(images) and images.shape == (len(batch["index"]), 3, 56, 56)
            levels = np.abs(cuda.as_numpy(images) - cpu(batch)) / STD_LEVEL
            assert levels.mean() <= CROSS_DECODER_MEAN_LEVELS and levels.max() <= CROSS_DECODER_MAX_LEVELS
            seen += batch["index"].tolist()
    assert sorted(seen) == list(range(8))
