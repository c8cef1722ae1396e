"""The decompressed copy of a .tar.gz is checked against its record before it is used: a copy left
zeroed by a crash, cut short, or with a missing, garbled or lying record is rebuilt from the source
with one warning naming the copy; an intact copy is used as it is; concurrent first uses build once.

A crash is simulated as it happens: the copy is built by another process, damaged on disk, and then
opened by this one (its first open of that copy, as after a restart).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt.data.datasets import CacheRebuiltWarning, TarImageDataset, open_dataset, write_tar_shard

N = 600
ROOT = str(Path(__file__).parents[2])


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(26).integers(0, 256, (N, 16, 16, 3), dtype=np.uint8)


@pytest.fixture
def source(tmp_path, images) -> Path:
    return write_tar_shard(tmp_path / "shard.tar.gz", images, np.arange(N) % 10)


def _open_elsewhere(source: Path, cache: Path, *, count: int = 1) -> list[tuple[Path, int, str]]:
    """Open ``source`` in ``count`` fresh processes at once; each one's cached copy, its inode, and stderr."""
    code = ("import os, sys; from cupy_nwt.data.datasets import TarImageDataset; "
            "d = TarImageDataset(sys.argv[1], cache_dir=sys.argv[2]); "
            f"assert len(d) == {N}; print(d.tar_path, os.stat(d.tar_path).st_ino)")
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(source), str(cache)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(count)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        path, ino = stdout.split()
        out.append((Path(path), int(ino), stderr))
    return out


def _built_elsewhere(source: Path, cache: Path) -> Path:
    [(copy, _, err)] = _open_elsewhere(source, cache)
    assert "Warning" not in err, err
    assert copy.parent == cache / "tar" and copy.with_name(copy.name + ".json").is_file()
    return copy


def _open_here_expecting_one_rebuild(source: Path, cache: Path, copy: Path, images: np.ndarray) -> str:
    """Open as a user would; exactly one CacheRebuiltWarning, whose text is returned; every sample right."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = TarImageDataset(source, cache_dir=cache)
    rebuilt = [w for w in caught if issubclass(w.category, CacheRebuiltWarning)]
    assert len(rebuilt) == 1, [str(w.message) for w in caught]
    assert d.tar_path == copy
    _check_every_sample(d, images)
    d.close()
    [(_, _, err)] = _open_elsewhere(source, cache)  # the rebuilt copy now checks in a fresh process
    assert "Warning" not in err, err
    return str(rebuilt[0].message)


def _check_every_sample(d: TarImageDataset, images: np.ndarray) -> None:
    assert len(d) == N
    for i in range(N):
        img, label = d[i]
        np.testing.assert_array_equal(img, images[i])
        assert label == i % 10


def test_a_copy_with_a_zeroed_tail_is_rebuilt_with_one_warning(tmp_path, source, images):
    cache = tmp_path / "cache"
    copy = _built_elsewhere(source, cache)
    size = copy.stat().st_size
    with open(copy, "r+b") as f:  # what a crash before the data reached the disk leaves: the length, zeros
        f.seek(size * 9 // 10)
        f.write(bytes(size - size * 9 // 10))
    assert copy.stat().st_size == size
    leftover = copy.with_name(f".{copy.name}.dead-writer.tmp")
    leftover.write_bytes(b"half a copy")
    message = _open_here_expecting_one_rebuild(source, cache, copy, images)
    assert message.startswith(f"{copy}: its bytes do not match the BLAKE2b digest"), message
    assert not leftover.exists(), "a dead writer's temporary file is cleared when the copy is rebuilt"


def test_a_cut_copy_is_rebuilt_and_the_warning_blames_the_copy(tmp_path, source, images):
    cache = tmp_path / "cache"
    copy = _built_elsewhere(source, cache)
    size = copy.stat().st_size
    os.truncate(copy, size // 2)
    message = _open_here_expecting_one_rebuild(source, cache, copy, images)
    assert message.startswith(f"{copy}: it is {size // 2} bytes but was written as {size}"), message
    assert f"rebuilding it from {source}" in message


def _record_cases(record: dict) -> dict[str, bytes | None]:
    """name -> the record file's new bytes (None: no record)."""
    def edited(**changes: object) -> bytes:
        return json.dumps({**record, **changes}).encode()

    other = "0" * 128 if record["blake2b"] != "0" * 128 else "1" * 128
    return {
        "missing": None,
        "empty": b"",
        "garbage bytes": bytes(range(256)) * 4,
        "not json": b"{'length': 1",
        "a list": b"[1, 2, 3]",
        "deeply nested": b"[" * 100_000 + b"]" * 100_000,
        "a field missing": json.dumps({k: v for k, v in record.items() if k != "blake2b"}).encode(),
        "an extra field": edited(trusted=True),
        "length as a string": edited(length=str(record["length"])),
        "length of a bool": edited(length=True),
        "negative size": edited(source_size=-1),
        "an unknown format": edited(format=99),
        "a digest that is not hex": edited(blake2b="z" * 128),
        "another digest": edited(blake2b=other),
        "another length": edited(length=record["length"] + 512),
        "another source": edited(source="/elsewhere/other.tar.gz"),
        "another mtime": edited(source_mtime_ns=record["source_mtime_ns"] + 1),
        "too large": edited(source="x" * 10_000),
    }


CASES = list(_record_cases({"blake2b": "", "length": 0, "source_mtime_ns": 0}))


