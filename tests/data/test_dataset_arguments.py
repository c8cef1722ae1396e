"""Bad arguments to the image datasets: each refused at once, in one line of ``CupyNwtError`` naming it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from cupy_nwt import CupyNwtError
from cupy_nwt.data import (
    ArrayDataset,
    ImageFolder,
    ShardedTarStream,
    SyntheticCIFAR10,
    TarImageDataset,
    encode_png,
    write_tar_shard,
)
from cupy_nwt.errors import ArgumentError, ArgumentTypeError, OutOfRangeError


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "photos"
    (root / "a").mkdir(parents=True)
    for k in range(3):
        (root / "a" / f"{k}.png").write_bytes(encode_png(np.full((4, 4, 3), k, np.uint8)))
    (root / "a" / "notes.jpg.txt").write_text("not an image")
    return root


def _one_line(info: pytest.ExceptionInfo) -> str:
    msg = str(info.value)
    assert isinstance(info.value, CupyNwtError) and "\n" not in msg
    assert str(pickle.loads(pickle.dumps(info.value))) == msg
    return msg


@pytest.mark.parametrize("root", [None, 123])
def test_a_root_that_is_not_a_path_is_named(root):
    with pytest.raises(ArgumentTypeError, match=rf"root must be a path \(str or os.PathLike\), got {root}") as info:
        ImageFolder(root)
    _one_line(info)


def test_an_index_is_named_as_given(folder):
    ds = ImageFolder(folder)
    with pytest.raises(OutOfRangeError, match=r"^index -5 out of range for a dataset of 3 samples$"):
        ds[-5]
    with pytest.raises(ArgumentTypeError, match=r"a dataset index must be an integer, got 'a'") as info:
        ds["a"]
    _one_line(info)
    assert ds[-3][1] == 0 and ds[np.int64(2)][1] == 0


@pytest.mark.parametrize("make", [
    lambda folder, t: ImageFolder(folder, transform=t),
    lambda folder, t: TarImageDataset(write_tar_shard(folder.parent / "s.tar", np.zeros((2, 4, 4, 3), np.uint8),
                                                      [0, 1]), transform=t),
    lambda folder, t: ArrayDataset(np.zeros((2, 3)), transform=t),
    lambda folder, t: ShardedTarStream([folder.parent / "s.tar"], transform=t, rank=0, world_size=1),
])
def test_a_transform_that_cannot_be_called_is_refused_when_set(folder, make):
    write_tar_shard(folder.parent / "s.tar", np.zeros((2, 4, 4, 3), np.uint8), [0, 1])
    with pytest.raises(ArgumentTypeError, match=r"^transform must be a callable or None, got 5$") as info:
        make(folder, 5)
    _one_line(info)


def test_setting_a_bad_transform_later_is_refused_and_a_class_is_only_called(folder):
    ds = ImageFolder(folder)
    with pytest.raises(ArgumentTypeError, match="transform must be a callable"):
        ds.transform = "crop"
    ds.transform = np.shape  # a function, called on the decoded pixels
    assert ds[0][0] == (4, 4, 3)
    ds.transform = list  # a class with no from_bytes protocol: called too
    assert len(ds[0][0]) == 4


def test_one_extension_string_is_one_ending(folder):
    (folder / "a" / "x.jpg").write_bytes(b"")
    assert len(ImageFolder(folder, extensions="png")) == 3  # not the endings 'p', 'n', 'g'


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": 1.5}, r"^n must be a positive integer, got 1.5$"),
    ({"n": 0}, r"^n must be a positive integer, got 0$"),
    ({"seed": -1}, r"^seed must be a non-negative integer, got -1$"),
])
def test_synthetic_counts_are_checked(tmp_path, kwargs, message):
    with pytest.raises(ArgumentError, match=message) as info:
        SyntheticCIFAR10(cache_dir=tmp_path, **{"n": 4, **kwargs})
    _one_line(info)


def test_a_cache_dir_that_is_a_file_is_named(tmp_path):
    (tmp_path / "file.txt").write_text("hello")
    with pytest.raises(ArgumentError, match=r"cache folder .*file.txt cannot hold the synthetic CIFAR-10: "
                                            r".*file.txt is a file, not a folder; set CUPY_NWT_CACHE_DIR "
                                            r"\(or cache_dir=\) to a folder you can write$") as info:
        SyntheticCIFAR10(n=4, cache_dir=tmp_path / "file.txt")
    _one_line(info)
