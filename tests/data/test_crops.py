"""The ImageNet crops: torchvision's boxes, region decode against the full-decode reference, and the hooks.

The reference for every image is what torchvision does on PIL images: decode the whole JPEG with
Pillow, ``crop(box)``, ``resize(size, BILINEAR)`` (antialiased). Where the crop is decoded at the DCT
scale 1 the output must be within one level of it at every pixel (the resize is Pillow's arithmetic,
horizontal pass first; the installed Pillow sometimes runs its passes the other way round, which moves
a pixel by one level at most); at 1/2..1/8 (the DCT's own low-pass standing in for part of the resize's)
its pixels pooled over many crops must stay within ``MEAN_TOL`` levels on average and ``P99_TOL`` at the
99th percentile, and any one crop within ``CROP_MEAN_TOL`` and ``CROP_P99_TOL``: a crop of fine texture
(the roof tiles of scikit-learn's china.jpg) differs most.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cupy_nwt import DataLoader
from cupy_nwt.data import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CenterCrop,
    Compose,
    ImageFolder,
    NormalizeBatch,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ShardedTarStream,
    TarImageDataset,
    jpeg_region,
    random_resized_crop_box,
    resized_shape,
    write_tar_shard,
)
from cupy_nwt.errors import ArgumentError, CorruptImageError

MEAN_TOL, P99_TOL = 2.0, 12.0
CROP_MEAN_TOL, CROP_P99_TOL = 4.0, 20.0
NO_EXTENSION = pytest.mark.skipif(not jpeg_region.available(), reason="the libjpeg-turbo region extension is not built")
BACKENDS = [pytest.param("libjpeg", marks=NO_EXTENSION), "simplejpeg", "pillow"]


def photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth, photo-like image (gradients and soft blobs, a little grain): compresses like a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        img[..., c] = 128 + 60 * np.sin(x / (w / (2 + c)) + c) * np.cos(y / (h / (3 + c)))
        for _ in range(4):
            cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(0.05, 0.2) * max(h, w)
            img[..., c] += rng.uniform(-60, 60) * np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * r * r))
    img += rng.normal(0, 3, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg(img: np.ndarray, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def reference(data: bytes, box: tuple[int, int, int, int], out: tuple[int, int]) -> np.ndarray:
    top, left, h, w = box
    with Image.open(io.BytesIO(data)) as im:
        rgb = im.convert("RGB")
        return np.asarray(rgb.crop((left, top, left + w, top + h)).resize(out[::-1], Image.Resampling.BILINEAR))


def assert_within_one(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape and got.dtype == np.uint8
    assert np.abs(got.astype(np.int16) - ref).max() <= 1


@pytest.fixture(scope="module")
def small_jpeg() -> bytes:
    return jpeg(photo(150, 200))


@pytest.fixture(scope="module")
def large_jpeg() -> bytes:
    return jpeg(photo(480, 640, seed=1))


# --- the box ---------------------------------------------------------------------------------


def test_box_is_inside_and_follows_scale_and_ratio() -> None:
    rng = np.random.default_rng(0)
    for _ in range(500):
        h, w = int(rng.integers(20, 400)), int(rng.integers(20, 400))
        top, left, bh, bw = random_resized_crop_box(h, w, rng)
        assert 0 <= top and 0 <= left and top + bh <= h and left + bw <= w and bh > 0 and bw > 0
    big = [random_resized_crop_box(300, 400, rng) for _ in range(300)]
    areas = np.array([bh * bw / (300 * 400) for _, _, bh, bw in big])
    ratios = np.array([bw / bh for _, _, bh, bw in big])
    assert areas.min() >= 0.08 * 0.9 and areas.max() <= 1.0
    assert ratios.min() >= 0.75 * 0.95 and ratios.max() <= 4 / 3 * 1.05


def test_box_falls_back_to_a_centred_crop_clamped_to_the_ratio() -> None:
    # no box of 90..100% of a 10 x 1000 strip has a ratio within 3/4..4/3: torchvision's fallback
    assert random_resized_crop_box(10, 1000, np.random.default_rng(0), scale=(0.9, 1.0)) == (0, 493, 10, 13)
    assert random_resized_crop_box(1000, 10, np.random.default_rng(0), scale=(0.9, 1.0)) == (493, 0, 13, 10)


def test_a_one_pixel_thin_image_falls_back_to_a_box_of_at_least_one_pixel() -> None:
    """A 1 x 100 strip under a ratio range of 0.2..0.33 clamps to a width of round(0.33) = 0: that empty box
    made the crop of the pixels a black image without a word, and the crop of the file a bad-argument error."""
    rng = np.random.default_rng(0)
    assert random_resized_crop_box(1, 100, rng, ratio=(0.2, 0.33)) == (0, 49, 1, 1)
    assert random_resized_crop_box(100, 1, rng, ratio=(3.0, 5.0)) == (49, 0, 1, 1)
    strip = np.arange(300, dtype=np.uint8).reshape(1, 100, 3)
    crop = RandomResizedCrop(8, ratio=(0.2, 0.33), seed=0)
    np.testing.assert_array_equal(crop(strip), np.broadcast_to(strip[0, 49], (8, 8, 3)))
    png = io.BytesIO()
    Image.fromarray(strip).save(png, "PNG")
    np.testing.assert_array_equal(crop.from_bytes(png.getvalue(), "strip.png"), np.broadcast_to(strip[0, 49], (8, 8, 3)))


def test_box_method_and_seeded_draws_repeat() -> None:
    a = RandomResizedCrop(32, seed=3)
    assert a.box(100, 120, np.random.default_rng(5)) == random_resized_crop_box(100, 120, np.random.default_rng(5))
    assert RandomResizedCrop(32, seed=3).box(100, 120) == RandomResizedCrop(32, seed=3).box(100, 120)


@pytest.mark.parametrize("bad", [dict(size=0), dict(size=(3, 4, 5)), dict(size=8, scale=(0.5, 0.1)),
                                 dict(size=8, ratio=(0, 1)), dict(size=8, backend="nvjpeg"), dict(size=8, flip_p=2)])
def test_bad_arguments_are_one_line_errors(bad: dict) -> None:
    with pytest.raises(ArgumentError):
        RandomResizedCrop(**bad)


def test_resized_shape_is_torchvisions() -> None:
    assert resized_shape(375, 500, 256) == (256, 341)
    assert resized_shape(500, 375, 256) == (341, 256)
    assert resized_shape(10, 20, (7, 9)) == (7, 9)


# --- the images: region decode against the full-decode reference ------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_crop_without_dct_scaling_equals_torchvisions(small_jpeg: bytes, backend: str) -> None:
    for seed in range(6):
        out = RandomResizedCrop(80, seed=seed, backend=backend).from_bytes(small_jpeg, "s.jpg", 0)
        box = random_resized_crop_box(150, 200, np.random.default_rng(seed))
        assert min(box[2], box[3]) < 2 * 80  # the DCT scale is 1 for these boxes
        assert out.dtype == np.uint8 and out.shape == (80, 80, 3) and out.flags.writeable
        assert_within_one(out, reference(small_jpeg, box, (80, 80)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dct_scaled_crop_stays_within_tolerance(large_jpeg: bytes, backend: str) -> None:
    scales = set()
    for seed in range(8):
        t = RandomResizedCrop(40, scale=(0.3, 1.0), seed=seed, backend=backend)
        box = random_resized_crop_box(480, 640, np.random.default_rng(seed), scale=(0.3, 1.0))
        scales.add(max(s for s in (8, 4, 2, 1) if box[2] >= s * 40 and box[3] >= s * 40))
        d = np.abs(t.from_bytes(large_jpeg, "l.jpg", 0).astype(np.int16) - reference(large_jpeg, box, (40, 40)))
        assert d.mean() <= MEAN_TOL and np.percentile(d, 99) <= P99_TOL, (seed, box, d.mean())
    assert scales >= {4, 8} or scales >= {2, 4}


def test_dct_scaled_crops_of_real_photographs_stay_within_tolerance() -> None:
    """scikit-learn's two photographs, saved as JPEGs are (quality 75 and 90, 4:2:0), cropped as training does."""
    sklearn = pytest.importorskip("sklearn.datasets", reason="scikit-learn ships the photographs")
    pooled, worst = [], (0.0, 0.0)
    for img in sklearn.load_sample_images().images:
        for quality in (75, 90):
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="JPEG", quality=quality)
            data = buf.getvalue()
            for out, seed in ((out, seed) for out in (56, 96) for seed in range(20)):
                box = random_resized_crop_box(*img.shape[:2], np.random.default_rng(seed))
                if min(box[2], box[3]) < 2 * out:
                    continue  # decoded at scale 1: the test above holds it within one level
                d = np.abs(RandomResizedCrop(out, seed=seed).from_bytes(data, "p.jpg").astype(np.int16)
                           - reference(data, box, (out, out))).ravel()
                pooled.append(d)
                worst = (max(worst[0], d.mean()), max(worst[1], np.percentile(d, 99)))
    d = np.concatenate(pooled)
    assert len(pooled) >= 100 and d.mean() <= MEAN_TOL and np.percentile(d, 99) <= P99_TOL
    assert worst[0] <= CROP_MEAN_TOL and worst[1] <= CROP_P99_TOL, worst