@pytest.mark.parametrize("case", CASES)
def test_a_copy_whose_record_is_missing_garbled_or_lying_is_rebuilt(tmp_path, source, images, case):
    cache = tmp_path / "cache"
    copy = _built_elsewhere(source, cache)
    record_file = copy.with_name(copy.name + ".json")
    new = _record_cases(json.loads(record_file.read_text()))[case]
    if new is None:
        record_file.unlink()
    else:
        record_file.write_bytes(new)
    message = _open_here_expecting_one_rebuild(source, cache, copy, images)
    assert message.startswith(f"{copy}: "), message
    assert json.loads(record_file.read_text())["length"] == copy.stat().st_size


def test_an_intact_copy_is_used_as_it_is(tmp_path, source, images):
    cache = tmp_path / "cache"
    copy = _built_elsewhere(source, cache)
    before = copy.stat()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = open_dataset(source, cache_dir=cache)
        again = TarImageDataset(source, cache_dir=cache)
    after = copy.stat()
    assert d.tar_path == again.tar_path == copy
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
    _check_every_sample(d, images)


def test_a_changed_source_gets_its_own_copy(tmp_path, source, images):
    cache = tmp_path / "cache"
    first = _built_elsewhere(source, cache)
    write_tar_shard(source, images[::-1], (np.arange(N) % 10)[::-1])
    os.utime(source, ns=(1, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = TarImageDataset(source, cache_dir=cache)
    assert d.tar_path != first
    np.testing.assert_array_equal(d[0][0], images[-1])


def test_concurrent_first_uses_build_once(tmp_path, source):
    cache = tmp_path / "cache"
    opened = _open_elsewhere(source, cache, count=4)
    assert len({copy for copy, _, _ in opened}) == 1
    assert len({ino for _, ino, _ in opened}) == 1, "every process must use the one copy built (same inode)"
    assert all("Warning" not in err for _, _, err in opened), opened
    assert sorted(p.name for p in (cache / "tar").iterdir()) == sorted(
        [opened[0][0].name, opened[0][0].name + ".json", opened[0][0].name + ".lock"])


def test_concurrent_first_uses_of_a_damaged_copy_rebuild_it_once(tmp_path, source, images):
    cache = tmp_path / "cache"
    copy = _built_elsewhere(source, cache)
    with open(copy, "r+b") as f:
        f.seek(copy.stat().st_size // 3)
        f.write(bytes(4096))
    opened = _open_elsewhere(source, cache, count=4)
    warned = [err for _, _, err in opened if "CacheRebuiltWarning" in err]
    assert len(warned) == 1, opened
    assert f"{copy}: its bytes do not match" in warned[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check_every_sample(TarImageDataset(source, cache_dir=cache), images)


def test_the_copy_and_its_record_reach_the_disk_before_they_are_renamed(tmp_path, source, monkeypatch):
    """Each file renamed into the cache was fsynced first; the folder is fsynced after the renames."""
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def logged_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def logged_replace(src: str, dst: str) -> None:
        events.append(("replace", os.fspath(src)))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", logged_fsync)
    monkeypatch.setattr(os, "replace", logged_replace)
    d = TarImageDataset(source, cache_dir=tmp_path / "cache")
    renamed = [path for kind, path in events if kind == "replace"]
    assert len(renamed) == 2, events
    for path in renamed:
        assert events.index(("fsync", path)) < events.index(("replace", path)), events
    assert events[-1] == ("fsync", str(d.tar_path.parent)), events


def test_a_read_only_shared_cache_serves_the_copies_it_holds_and_says_in_one_line_it_cannot_hold_new_ones(
        tmp_path, source, images):
    """A cache folder the user cannot write (a team's shared one, as its mode stops the user: root with the
    capabilities that pass over modes dropped): a copy already there is read; a new archive is one line, exit 2,
    from the CLI (it was "unexpected error: OSError", exit 1, and a bare traceback from ``open_dataset``)."""
    import shutil

    user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"] if os.geteuid() == 0 else []
    if user and shutil.which("setpriv") is None:
        pytest.skip("root writes anywhere, and setpriv is not here to drop that")
    shared = tmp_path / "shared"
    _built_elsewhere(source, shared)
    other = write_tar_shard(tmp_path / "other.tar.gz", images[:8], np.arange(8))
    for folder in (shared, shared / "tar"):
        folder.chmod(0o555)
    try:
        if subprocess.run([*user, "touch", str(shared / "x")], capture_output=True, check=False).returncode == 0:
            pytest.skip("this user writes into a read-only folder")
        env = dict(os.environ, PYTHONPATH=ROOT, CUPY_NWT_CACHE_DIR=str(shared))
        held = subprocess.run([*user, sys.executable, "-m", "cupy_nwt", "stats", "--dataset", str(source), "--batches",
                               "2", "--every", "1", "--batch-size", "8", "--device", "cpu", "--no-progress"],
                              capture_output=True, text=True, env=env, timeout=120, check=False)
        new = subprocess.run([*user, sys.executable, "-m", "cupy_nwt", "stats", "--dataset", str(other), "--batches",
                              "2", "--device", "cpu", "--no-progress"],
                             capture_output=True, text=True, env=env, timeout=120, check=False)
        api = subprocess.run([*user, sys.executable, "-c", f"from cupy_nwt.data import open_dataset; open_dataset({str(other)!r})"],
                             capture_output=True, text=True, env=env, timeout=120, check=False)
    finally:
        for folder in (shared, shared / "tar"):
            folder.chmod(0o755)
    assert held.returncode == 0, held.stderr
    assert new.returncode == 2 and new.stderr.count("\n") == 1, new.stderr
    assert f"the cache folder {shared} cannot hold the decompressed copy of {other}: " in new.stderr
    assert "CUPY_NWT_CACHE_DIR" in new.stderr and "Traceback" not in new.stderr
    assert "ArgumentError: the cache folder" in api.stderr.splitlines()[-1]
