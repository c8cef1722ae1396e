"""Datasets: arrays, image folders, tar shards, CIFAR-10 batches, the synthetic CIFAR-10, and dispatch."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import pickle
import stat
import tarfile

import numpy as np
import pytest
from PIL import Image

from cupy_nwt import DataLoader
from cupy_nwt.data.datasets import (
    CIFAR10,
    ArrayDataset,
    CacheRebuiltWarning,
    ImageFolder,
    SyntheticCIFAR10,
    TarImageDataset,
    encode_png,
    encode_png_batch,
    open_dataset,
    write_tar_shard,
)
from cupy_nwt.errors import ArgumentError, CorruptImageError, DataError, DataFileError


@pytest.fixture
def images() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (12, 8, 10, 3), dtype=np.uint8)


@pytest.fixture
def labels() -> np.ndarray:
    return np.arange(12) % 3


# --- encoding --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 1), (5, 7, 3), (5, 7, 4)])
def test_encode_png_round_trips_through_pillow(tmp_path, shape):
    a = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    data = encode_png(a)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(data)) as img:
        back = np.array(img)
    np.testing.assert_array_equal(back.reshape(a.shape), a)


def test_encode_png_batch_matches_single_and_rejects_bad_input(images):
    assert encode_png_batch(images) == [encode_png(x) for x in images]
    with pytest.raises(ValueError, match="uint8"):
        encode_png(images[0].astype(np.float32))
    with pytest.raises(ValueError, match="channels"):
        encode_png(np.zeros((4, 4, 2), np.uint8))


# --- ArrayDataset ----------------------------------------------------------------------------


def test_array_dataset_rows_getitems_and_transform(images, labels):
    d = ArrayDataset(images, labels)
    assert len(d) == 12
    img, lab = d[3]
    np.testing.assert_array_equal(img, images[3])
    assert lab == labels[3]
    assert d[-1][1] == labels[-1]
    batch = d.__getitems__([5, 0, 5])
    assert len(batch) == 3
    np.testing.assert_array_equal(batch[0][0], images[5])
    assert [int(b[1]) for b in batch] == [labels[5], labels[0], labels[5]]
    t = ArrayDataset(images, labels, transform=lambda x: x[:2])
    assert t[0][0].shape == (2, 10, 3)
    assert t.__getitems__([1])[0][0].shape == (2, 10, 3)


def test_array_dataset_errors(images, labels):
    with pytest.raises(ValueError, match="first dimension"):
        ArrayDataset(images, labels[:5])
    with pytest.raises(ValueError, match="at least one"):
        ArrayDataset()
    with pytest.raises(ValueError, match="scalar"):
        ArrayDataset(np.float32(1))
    d = ArrayDataset(images, labels)
    with pytest.raises(IndexError):
        d[12]
    with pytest.raises(IndexError):
        d.__getitems__([0, 12])


def test_array_dataset_pickles_memmaps_by_file_not_by_value(tmp_path):
    big = np.arange(200_000, dtype=np.int64).reshape(1000, 200)
    np.save(tmp_path / "x.npy", big)
    d = ArrayDataset(np.load(tmp_path / "x.npy", mmap_mode="r"), np.arange(1000))
    blob = pickle.dumps(d)
    assert len(blob) < big.nbytes // 10
    back = pickle.loads(blob)
    assert isinstance(back.arrays[0], np.memmap)
    np.testing.assert_array_equal(back[777][0], big[777])


def test_an_array_dataset_over_a_w_plus_memmap_reaches_spawned_workers_and_keeps_the_file(tmp_path):
    """A memmap made with ``"w+"`` (create the file) and filled: spawned workers once re-created the file
    empty, and every batch came back zeros."""
    made = np.memmap(tmp_path / "x.dat", dtype=np.int64, mode="w+", shape=(16, 4))
    made[:] = np.arange(64).reshape(16, 4) + 1
    made.flush()
    with DataLoader(ArrayDataset(made), batch_size=4, num_workers=1, multiprocessing_context="spawn") as dl:
        rows = np.concatenate([b[0] for b in dl])
    np.testing.assert_array_equal(rows, np.arange(64).reshape(16, 4) + 1)
    assert np.fromfile(tmp_path / "x.dat", dtype=np.int64)[:3].tolist() == [1, 2, 3]


def test_a_npy_replaced_after_the_dataset_opened_it_is_refused_not_read(tmp_path):
    """``open_dataset`` maps the file; a newer export renamed over it must not reach the workers silently."""
    np.save(tmp_path / "x.npy", np.arange(64, dtype=np.int64).reshape(16, 4))
    ds = open_dataset(tmp_path / "x.npy")
    np.save(tmp_path / "y.npy", -np.arange(64, dtype=np.int64).reshape(16, 4))
    os.replace(tmp_path / "y.npy", tmp_path / "x.npy")
    with pytest.raises(DataFileError, match="x.npy: was replaced by another file after the main process mapped it"):
        pickle.loads(pickle.dumps(ds))
    with pytest.raises(DataFileError, match="failed on unpickling its dataset: .*x.npy: was replaced"):
        with DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn") as dl:
            list(dl)
    np.testing.assert_array_equal(ds[5][0], [20, 21, 22, 23])  # the main process still reads the file it opened


# --- ImageFolder -----------------------------------------------------------------------------


def _write_folder(root, images, labels, names=("cat", "ant", "bee")):
    for i, (img, lab) in enumerate(zip(images, labels)):
        sub = root / names[lab] / ("nested" if i % 4 == 0 else "")
        sub.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(sub / f"{i:03d}.png")
    (root / "cat" / "notes.txt").write_text("not an image")


def test_image_folder_labels_follow_sorted_class_names(tmp_path, images, labels):
    _write_folder(tmp_path, images, labels)
    d = ImageFolder(tmp_path)
    assert d.classes == ["ant", "bee", "cat"]
    assert len(d) == 12
    for i in range(len(d)):
        img, lab = d[i]
        k = int(d.path(i).stem)
        np.testing.assert_array_equal(img, images[k])
        assert d.classes[lab] == ("cat", "ant", "bee")[labels[k]]
    assert isinstance(d._paths, np.ndarray) and d._paths.dtype.kind == "S"


def test_image_folder_indexes_files_in_torchvisions_order(tmp_path):
    """torchvision lists ``sorted(os.walk(class_dir))``: folders by their whole path, so ``a/x`` (``/`` is
    0x2F) comes after ``a b``, ``a-b`` and ``a.b``; an index must name the same file in both."""
    pixels = np.zeros((2, 2, 3), np.uint8)
    for sub in ["", "a", "a/x", "a b", "a-b", "a.b", "B"]:
        (tmp_path / "c" / sub).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(tmp_path / "c" / sub / "i.png")
    d = ImageFolder(tmp_path)
    listed = [d.path(i).relative_to(tmp_path).as_posix() for i in range(len(d))]
    assert listed == ["c/i.png", "c/B/i.png", "c/a/i.png", "c/a b/i.png", "c/a-b/i.png", "c/a.b/i.png",
                      "c/a/x/i.png"]


def test_a_class_folder_without_images_is_refused_unless_allowed(tmp_path, images, labels):
    """A stray ``.ipynb_checkpoints`` beside the classes would take label 0 and shift every real class by one;
    torchvision refuses such a folder (``allow_empty=False``), and so does this."""
    _write_folder(tmp_path, images, labels)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / "dog").mkdir()
    (tmp_path / "dog" / "notes.txt").write_text("no image")
    with pytest.raises(ArgumentError, match=r"class folders '.ipynb_checkpoints', 'dog' of .*allow_empty=True"):
        ImageFolder(tmp_path)
    kept = ImageFolder(tmp_path, allow_empty=True)
    assert kept.classes == [".ipynb_checkpoints", "ant", "bee", "cat", "dog"] and len(kept) == 12
    assert sorted(set(kept.labels.tolist())) == [1, 2, 3]


def test_image_folder_converts_grayscale_to_rgb_and_names_corrupt_files(tmp_path):
    (tmp_path / "a").mkdir()
    Image.fromarray(np.full((4, 5), 7, np.uint8)).save(tmp_path / "a" / "g.png")
    (tmp_path / "a" / "h.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    d = ImageFolder(tmp_path)
    img, _ = d[0]
    assert img.shape == (4, 5, 3) and img.dtype == np.uint8 and (img == 7).all()
    with pytest.raises(CorruptImageError, match="h.png"):
        d[1]


def test_image_folder_lists_each_image_once_under_a_link_loop(tmp_path, images, labels):
    """``os.walk`` follows a link back to a folder it is inside until the kernel stops resolving links,
    listing those images dozens of times; a link to a folder elsewhere is still followed."""
    _write_folder(tmp_path / "data", images, labels)
    (tmp_path / "data" / "cat" / "nested" / "again").symlink_to(tmp_path / "data" / "cat")
    (tmp_path / "data" / "ant" / "root").symlink_to(tmp_path / "data")
    (tmp_path / "more" / "x").mkdir(parents=True)
    Image.fromarray(images[0]).save(tmp_path / "more" / "x" / "extra.png")
    (tmp_path / "data" / "bee" / "more").symlink_to(tmp_path / "more")
    d = ImageFolder(tmp_path / "data")
    assert len(d) == len(images) + 1
    assert sorted(d.path(i).name for i in range(len(d))) == sorted([f"{i:03d}.png" for i in range(12)] + ["extra.png"])


def test_image_folder_refuses_a_folder_it_cannot_list(tmp_path, images, labels, monkeypatch):
    _write_folder(tmp_path, images, labels)
    listing = os.scandir

    def scandir(path="."):
        if str(path).endswith("nested"):
            raise PermissionError(13, "Permission denied", str(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(DataError, match=r"ImageFolder: cannot list .*nested \(Permission denied\)"):
        ImageFolder(tmp_path)


def test_a_file_gone_since_indexing_is_one_data_error_naming_it_and_the_sample(tmp_path, images, labels):
    """A file removed after the folder was indexed (or a dangling link) fails as that sample's ``DataError``,
    as a corrupt image does, not as a bare ``FileNotFoundError`` from deep inside ``pathlib``."""
    from cupy_nwt.data import EncodedJpegs

    _write_folder(tmp_path, images, labels)
    d = ImageFolder(tmp_path)
    gone = d.path(5)
    gone.unlink()
    with pytest.raises(DataError, match=r"^.*\.png \(sample 5\): cannot be read \(no such file: ") as info:
        d[5]
    assert str(gone) in str(info.value) and "\n" not in str(info.value)
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)
    with pytest.raises(DataError, match=r"\(sample 5\): cannot be read"):
        EncodedJpegs(d)[5]
    np.testing.assert_array_equal(d[4][0], images[int(d.path(4).stem)])


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        ImageFolder(tmp_path / "missing")
    with pytest.raises(ValueError, match="no class"):
        ImageFolder(tmp_path)
    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError, match="no images"):
        ImageFolder(tmp_path)


# --- tar shards ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["s.tar", "s.tar.gz", "s.tgz"])
def test_tar_dataset_reads_back_exact_pixels_and_labels(tmp_path, images, labels, name):
    path = write_tar_shard(tmp_path / name, images, labels)
    d = TarImageDataset(path, cache_dir=tmp_path / "cache")
    assert len(d) == 12 and d.classes == ["0", "1", "2"]
    for i in range(12):
        img, lab = d[i]
        np.testing.assert_array_equal(img, images[i])
        assert lab == labels[i]
    if name != "s.tar":
        assert d.tar_path.parent == tmp_path / "cache" / "tar"
        mtime = d.tar_path.stat().st_mtime_ns
        again = TarImageDataset(path, cache_dir=tmp_path / "cache")
        assert again.tar_path == d.tar_path and again.tar_path.stat().st_mtime_ns == mtime


def test_tar_shard_is_reproducible_and_checks_lengths(tmp_path, images, labels):
    a = write_tar_shard(tmp_path / "a.tar.gz", images, labels).read_bytes()
    b = write_tar_shard(tmp_path / "b.tar.gz", images, labels).read_bytes()
    assert a == b
    with pytest.raises(ValueError, match="12 images but 3 labels"):
        write_tar_shard(tmp_path / "c.tar", images, labels[:3])
    with pytest.raises(ValueError, match="format"):
        write_tar_shard(tmp_path / "c.tar", images, labels, fmt="gif")
    with pytest.raises(ValueError, match="2 class names"):
        write_tar_shard(tmp_path / "c.tar", images, labels, class_names=["a", "b"])
    assert not list(tmp_path.glob(".c.tar*"))


def test_tar_dataset_jpeg_and_named_classes(tmp_path, images, labels):
    smooth = np.repeat(np.repeat(images[:, :2, :2], 4, axis=1), 5, axis=2)
    path = write_tar_shard(tmp_path / "j.tar", smooth, labels, fmt="jpeg", class_names=["zebra", "ant", "yak"])
    d = TarImageDataset(path)
    assert d.classes == ["ant", "yak", "zebra"]
    img, lab = d[0]
    assert img.shape == (8, 10, 3)
    assert d.classes[lab] == "zebra"
    assert np.abs(img.astype(int) - smooth[0]).mean() < 20


def test_tar_numeric_class_dirs_sort_numerically(tmp_path, images):
    path = write_tar_shard(tmp_path / "n.tar", images[:3], [2, 10, 1])
    d = TarImageDataset(path)
    assert d.classes == ["1", "2", "10"]
    assert [d[i][1] for i in range(3)] == [2, 10, 1]


def test_tar_corrupt_member_error_names_the_member(tmp_path, images, labels):
    path = tmp_path / "bad.tar"
    good = encode_png(images[0])
    with tarfile.open(path, "w") as tf:
        for name, data in (("3/ok.png", good), ("4/broken.png", good[:40])):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    d = TarImageDataset(path)
    np.testing.assert_array_equal(d[0][0], images[0])
    with pytest.raises(CorruptImageError, match=r"4/broken\.png"):
        d[1]


def test_tar_dataset_errors(tmp_path, images):
    with pytest.raises(FileNotFoundError):
        TarImageDataset(tmp_path / "missing.tar")
    (tmp_path / "junk.tar").write_bytes(b"definitely not a tar archive" * 40)
    with pytest.raises(ValueError, match="not a readable tar"):
        TarImageDataset(tmp_path / "junk.tar")
    flat = tmp_path / "flat.tar"
    with tarfile.open(flat, "w") as tf:
        data = encode_png(images[0])
        info = tarfile.TarInfo("top.png")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match="top.png.*class directory"):
        TarImageDataset(flat)


def _read_label_and_sum(d, i):
    img, lab = d[i]
    return os.getpid(), lab, int(img.sum()), d._fd_pid


def test_tar_dataset_opens_one_descriptor_per_process(tmp_path, images, labels):
    d = TarImageDataset(write_tar_shard(tmp_path / "s.tar", images, labels))
    d[0]
    parent_fd = d._fd
    state = pickle.loads(pickle.dumps(d))
    assert state._fd is None
    with mp.get_context("fork").Pool(2) as pool:
        out = pool.starmap(_read_label_and_sum, [(d, i) for i in range(12)])
    for i, (pid, lab, total, fd_pid) in enumerate(out):
        assert fd_pid == pid != os.getpid()
        assert lab == labels[i] and total == int(images[i].sum())
    assert d._fd == parent_fd and d._fd_pid == os.getpid()
    d.close()


# --- CIFAR-10 --------------------------------------------------------------------------------


def _write_cifar(base, n_per_batch=4):
    base.mkdir(parents=True)
    rng = np.random.default_rng(5)
    truth = {}
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
        labs = rng.integers(0, 10, n_per_batch).tolist()
        batch = {b"batch_label": name.encode(), b"labels": labs, b"data": data,
                 b"filenames": [f"{name}_{i}.png".encode() for i in range(n_per_batch)]}
        with open(base / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
        truth[name] = (data, labs)
    return truth


def test_cifar10_reads_the_python_batches_as_hwc(tmp_path):
    truth = _write_cifar(tmp_path / "cifar-10-batches-py")
    train = CIFAR10(tmp_path)
    test = CIFAR10(tmp_path / "cifar-10-batches-py", train=False)
    assert len(train) == 20 and len(test) == 4
    data, labs = truth["data_batch_2"]
    img, lab = train[5]
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8
    np.testing.assert_array_equal(img[:, :, 1], data[1, 1024:2048].reshape(32, 32))
    assert lab == labs[1] and isinstance(lab, int)
    got = train.__getitems__([5, 0])
    assert got[0][1] == labs[1] and isinstance(got[1][1], int)
    np.testing.assert_array_equal(test[3][0][:, :, 2], truth["test_batch"][0][3, 2048:].reshape(32, 32))


def test_cifar10_missing_batch_is_named(tmp_path):
    _write_cifar(tmp_path / "c")
    (tmp_path / "c" / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_4"):
        CIFAR10(tmp_path / "c")
    with pytest.raises(FileNotFoundError, match="test_batch"):
        CIFAR10(tmp_path / "empty", train=False)


def test_cifar10_refuses_pickles_that_would_run_code(tmp_path):
    _write_cifar(tmp_path / "c")
    with open(tmp_path / "c" / "test_batch", "wb") as f:
        pickle.dump({b"data": os.getcwd, b"labels": []}, f)
    with pytest.raises(ValueError, match="not a CIFAR-10 python batch.*posix.getcwd"):
        CIFAR10(tmp_path / "c", train=False)


# --- SyntheticCIFAR10 ------------------------------------------------------------------------


def test_synthetic_is_cifar_shaped_varied_and_compressed(tmp_path):
    d = SyntheticCIFAR10(n=1100, seed=0, cache_dir=tmp_path)
    assert len(d) == 1100 and d.built_now
    labs = np.asarray(d.labels)
    assert set(labs.tolist()) == set(range(10))
    assert np.bincount(labs).min() >= 100
    img, lab = d[1050]
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8 and 0 <= lab <= 9
    for i in (0, 7, 1099):
        x = d[i][0]
        assert len(np.unique(x)) > 50
        enc = d.encoded(i)
        assert enc.startswith(b"\x89PNG") and len(enc) < x.nbytes
    assert not np.array_equal(d[0][0], d[1][0])
    mapped = d._mapped()
    assert all(isinstance(a, np.memmap) for a in mapped)
    assert len(pickle.dumps(d)) < 2000


def test_synthetic_same_seed_same_bytes_other_seed_differs(tmp_path):
    a = SyntheticCIFAR10(n=300, seed=3, cache_dir=tmp_path / "a")
    b = SyntheticCIFAR10(n=300, seed=3, cache_dir=tmp_path / "b")
    c = SyntheticCIFAR10(n=300, seed=4, cache_dir=tmp_path / "a")
    for name in ("data.npy", "offsets.npy", "labels.npy"):
        assert (a.cache_path / name).read_bytes() == (b.cache_path / name).read_bytes()
    assert (a.cache_path / "data.npy").read_bytes() != (c.cache_path / "data.npy").read_bytes()


def test_synthetic_cache_is_reused_not_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "env"))
    first = SyntheticCIFAR10(n=50, seed=1)
    assert first.built_now and first.cache_path.is_relative_to(tmp_path / "env")
    mtime = (first.cache_path / "data.npy").stat().st_mtime_ns
    second = SyntheticCIFAR10(n=50, seed=1)
    assert not second.built_now
    assert (second.cache_path / "data.npy").stat().st_mtime_ns == mtime
    np.testing.assert_array_equal(first[10][0], second[10][0])
    assert not [p for p in first.cache_path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_a_synthetic_cache_built_for_a_team_has_the_umask_s_mode_so_the_others_can_read_it(tmp_path):
    """A Docker image builds the cache as root (umask 022) and runs as another user: its folder must be
    readable by them, as the files in it are (it was 0700, tempfile.mkdtemp's mode)."""
    old = os.umask(0o022)
    try:
        built = SyntheticCIFAR10(n=20, seed=3, cache_dir=tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(built.cache_path.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in built.cache_path.iterdir()} == {0o644}


@pytest.mark.parametrize("damage", ["cut data", "empty labels", "no offsets", "other labels"])
def test_a_damaged_synthetic_cache_is_rebuilt_with_a_warning(tmp_path, damage):
    first = SyntheticCIFAR10(n=30, seed=2, cache_dir=tmp_path)
    want = [first[i][0] for i in (0, 29)]
    labels = np.asarray(first.labels).tolist()
    path = first.cache_path
    del first  # its maps of the files damaged below
    if damage == "cut data":
        os.truncate(path / "data.npy", 500)
    elif damage == "empty labels":
        os.truncate(path / "labels.npy", 0)
    elif damage == "no offsets":
        (path / "offsets.npy").unlink()
    else:
        np.save(path / "labels.npy", np.zeros(30, dtype=np.int64))
    with pytest.warns(CacheRebuiltWarning, match=f"{path}: .*; rebuilding it"):
        again = SyntheticCIFAR10(n=30, seed=2, cache_dir=tmp_path)
    assert again.built_now
    for got, image in zip((again[0][0], again[29][0]), want):
        np.testing.assert_array_equal(got, image)
    assert [lab for _, lab in (again[i] for i in range(30))] == labels
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def _build(cache_dir):
    return SyntheticCIFAR10(n=200, seed=9, cache_dir=cache_dir).built_now


def test_concurrent_builders_build_once(tmp_path):
    with mp.get_context("fork").Pool(2) as pool:
        built = pool.map(_build, [tmp_path, tmp_path])
    assert sorted(built) == [False, True]


def test_synthetic_jpeg_and_bad_arguments(tmp_path):
    d = SyntheticCIFAR10(n=20, fmt="jpg", cache_dir=tmp_path)
    assert d.fmt == "jpeg" and d.encoded(0).startswith(b"\xff\xd8")
    assert d[0][0].shape == (32, 32, 3)
    with pytest.raises(ValueError, match="format"):
        SyntheticCIFAR10(n=20, fmt="gif", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        SyntheticCIFAR10(n=0, cache_dir=tmp_path)
    with pytest.raises(IndexError):
        d[20]


@pytest.mark.parametrize("n", [10**13, 10**20])
def test_a_synthetic_size_the_machine_cannot_build_is_refused_up_front(n, tmp_path):
    with pytest.raises(ArgumentError, match=r"synthetic CIFAR-10 images need at least .* ask for fewer") as exc:
        SyntheticCIFAR10(n=n, cache_dir=tmp_path / "cache")
    assert "\n" not in str(exc.value)
    assert list(tmp_path.iterdir()) == []


def test_a_cache_folder_that_is_a_file_is_refused_in_one_line(tmp_path):
    (tmp_path / "cache").write_text("x")
    with pytest.raises(ArgumentError, match=r"cache folder .* is a file, not a folder"):
        SyntheticCIFAR10(n=10, cache_dir=tmp_path / "cache")


def test_transform_is_applied_to_the_image(tmp_path):
    d = SyntheticCIFAR10(n=10, cache_dir=tmp_path, transform=lambda x: x.shape)
    assert d[0][0] == (32, 32, 3)


# --- open_dataset ----------------------------------------------------------------------------


def test_open_dataset_dispatch(tmp_path, images, labels):
    write_tar_shard(tmp_path / "s.tar", images, labels)
    write_tar_shard(tmp_path / "s.tgz", images, labels)
    _write_cifar(tmp_path / "cif" / "cifar-10-batches-py")
    _write_cifar(tmp_path / "cif2")
    _write_folder(tmp_path / "folder", images, labels)
    np.save(tmp_path / "x.npy", images)
    np.savez(tmp_path / "xy.npz", labels=labels, images=images)
    assert isinstance(open_dataset(tmp_path / "s.tar"), TarImageDataset)
    assert isinstance(open_dataset(tmp_path / "s.tgz", cache_dir=tmp_path / "cache"), TarImageDataset)
    assert len(open_dataset(tmp_path / "cif", train=False)) == 4
    assert isinstance(open_dataset(tmp_path / "cif2"), CIFAR10)
    assert isinstance(open_dataset(tmp_path / "folder"), ImageFolder)
    npy = open_dataset(tmp_path / "x.npy")
    assert isinstance(npy.arrays[0], np.memmap)
    np.testing.assert_array_equal(npy[2][0], images[2])
    img, lab = open_dataset(tmp_path / "xy.npz")[4]
    np.testing.assert_array_equal(img, images[4])
    assert lab == labels[4]


def test_open_dataset_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such dataset"):
        open_dataset(tmp_path / "nope.tar")
    (tmp_path / "data.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match="cannot tell what dataset"):
        open_dataset(tmp_path / "data.csv")


def test_corrupt_member_read_by_loader_workers_is_named(tmp_path, images, labels):
    from cupy_nwt import WorkerError  # noqa: PLC0415

    path = tmp_path / "shard.tar"
    with tarfile.open(path, "w") as tf:
        for i in range(24):
            data = encode_png(images[i % 12])
            if i == 17:
                data = data[:60]
            info = tarfile.TarInfo(f"{i % 3}/{i:04d}.png")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    d = TarImageDataset(path)
    with DataLoader(d, batch_size=4, num_workers=2, device="cpu", multiprocessing_context="fork") as loader:
        with pytest.raises(WorkerError, match=r"member '2/0017\.png'"):
            for _ in loader:
                pass
        assert loader.worker_pids() == []


def test_every_name_the_datasets_module_exports_is_importable_from_cupy_nwt_data():
    import cupy_nwt.data
    import cupy_nwt.data.datasets

    missing = [n for n in cupy_nwt.data.datasets.__all__ if n not in cupy_nwt.data.__all__]
    assert missing == [] and cupy_nwt.data.IMAGE_EXTENSIONS == cupy_nwt.data.datasets.IMAGE_EXTENSIONS