def test_the_resize_is_pillows_within_one_level() -> None:
    from cupy_nwt.data._resize import resize_box

    rng = np.random.default_rng(1)
    for trial in range(120):
        big_h, big_w = (int(v) for v in rng.integers(4, 90, 2))
        a = rng.integers(0, 256, (big_h, big_w, 3), dtype=np.uint8)
        h, w = int(rng.integers(1, big_h + 1)), int(rng.integers(1, big_w + 1))
        t, le = int(rng.integers(0, big_h - h + 1)), int(rng.integers(0, big_w - w + 1))
        oh, ow = (int(v) for v in rng.integers(1, 70, 2))
        if trial % 2:  # an integral box: cut out first, as torchvision's crop then resize
            ref = Image.fromarray(a).crop((le, t, le + w, t + h)).resize((ow, oh), Image.Resampling.BILINEAR)
            box: tuple[float, ...] = (t, le, h, w)
        else:  # a fractional box (a DCT-scaled crop): Pillow's resize(box=...)
            t0, l0 = t + 0.5 * rng.random(), le + 0.5 * rng.random()
            box = (t0, l0, rng.uniform(0.5, big_h - t0), rng.uniform(0.5, big_w - l0))
            ref = Image.fromarray(a).resize((ow, oh), Image.Resampling.BILINEAR,
                                            box=(box[1], box[0], box[1] + box[3], box[0] + box[2]))
        flip = bool(trial % 3 == 0)
        got = resize_box(a, box, oh, ow, flip=flip)  # type: ignore[arg-type]
        assert_within_one(got[:, ::-1] if flip else got, np.asarray(ref))


