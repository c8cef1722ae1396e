"""EncodedJpegs: what workers make for GPU decoding (bytes, crop box, flip), and the JPEG header walk behind it."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cupy_nwt import DataLoader
from cupy_nwt.data import EncodedJpegs, ImageFolder, TarImageDataset, jpeg_size, write_tar_shard
from cupy_nwt.data.jpeg_bytes import SampleRng
from cupy_nwt.errors import ArgumentError, CorruptImageError, DataError


def jpeg(h: int, w: int, seed: int = 0, quality: int = 90, **save: object) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=quality, **save)
    return buf.getvalue()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for c in range(2):
        (tmp_path / f"c{c}").mkdir()
        for i in range(6):
            (tmp_path / f"c{c}" / f"{i}.jpg").write_bytes(jpeg(40 + 3 * i, 60 - 2 * i, seed=10 * c + i))
    return tmp_path


@pytest.mark.parametrize("save", [{}, {"progressive": True}, {"subsampling": 0}])
def test_jpeg_size_reads_the_frame_header(save):
    assert jpeg_size(jpeg(37, 53, **save)) == (37, 53)
    gray = io.BytesIO()
    Image.fromarray(np.zeros((9, 11), np.uint8)).save(gray, format="JPEG")
    assert jpeg_size(gray.getvalue()) == (9, 11)


@pytest.mark.parametrize(("data", "why"), [
    (b"\x89PNG\r\n\x1a\n....", "no JPEG start-of-image marker"),
    (b"", "no JPEG start-of-image marker"),
    (jpeg(20, 20)[:-2], "cut short: no end-of-image marker"),
    (jpeg(20, 20)[:300], "cut short"),
    (jpeg(20, 20)[:30], "cut short"),
])
def test_not_a_whole_jpeg_is_one_line_naming_the_file(data, why):
    with pytest.raises(CorruptImageError, match=rf"^x/1\.jpg: not a decodable JPEG \(({why})") as err:
        jpeg_size(data, "x/1.jpg", 7)
    assert err.value.sample_index == 7 and "\n" not in str(err.value)


def test_samples_hold_the_padded_bytes_a_box_inside_the_image_and_a_flip(folder):
    images = ImageFolder(folder)
    ds = EncodedJpegs(images, max_bytes=64 * 1024, seed=3)
    for i in range(len(ds)):
        s = ds[i]
        raw = images.path(i).read_bytes()
        assert s["jpeg"].shape == (64 * 1024,) and s["nbytes"] == len(raw)
        assert s["jpeg"][:len(raw)].tobytes() == raw and not s["jpeg"][len(raw):].any()
        top, left, h, w = s["box"]
        height, width = jpeg_size(raw)
        assert 0 <= top and 0 <= left and 0 < h and 0 < w and top + h <= height and left + w <= width
        assert s["index"] == i and s["label"] == images.labels[i]
    flips = [bool(EncodedJpegs(images, seed=s)[0]["flip"]) for s in range(40)]
    assert 5 < sum(flips) < 35


def test_draws_depend_on_seed_epoch_and_index_only(folder):
    ds = EncodedJpegs(ImageFolder(folder), seed=5)
    again = pickle.loads(pickle.dumps(ds))  # a worker's copy
    assert all((ds[i]["box"] == again[i]["box"]).all() and ds[i]["flip"] == again[i]["flip"] for i in range(len(ds)))
    first = [tuple(ds[i]["box"]) for i in range(len(ds))]
    ds.set_epoch(1)
    assert [tuple(ds[i]["box"]) for i in range(len(ds))] != first


def test_batches_are_the_same_at_any_worker_count(folder):
    ds = EncodedJpegs(ImageFolder(folder), max_bytes=8192, seed=11)
    runs = []
    for workers in (0, 2):
        with DataLoader(ds, batch_size=4, num_workers=workers) as dl:
            runs.append([{k: np.array(v) for k, v in b.items()} for b in dl])
    for a, b in zip(*runs):
        for key in ("jpeg", "nbytes", "box", "flip", "index", "label"):
            np.testing.assert_array_equal(a[key], b[key])
    assert runs[0][0]["jpeg"].shape == (4, 8192)


def test_crop_modes(folder):
    images = ImageFolder(folder)
    h, w = jpeg_size(images.path(0).read_bytes())
    assert tuple(EncodedJpegs(images, crop="full")[0]["box"]) == (0, 0, h, w)
    side = round(min(h, w) * 224 / 256)
    assert tuple(EncodedJpegs(images, crop="center")[0]["box"]) == ((h - side) // 2, (w - side) // 2, side, side)
    assert tuple(EncodedJpegs(images, crop=lambda hh, ww, rng: (1, 2, 3, 4))[0]["box"]) == (1, 2, 3, 4)

    class Crop:  # a CPU crop transform that can also say its box
        def box(self, hh, ww, rng):
            return 0, 1, hh - 2, int(rng.integers(1, ww))

    top, left, bh, bw = EncodedJpegs(images, crop=Crop())[0]["box"]
    assert (top, left, bh) == (0, 1, h - 2) and 1 <= bw < w
    with pytest.raises(ArgumentError, match="not inside"):
        EncodedJpegs(images, crop=lambda hh, ww, rng: (0, 0, hh + 1, ww))[0]


def test_random_resized_boxes_keep_torchvisions_scale_and_ratio(folder):
    ds = EncodedJpegs(ImageFolder(folder), scale=(0.25, 0.5), ratio=(0.8, 1.25), seed=0)
    h, w = jpeg_size(ds.read_bytes(0))
    for epoch in range(30):
        ds.set_epoch(epoch)
        _, _, bh, bw = ds[0]["box"]
        if (bh, bw) != (h, w):  # not the fallback
            assert 0.2 <= bh * bw / (h * w) <= 0.56 and 0.7 <= bw / bh <= 1.4


def test_tar_members_and_errors_name_the_member(tmp_path):
    shard = tmp_path / "s.tar"
    imgs = np.random.default_rng(0).integers(0, 256, (3, 24, 32, 3), dtype=np.uint8)
    write_tar_shard(shard, imgs, np.array([0, 1, 2]), fmt="jpeg")
    ds = EncodedJpegs(TarImageDataset(shard), max_bytes=16384)
    assert ds[2]["label"] == 2 and jpeg_size(ds[2]["jpeg"][:ds[2]["nbytes"]]) == (24, 32)
    with pytest.raises(DataError, match=r"s\.tar member '1/000001\.jpg' \(sample 1\): \d+ bytes, more than max_bytes=100"):
        EncodedJpegs(TarImageDataset(shard), max_bytes=100)[1]


def test_a_corrupt_file_fails_in_the_worker_naming_it(folder):
    bad = folder / "c1" / "3.jpg"
    bad.write_bytes(bad.read_bytes()[:-100])
    ds = EncodedJpegs(ImageFolder(folder))
    with pytest.raises(CorruptImageError, match=rf"^{bad} \(sample 9\): not a decodable JPEG \(cut short") as err:
        ds[9]
    assert err.value.sample_index == 9


def test_bad_arguments():
    with pytest.raises(ArgumentError, match="read_bytes"):
        EncodedJpegs([b"x"])
    with pytest.raises(ArgumentError, match="max_bytes"):
        EncodedJpegs(ImageFolder.__new__(ImageFolder), max_bytes=0)
    with pytest.raises(ArgumentError, match="crop must be"):
        EncodedJpegs(ImageFolder.__new__(ImageFolder), crop="random")


def test_sample_draws_are_uniform_and_keyed_by_seed_epoch_index():
    u = np.array([SampleRng(1, 0, i).random() for i in range(4000)])
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02 and abs(np.median(u) - 0.5) < 0.03
    ints = np.array([SampleRng(2, 3, i).integers(3, 10) for i in range(4000)])
    assert set(ints.tolist()) == set(range(3, 10)) and np.bincount(ints)[3:].min() > 450
    assert all(3.0 <= SampleRng(4, 0, i).uniform(3.0, 3.5) < 3.5 for i in range(100))
    draws = {(s, e, i): SampleRng(s, e, i).random() for s in (0, 1) for e in (0, 1) for i in (0, 1)}
    assert len(set(draws.values())) == 8 and SampleRng(1, 1, 1).random() == draws[1, 1, 1]
    with pytest.raises(ArgumentError, match="low < high"):
        SampleRng(0, 0, 0).integers(5, 5)


def test_a_corrupt_file_read_by_a_worker_reaches_the_loop_naming_it(folder):
    bad = folder / "c0" / "2.jpg"
    bad.write_bytes(bad.read_bytes()[:-100])
    with DataLoader(EncodedJpegs(ImageFolder(folder), max_bytes=8192), batch_size=4, num_workers=2) as dl:
        with pytest.raises(CorruptImageError, match=rf"{bad} \(sample 2\): not a decodable JPEG \(cut short") as err:
            list(dl)
    assert err.value.sample_index == 2
