"""Tar shard labels: what write_tar_shard writes, TarImageDataset and ShardedTarStream read back the same."""

from __future__ import annotations

import io
import pickle
import re
import shutil
import subprocess
import tarfile

import numpy as np
import pytest

from cupy_nwt import CupyNwtError
from cupy_nwt.data import ImageFolder, ShardedTarStream, TarImageDataset, encode_png, write_tar_shard
from cupy_nwt.errors import ArgumentError, DataError

IMAGES = np.zeros((3, 4, 4, 3), np.uint8)


def _hand_made(path, dirs):
    """A shard another tool wrote: one PNG under each of ``dirs``."""
    data = encode_png(IMAGES[0])
    with tarfile.open(path, "w") as tf:
        for k, d in enumerate(dirs):
            info = tarfile.TarInfo(f"{d}/{k:03d}.png")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _stream_labels(path):
    return [label for _, label in ShardedTarStream([path], shuffle=False, rank=0, world_size=1)]


@pytest.mark.parametrize("labels", [[0, -1, 2], [0.9, 1.7, 2.0], [0, float("nan"), 1], [True, False, True],
                                    ["a", "b", "c"]])
def test_labels_a_directory_cannot_give_back_are_refused_at_write(tmp_path, labels):
    with pytest.raises(ArgumentError, match=r"write_tar_shard: labels must be non-negative integers") as info:
        write_tar_shard(tmp_path / "s.tar", IMAGES, labels)
    assert "\n" not in str(info.value)
    assert type(pickle.loads(pickle.dumps(info.value))) is type(info.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("labels", [[0, 1e30, 2], np.array([0, 2**64 - 1, 2], np.uint64), [0, 2**63, 2]])
def test_labels_past_int64_are_refused_at_write(tmp_path, labels):
    """Cast to int64 they were written as another label (2**64 - 1 as directory "-1")."""
    with pytest.raises(ArgumentError, match=r"labels must be non-negative integers up to 9223372036854775807"):
        write_tar_shard(tmp_path / "s.tar", IMAGES, labels)
    assert not (tmp_path / "s.tar").exists()


@pytest.mark.parametrize("big", ["9223372036854775808", "9" * 5000])
def test_a_label_directory_past_int64_is_refused_by_both_readers(tmp_path, big):
    path = _hand_made(tmp_path / "s.tar", ["0", big, "2"])
    for read in (TarImageDataset, _stream_labels):
        with pytest.raises(DataError, match="is a label past 9223372036854775807"):
            read(path)


def test_integer_valued_labels_read_back_the_same_in_both_readers(tmp_path):
    path = write_tar_shard(tmp_path / "s.tar", IMAGES, np.array([2.0, 0.0, 7.0]))
    ds = TarImageDataset(path)
    assert [ds[i][1] for i in range(3)] == [2, 0, 7] == _stream_labels(path)


@pytest.mark.parametrize("bad", ["-1", "1.5", "+2"])
def test_a_number_like_directory_is_refused_by_both_readers(tmp_path, bad):
    path = _hand_made(tmp_path / "s.tar", ["0", bad, "2"])
    for read in (TarImageDataset, _stream_labels):
        with pytest.raises(DataError, match=re.escape(f"class directory '{bad}' is not a label")):
            read(path)


def test_integer_and_named_directories_mixed_are_refused(tmp_path):
    path = _hand_made(tmp_path / "s.tar", ["0", "cat", "1"])
    with pytest.raises(DataError, match=r"mixes integer label directories \('0'\) with class names \('cat'\)"):
        TarImageDataset(path)


def test_non_ascii_digits_are_a_class_name_in_both_readers(tmp_path):
    path = _hand_made(tmp_path / "s.tar", ["\u0663", "\u0661"])  # Arabic-Indic 3 and 1
    ds = TarImageDataset(path)
    assert ds.classes == ["\u0661", "\u0663"] and [ds[i][1] for i in range(2)] == [1, 0]
    with pytest.raises(CupyNwtError, match="not in classes="):
        _stream_labels(path)


def test_a_member_name_that_is_not_utf8_is_read_by_both_readers(tmp_path):
    """A shard written where names were Latin-1 (``café`` as bytes 63 61 66 e9): tarfile gives the name with
    a surrogate for the odd byte, which both readers failed on with a bare ``UnicodeEncodeError``."""
    data = encode_png(IMAGES[0])
    path = tmp_path / "latin1.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tf:
        for name in ["caf\xe9/0.png", "dog/1.png"]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    ds = TarImageDataset(path)
    assert ds.classes == ["caf\udce9", "dog"] and [ds[i][1] for i in range(2)] == [0, 1]
    assert ds.sample_source(0).endswith("member 'caf\\udce9/0.png'")
    assert pickle.loads(pickle.dumps(ds)).member_name(0) == "caf\udce9/0.png"
    stream = ShardedTarStream([path], classes=["caf\udce9", "dog"], shuffle=False, rank=0, world_size=1)
    assert [label for _, label in stream] == [0, 1]


def _with_links(path):
    """A shard as ``tar --hard-dereference``-less tools and deduplicating archivers write it: a hard link and
    a symlink to one image stand for samples of their own class; one symlink names nothing in the archive."""
    red, blue = encode_png(np.full((4, 4, 3), 200, np.uint8)), encode_png(np.full((4, 4, 3), 30, np.uint8))
    with tarfile.open(path, "w") as tf:
        for name, data in (("cat/a.png", red), ("cat/b.png", blue)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, kind, target in (("dog/hard.png", tarfile.LNKTYPE, "cat/a.png"),
                                   ("dog/soft.png", tarfile.SYMTYPE, "../cat/b.png"),
                                   ("dog/gone.png", tarfile.SYMTYPE, "../cat/missing.png")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            tf.addfile(info)
    return path


def test_link_members_are_samples_of_their_own_and_a_dangling_one_is_said(tmp_path, caplog):
    """Extracted, the links are files ImageFolder would read: they are samples here too, never left out in
    silence; a link that names nothing is left out with one warning naming it."""
    with caplog.at_level("WARNING", logger="cupy_nwt.data"):
        ds = TarImageDataset(_with_links(tmp_path / "s.tar"))
    assert len(ds) == 4 and [int(ds[i][0][0, 0, 0]) for i in range(4)] == [200, 30, 200, 30]
    assert [ds[i][1] for i in range(4)] == [0, 0, 1, 1]  # cat, cat, dog, dog
    assert "1 link member(s) name nothing in the archive, left out: dog/gone.png" in caplog.text


APPLE_DOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00" + b"Mac OS X        " + bytes(64)


def _made_on_a_mac_and_appended_to(path):
    """A shard as a Mac's tar writes it (an AppleDouble ``._`` member beside each file), then ``tar -r``'d with
    an updated ``cat/b.png``: the archive holds b twice, the old copy first."""
    red, old, new = (encode_png(np.full((4, 4, 3), v, np.uint8)) for v in (200, 90, 30))
    with tarfile.open(path, "w") as tf:
        for name, data in (("cat/._a.png", APPLE_DOUBLE), ("cat/a.png", red), ("cat/._b.png", APPLE_DOUBLE),
                           ("cat/b.png", old), ("cat/b.png", new)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_a_shard_made_on_a_mac_and_appended_to_reads_as_its_extraction_does(tmp_path, caplog):
    """Every reader gives what ``tar -x`` then ImageFolder gives: the images once each, the last copy of an
    appended file, no macOS metadata decoded as a corrupt image; what was left out is said."""
    from cupy_nwt.data import ImageFolder

    path = _made_on_a_mac_and_appended_to(tmp_path / "s.tar")
    with tarfile.open(path) as tf:
        tf.extractall(tmp_path / "out", filter="data")
    with caplog.at_level("WARNING", logger="cupy_nwt.data"):
        folder = ImageFolder(tmp_path / "out")
        tar = TarImageDataset(path)
        stream = list(ShardedTarStream([path], classes=["cat"], shuffle=False, rank=0, world_size=1))
    extracted = [(int(folder[i][0][0, 0, 0]), folder[i][1]) for i in range(len(folder))]
    assert extracted == [(200, 0), (30, 0)]
    assert [(int(tar[i][0][0, 0, 0]), tar[i][1]) for i in range(len(tar))] == extracted
    assert [(int(image[0, 0, 0]), label) for image, label in stream] == extracted
    assert "1 member name(s) appear more than once; each is read once, from its last copy" in caplog.text
    assert "2 macOS metadata member(s) (._ AppleDouble files, not images) left out, e.g. cat/._a.png" in caplog.text
    assert "ImageFolder: 2 macOS metadata file(s) (._ AppleDouble files, not images)" in caplog.text


def test_a_dot_underscore_image_that_is_an_image_is_read(tmp_path):
    """Only the metadata's own first bytes leave a ``._`` file out: an image so named is a sample."""
    from cupy_nwt.data import ImageFolder

    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "._real.png").write_bytes(encode_png(IMAGES[0]))
    assert len(ImageFolder(tmp_path)) == 1
    assert len(TarImageDataset(_hand_made(tmp_path / "s.tar", ["cat"]))) == 1


def _tar_of_folder(root, path, *names):
    """``tar -C root -cf path NAMES`` as a user runs it (``.`` gives every member a ``./`` prefix)."""
    if shutil.which("tar") is None:
        pytest.skip("needs the tar command")
    subprocess.run(["tar", "-C", str(root), "-cf", str(path), *names], check=True)
    return path


def test_a_folder_tarred_as_dot_labels_its_classes_as_the_folder_does(tmp_path):
    """``./cat/1.png`` is class cat; a top-level ``./preview.png`` is refused as ``preview.png`` is, by both
    readers, never taken as a class "." that would shift every label by one."""
    root = tmp_path / "root"
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        (root / cls / "1.png").write_bytes(encode_png(IMAGES[0]))
    dot = _tar_of_folder(root, tmp_path / "dot.tar", ".")
    folder = ImageFolder(root)
    assert TarImageDataset(dot).classes == folder.classes == ["cat", "dog"]
    stream = ShardedTarStream([dot], shuffle=False, classes=["cat", "dog"], rank=0, world_size=1)
    assert sorted(label for _, label in stream) == [0, 1]
    (root / "preview.png").write_bytes(encode_png(IMAGES[0]))
    dot = _tar_of_folder(root, tmp_path / "dot2.tar", ".")
    plain = _tar_of_folder(root, tmp_path / "plain.tar", "cat", "dog", "preview.png")
    for archive in (dot, plain):
        with pytest.raises(DataError, match=r"member '(\./)?preview\.png' of .* is not inside a class directory"):
            TarImageDataset(archive)
        with pytest.raises(DataError, match=r"member '(\./)?preview\.png' is not inside a class directory"):
            list(ShardedTarStream([archive], shuffle=False, classes=["cat", "dog"], rank=0, world_size=1))


@pytest.mark.parametrize("again", ["/cat/a.png", "./cat/a.png", "cat//a.png"])
def test_a_file_stored_again_under_another_spelling_of_its_name_is_read_once_from_its_last_copy(tmp_path, again):
    """Extraction drops a leading ``/`` (tar does, and tarfile's ``data`` filter): ``/cat/a.png`` appended later
    replaces ``cat/a.png``. Read as two names, the stale copy stayed a sample beside the new one."""
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w") as tf:
        for name, value in (("cat/a.png", 1), ("dog/b.png", 2), (again, 9)):
            data = encode_png(np.full((2, 2, 3), value, np.uint8))
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tf:
        tf.extractall(tmp_path / "out", filter="data")
    folder = ImageFolder(tmp_path / "out")
    extracted = sorted((int(folder[i][0][0, 0, 0]), folder[i][1]) for i in range(len(folder)))
    assert extracted == [(2, 1), (9, 0)]
    tar = TarImageDataset(path)
    assert sorted((int(tar[i][0][0, 0, 0]), tar[i][1]) for i in range(len(tar))) == extracted
    stream = ShardedTarStream([path], classes=["cat", "dog"], shuffle=False, rank=0, world_size=1)
    assert sorted((int(image[0, 0, 0]), label) for image, label in stream) == extracted