def test_both_bindings_agree(large_jpeg: bytes) -> None:
    a = RandomResizedCrop(48, seed=1, backend="simplejpeg").from_bytes(large_jpeg, "l.jpg")
    b = RandomResizedCrop(48, seed=1, backend="pillow").from_bytes(large_jpeg, "l.jpg")
    assert np.abs(a.astype(np.int16) - b).max() <= 1


def test_flip_and_normalize_ride_in_the_resize(large_jpeg: bytes) -> None:
    from cupy_nwt.data import IMAGENET_MEAN, IMAGENET_STD

    plain = RandomResizedCrop(48, seed=7).from_bytes(large_jpeg, "l.jpg")
    fused = RandomResizedCrop(48, seed=7, flip_p=1.0, normalize=(IMAGENET_MEAN, IMAGENET_STD)).from_bytes(large_jpeg, "l.jpg")
    mean, std = np.array(IMAGENET_MEAN, np.float32), np.array(IMAGENET_STD, np.float32)
    expected = ((plain[:, ::-1].astype(np.float32) / 255 - mean) / std).transpose(2, 0, 1)
    assert fused.dtype == np.float32 and fused.shape == (3, 48, 48)
    np.testing.assert_allclose(fused, expected, atol=1e-5)
    assert np.array_equal(RandomResizedCrop(48, seed=7, flip_p=0.0)(photo(60, 70)),
                          RandomResizedCrop(48, seed=7)(photo(60, 70)))
    with pytest.raises(ArgumentError):
        RandomResizedCrop(48, normalize=((0.5, 0.5), (1.0, 1.0)))


def test_called_on_pixels_it_crops_like_torchvision() -> None:
    img = photo(90, 120)
    out = RandomResizedCrop((30, 40), seed=2)(img)
    top, left, h, w = random_resized_crop_box(90, 120, np.random.default_rng(2))
    ref = Image.fromarray(img).crop((left, top, left + w, top + h)).resize((40, 30), Image.Resampling.BILINEAR)
    assert_within_one(out, np.asarray(ref))


def test_resize_then_center_crop_is_the_eval_recipe(large_jpeg: bytes) -> None:
    out = Compose([Resize(96), CenterCrop(80)]).from_bytes(large_jpeg, "l.jpg")
    with Image.open(io.BytesIO(large_jpeg)) as im:
        full = np.asarray(im.convert("RGB").resize((128, 96), Image.Resampling.BILINEAR))
    ref = full[8:88, 24:104]
    d = np.abs(out.astype(np.int16) - ref)
    assert out.shape == (80, 80, 3) and d.mean() <= MEAN_TOL and np.percentile(d, 99) <= P99_TOL
    padded = CenterCrop(6)(np.ones((4, 4, 3), np.uint8))
    assert padded.shape == (6, 6, 3) and padded[0].sum() == 0 and padded[1:5, 1:5].all()


