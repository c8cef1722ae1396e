"""A tar shard cut short (a partial download) or garbled is refused with its name and the byte offset
where the damage starts, never indexed up to the cut as if whole; through the CLI it is exit 4."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import cli
from cupy_nwt.data.datasets import (
    TarImageDataset,
    scan_tar,
    write_tar_shard,
)
from cupy_nwt.errors import DamagedArchiveError

N = 24


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> tuple[bytes, list[tarfile.TarInfo], int]:
    """A valid shard's bytes, its members, and where its end-of-archive marker starts."""
    images = np.random.default_rng(3).integers(0, 256, (N, 32, 32, 3), dtype=np.uint8)
    path = write_tar_shard(tmp_path_factory.mktemp("tar") / "whole.tar", images, np.arange(N) % 3)
    with tarfile.open(path) as tf:
        members = tf.getmembers()
        end = tf.offset
    return path.read_bytes(), members, end


def _cut(tmp_path: Path, data: bytes, at: int) -> Path:
    p = tmp_path / "cut.tar"
    p.write_bytes(data[:at])
    return p


def test_a_whole_shard_indexes_every_member_and_record_padding_is_optional(tmp_path, shard):
    data, _, end = shard
    assert len(data) % tarfile.RECORDSIZE == 0 and len(data) > end + 1024  # tarfile pads to a record
    assert len(TarImageDataset(_cut(tmp_path, data, len(data)))) == N
    assert len(TarImageDataset(_cut(tmp_path, data, end + 1024))) == N  # marker kept, padding cut: nothing lost


def _cases(members: list[tarfile.TarInfo], end: int) -> dict[str, tuple[int, int, str]]:
    """name -> (cut position, offset the error must give, words it must contain)."""
    m = members[12]
    last = members[-1]
    data_end = last.offset_data + -(-last.size // 512) * 512
    return {
        "inside the first header": (100, 0, "not a readable tar archive"),
        "inside a later header": (m.offset + 200, m.offset, "a cut member header"),
        "at a header boundary": (m.offset, m.offset, "without the end-of-archive marker"),
        "inside member data": (m.offset_data + 10, m.offset_data + 10, f"ends inside member {m.name!r}"),
        "inside a member's padding": (last.offset_data + last.size + 1, last.offset_data + last.size + 1,
                                      f"ends inside member {last.name!r}"),
        "just before the end blocks": (data_end, data_end, "without the end-of-archive marker"),
        "inside the end blocks": (end + 700, end, "without the end-of-archive marker"),
    }


@pytest.mark.parametrize("case", ["inside the first header", "inside a later header", "at a header boundary",
                                  "inside member data", "inside a member's padding", "just before the end blocks",
                                  "inside the end blocks"])
def test_a_cut_shard_is_refused_naming_the_offset(tmp_path, shard, case):
    data, members, end = shard
    at, offset, words = _cases(members, end)[case]
    assert 0 < at < end + 1024
    path = _cut(tmp_path, data, at)
    with pytest.raises(DamagedArchiveError) as info:
        TarImageDataset(path)
    err = info.value
    assert err.path == str(path) and err.offset == offset and words in err.problem
    assert str(err).startswith(f"{path}: damaged archive at byte offset {offset}: ")


def test_every_cut_before_the_end_marker_is_refused(tmp_path, shard):
    data, _, end = shard
    for at in range(1, end + 1024, 509):  # steps that land in headers, data, padding and the marker
        with pytest.raises(DamagedArchiveError):
            scan_tar(_cut(tmp_path, data, at), "cut.tar")


def test_a_garbled_header_mid_archive_is_refused(tmp_path, shard):
    """tarfile stops at a header with a bad checksum as if the archive ended there."""
    data, members, _ = shard
    m = members[7]
    raw = bytearray(data)
    raw[m.offset + 148:m.offset + 156] = b"9999999\0"  # the checksum field
    path = tmp_path / "garbled.tar"
    path.write_bytes(bytes(raw))
    with pytest.raises(DamagedArchiveError, match=f"offset {m.offset}: a member header that cannot be read"):
        TarImageDataset(path)


def test_pax_headers_cut_inside_are_refused(tmp_path):
    """Long names travel in PAX extended headers, whose data tarfile reads itself."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(4):
            payload = bytes(range(256)) * 3
            info = tarfile.TarInfo(f"cls{i % 2}/{'é' * 120}{i}.png")
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    data = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.getmembers()
        end = tf.offset
    whole = tmp_path / "pax.tar"
    whole.write_bytes(data)
    assert len(scan_tar(whole, "pax.tar")) == 4
    for at in range(1, end + 1024, 97):
        with pytest.raises(DamagedArchiveError):
            scan_tar(_cut(tmp_path, data, at), "pax.tar")


def test_the_cli_refuses_a_cut_shard_in_one_line(tmp_path, shard, capsys, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    data, members, _ = shard
    at = members[12].offset + 200  # the case: a cut inside a member's header
    path = _cut(tmp_path, data, at)
    assert cli.main(["tune", "--dataset", str(path), "--batch-size", "4", "--max-workers", "2",
                     "--iterations", "8", "--no-progress", "--no-save", "--device", "cpu"]) == cli.EXIT_BAD_DATA
    err = capsys.readouterr().err
    assert err == (f"cupy-nwt tune: bad data: {path}: damaged archive at byte offset {members[12].offset}: "
                   f"a cut member header where the next member or the end-of-archive marker should be "
                   f"(the file is {at} bytes)\n")


def test_a_cut_gzip_shard_names_the_archive(tmp_path, shard):
    """The decompressed tar is checked too; offsets then count bytes of the decompressed archive."""
    import gzip  # noqa: PLC0415

    data, members, _ = shard
    at = members[5].offset_data + 3
    path = tmp_path / "cut.tar.gz"
    path.write_bytes(gzip.compress(data[:at]))  # a whole gzip stream of a cut tar
    with pytest.raises(DamagedArchiveError, match=rf"^{path}: damaged archive at byte offset {at}: "):
        TarImageDataset(path, cache_dir=tmp_path / "cache")