def test_png_and_grayscale_take_the_whole_decode_path() -> None:
    from cupy_nwt.data import encode_png

    img = photo(60, 80)
    top, left, h, w = random_resized_crop_box(60, 80, np.random.default_rng(4))
    out = RandomResizedCrop(24, seed=4).from_bytes(encode_png(img), "p.png")
    ref = Image.fromarray(img).crop((left, top, left + w, top + h)).resize((24, 24), Image.Resampling.BILINEAR)
    assert_within_one(out, np.asarray(ref))
    gray = io.BytesIO()
    Image.fromarray(img[..., 0]).save(gray, format="JPEG", quality=90)
    assert RandomResizedCrop(24, seed=4).from_bytes(gray.getvalue(), "g.jpg").shape == (24, 24, 3)


# --- the datasets hand the bytes over ----------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for k in range(6):
        d = tmp_path / f"c{k % 2}"
        d.mkdir(exist_ok=True)
        (d / f"{k}.jpg").write_bytes(jpeg(photo(70 + k, 90, seed=k)))
    return tmp_path


def test_image_folder_and_loader_make_the_imagenet_batch(folder: Path) -> None:
    ds = ImageFolder(folder, transform=Compose([RandomResizedCrop(32, seed=0), RandomHorizontalFlip()]))
    img, label = ds[0]
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8 and label == 0
    batches = list(DataLoader(ds, batch_size=4, device="cpu", batch_transform=NormalizeBatch(), output="numpy"))
    assert [b[0].shape for b in batches] == [(4, 3, 32, 32), (2, 3, 32, 32)]
    assert batches[0][0].dtype == np.float32


def test_tar_and_stream_decode_the_region(tmp_path: Path) -> None:
    images = np.stack([photo(64, 80, seed=k) for k in range(4)])
    shard = write_tar_shard(tmp_path / "s.tar", images, [0, 1, 0, 1], fmt="jpeg")
    ds = TarImageDataset(shard, transform=RandomResizedCrop(16, seed=0))
    assert all(ds[i][0].shape == (16, 16, 3) for i in range(4))
    stream = ShardedTarStream([shard], transform=RandomResizedCrop(16, seed=0))
    assert [img.shape for img, _ in stream] == [(16, 16, 3)] * 4


# --- corrupt and truncated JPEGs: one error on every CPU path ----------------------------------


def _one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert "\n" not in msg and "0x" not in msg
    return msg


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
@pytest.mark.parametrize("transform", ["none", *BACKENDS])
def test_damaged_jpeg_in_a_folder_is_a_corrupt_image_error(folder: Path, damage: str, transform: str) -> None:
    victim = folder / "c1" / "3.jpg"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2] if damage == "truncated" else data[:4] + b"\x00" * 200)
    t = None if transform == "none" else RandomResizedCrop(16, backend=transform)
    ds = ImageFolder(folder, transform=t)
    index = [str(ds.path(i)) for i in range(len(ds))].index(str(victim))
    with pytest.raises(CorruptImageError) as err:
        ds[index]
    assert str(victim) in _one_line(err.value) and err.value.sample_index == index


@pytest.mark.parametrize("transform", ["none", *BACKENDS])
def test_truncated_jpeg_in_a_tar_names_the_member(tmp_path: Path, transform: str) -> None:
    import tarfile

    good = jpeg(photo(64, 64))
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w") as tf:
        for k, data in enumerate([good, good[: len(good) // 3], good]):
            info = tarfile.TarInfo(f"{k}/{k}.jpg")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    t = None if transform == "none" else RandomResizedCrop(16, backend=transform)
    with pytest.raises(CorruptImageError) as err:
        TarImageDataset(path, transform=t)[1]
    assert "1/1.jpg" in _one_line(err.value) and err.value.sample_index == 1
    with pytest.raises(CorruptImageError) as err:
        list(ShardedTarStream([path], transform=t))
    assert "1/1.jpg" in _one_line(err.value)


def _declaring(width: int, height: int, progressive: bool) -> bytes:
    """A small JPEG whose frame header declares ``width`` x ``height``: a few hundred bytes, a huge image."""
    import struct

    buf = io.BytesIO()
    Image.fromarray(np.full((32, 32, 3), 128, np.uint8)).save(buf, "JPEG", progressive=progressive)
    data = buf.getvalue()
    sof = data.index(b"\xff\xc2" if progressive else b"\xff\xc0")
    return data[: sof + 5] + struct.pack(">HH", height, width) + data[sof + 9:]


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_jpeg_declaring_a_huge_image_is_refused_as_pillow_refuses_it_before_any_decoding(folder: Path, backend,
                                                                                          progressive) -> None:
    """Pillow (so torchvision) refuses over twice ``MAX_IMAGE_PIXELS`` at open; simplejpeg set up 12 GiB for
    such a file before failing. On every path: the folder's one-line error, and ``on_bad_sample="skip"``."""
    victim = folder / "c1" / "3.jpg"
    victim.write_bytes(_declaring(65500, 65500, progressive))
    for t in (RandomResizedCrop(16, backend=backend), Resize((16, 16), backend=backend)):
        ds = ImageFolder(folder, transform=t)
        index = [str(ds.path(i)) for i in range(len(ds))].index(str(victim))
        with pytest.raises(CorruptImageError) as err:
            ds[index]
        assert str(victim) in _one_line(err.value) and err.value.sample_index == index
        kept = list(DataLoader(ds, batch_size=len(ds), num_workers=1, device="cpu", on_bad_sample="skip"))
        assert [len(b[1]) for b in kept] == [len(ds) - 1]


def test_a_jpeg_libjpeg_only_warns_about_decodes_as_torchvision_would(small_jpeg: bytes) -> None:
    sos = small_jpeg.index(b"\xff\xda")
    odd = small_jpeg[:sos] + b"\x00\x00" + small_jpeg[sos:]  # "2 extraneous bytes before marker 0xda"
    with Image.open(io.BytesIO(odd)) as im:
        im.load()  # Pillow (and so torchvision) decodes it
    a = RandomResizedCrop(40, seed=3, backend="simplejpeg").from_bytes(odd, "odd.jpg")
    b = RandomResizedCrop(40, seed=3, backend="pillow").from_bytes(odd, "odd.jpg")
    np.testing.assert_array_equal(a, b)


def test_corrupt_jpeg_through_workers_keeps_its_type_and_index(folder: Path) -> None:
    victim = folder / "c0" / "2.jpg"
    victim.write_bytes(victim.read_bytes()[:300])
    ds = ImageFolder(folder, transform=RandomResizedCrop(16))
    index = [str(ds.path(i)) for i in range(len(ds))].index(str(victim))
    for workers in (0, 1):
        with pytest.raises(CorruptImageError) as err:
            list(DataLoader(ds, batch_size=2, num_workers=workers, device="cpu"))
        assert str(victim) in str(err.value).splitlines()[0] and err.value.sample_index == index


@pytest.mark.parametrize("channels", [1, 4])
def test_normalize_takes_rgb_images_only(channels) -> None:
    """Its mean and std are per RGB channel: a grey or RGBA image is named, not normalised with the wrong ones."""
    image = np.full((50, 60, channels), 128, np.uint8)
    with pytest.raises(ArgumentError, match=rf"takes RGB images \(H x W x 3\), got {channels} channel"):
        RandomResizedCrop(16, seed=0, normalize=(IMAGENET_MEAN, IMAGENET_STD))(image)
    assert RandomResizedCrop(16, seed=0)(image).shape == (16, 16, channels)  # resized as it is without normalize


@pytest.mark.parametrize("normalize", [((math.nan, 0, 0), (1, 1, 1)), ((0, 0, 0), (1, math.inf, 1)),
                                       ((0, 0, 0), (1, 0, 1)), ((0, 0, 0), (1, -1, 1))])
def test_a_normalisation_that_would_give_nan_pixels_is_refused(normalize) -> None:
    with pytest.raises(ArgumentError, match=r"^mean must be finite and std finite and positive, got mean="):
        RandomResizedCrop(16, normalize=normalize)


def test_an_empty_image_or_box_size_is_named_not_divided_by() -> None:
    with pytest.raises(ArgumentError, match=r"needs a non-empty uint8 H x W x C image, got uint8 \(0, 0, 3\)"):
        RandomResizedCrop(16)(np.zeros((0, 0, 3), np.uint8))
    with pytest.raises(ArgumentError, match=r"needs a non-empty uint8 H x W x C image"):
        Resize(16)(np.zeros((0, 5, 3), np.uint8))
    rng = np.random.default_rng(0)
    with pytest.raises(ArgumentError, match=r"^height must be a positive integer, got 0$"):
        random_resized_crop_box(0, 0, rng)
    with pytest.raises(ArgumentError, match=r"^height must be a positive integer, got -5$"):
        random_resized_crop_box(-5, 10, rng)
    with pytest.raises(ArgumentError, match=r"^seed must be a non-negative integer or None, got -1$"):
        RandomResizedCrop(16, seed=-1)
