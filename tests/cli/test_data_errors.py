"""``cupy-nwt tune --dataset`` on bad data: one line naming the file, member or sample, exit 4 (5 for a
dead worker), and the traceback only with ``--debug`` or ``CUPY_NWT_DEBUG=1``.

Runs go through ``cli.main`` in this process (what the console script calls), with tiny searches.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import cli
from cupy_nwt.data.datasets import encode_png, write_tar_shard
from cupy_nwt.errors import WorkerDiedError
from cupy_nwt.loader.plan.order import BatchSampler

BATCH = 4
TINY = ["--batch-size", str(BATCH), "--max-workers", "3", "--iterations", "8", "--no-progress", "--no-save",
        "--device", "cpu"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)


def _png(seed: int, size: int = 32) -> bytes:
    return encode_png(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8))


def _folder(root: Path, n: int, bad: dict[int, bytes] | None = None) -> Path:
    """``n`` 32x32 PNGs in root/c<i % 3>/<i>.png; ``bad`` replaces some files' bytes."""
    for i in range(n):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:04d}.png").write_bytes((bad or {}).get(i, _png(i)))
    return root


def _folder_index(i: int, n: int) -> int:
    """The ImageFolder index of file i written by ``_folder`` (classes first, then names sorted)."""
    return sum(len(range(c, n, 3)) for c in range(i % 3)) + i // 3


def _tune(dataset: Path, capsys, *extra: str) -> tuple[int, str]:
    with warnings.catch_warnings():
        # run in pytest-xdist's worker, whose own threads make Python 3.12+ warn at each fork; the program
        # a user runs has no such threads, and Python's default filters would not show that warning anyway
        warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
        code = cli.main(["tune", "--dataset", str(dataset), *TINY, *extra])
    out = capsys.readouterr()
    assert out.out == ""
    return code, out.err


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("cupy-nwt tune: bad data: "), err
    return err


def test_corrupt_image_in_a_folder(tmp_path, capsys):
    root = _folder(tmp_path / "imgs", 24, bad={7: b"not a png at all"})
    code, err = _tune(root, capsys)
    assert code == cli.EXIT_BAD_DATA
    line = _one_line(err)
    assert str(root / "c1" / "0007.png") in line and "not a decodable image" in line
    assert f"(sample {_folder_index(7, 24)})" in line


def test_corrupt_member_in_a_tar(tmp_path, capsys):
    path = tmp_path / "shard.tar"
    with tarfile.open(path, "w") as tf:
        for i in range(24):
            data = _png(i)[:50] if i == 5 else _png(i)
            info = tarfile.TarInfo(f"{i % 3}/{i:04d}.png")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    code, err = _tune(path, capsys)
    assert code == cli.EXIT_BAD_DATA
    line = _one_line(err)
    assert f"{path} member '2/0005.png': not a decodable image" in line and "(sample 5)" in line


def test_truncated_tar_gz(tmp_path, capsys):
    images = np.random.default_rng(0).integers(0, 256, (24, 32, 32, 3), dtype=np.uint8)
    whole = write_tar_shard(tmp_path / "whole.tar.gz", images, np.arange(24) % 3).read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    code, err = _tune(cut, capsys)
    assert code == cli.EXIT_BAD_DATA
    line = _one_line(err)
    assert f"{cut}: damaged archive at byte offset {len(whole) // 2}: the gzip stream ends" in line
    assert not list((tmp_path / "cache" / "tar").glob("*.tar")), "a truncated stream must leave no cached tar"


def test_corrupt_gzip_data(tmp_path, capsys):
    images = np.random.default_rng(0).integers(0, 256, (24, 32, 32, 3), dtype=np.uint8)
    raw = bytearray(gzip.compress(write_tar_shard(tmp_path / "s.tar", images, np.arange(24) % 3).read_bytes()))
    raw[len(raw) // 2:len(raw) // 2 + 64] = bytes(64)
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(bytes(raw))
    code, err = _tune(bad, capsys)
    assert code == cli.EXIT_BAD_DATA
    assert f"{bad}: damaged archive at byte offset" in _one_line(err)


def test_images_of_mixed_sizes(tmp_path, capsys):
    root = tmp_path / "mixed"
    # the second sample of the first batch: the first one sets the layout the others must fit
    index = int(BatchSampler(12, BATCH, True, 0, True, 0, 1).plan(0).indices(0)[1])
    file_i = next(i for i in range(12) if _folder_index(i, 12) == index)
    _folder(root, 12, bad={file_i: _png(file_i, size=33)})
    code, err = _tune(root, capsys)
    assert code == cli.EXIT_BAD_DATA
    line = _one_line(err)
    expected = root / f"c{file_i % 3}" / f"{file_i:04d}.png"
    assert line.startswith(f"cupy-nwt tune: bad data: {expected}: sample index {index}")
    assert "expected shape (32, 32, 3)" in line and "got shape (33, 33, 3)" in line


def test_one_dimensional_npy(tmp_path, capsys):
    path = tmp_path / "values.npy"
    np.save(path, np.arange(100, dtype=np.float32))
    code, err = _tune(path, capsys, "--batch-transform", "cifar")
    assert code == cli.EXIT_BAD_DATA
    line = _one_line(err)
    assert f"{path}: sample 0 is a float32 scalar" in line and "--batch-transform cifar" in line


def test_one_dimensional_npy_loads_without_the_image_transform(tmp_path, capsys):
    path = tmp_path / "values.npy"
    np.save(path, np.arange(100, dtype=np.float32))
    assert cli.main(["tune", "--dataset", str(path), *TINY, "--no-transform"]) == 0
    assert "pick:" in capsys.readouterr().out


def _worker_only_index(n: int) -> int:
    """A dataset index the tuner's 0-worker trial never reads and its 2-worker trial does.

    Trials load seed-0 shuffled epochs from the start: the preflight takes batch 0, the 0-worker
    trial batches 0..8 (1 warm-up + 8 timed), the 2-worker trial batches 0..10 (3 warm-up + 8).
    """
    plan = BatchSampler(n, BATCH, True, 0, True, 0, 1).plan(0)
    return int(plan.indices(9)[0])


def test_one_corrupt_image_among_140_read_by_a_worker(tmp_path, capsys):
    n = 141
    target = _worker_only_index(n)
    file_i = next(i for i in range(n) if _folder_index(i, n) == target)
    root = _folder(tmp_path / "many", n, bad={file_i: b"\x89PNG\r\n\x1a\n truncated"})
    code, err = _tune(root, capsys)
    assert code == cli.EXIT_BAD_DATA
    line = _one_line(err)
    assert str(root / f"c{file_i % 3}" / f"{file_i:04d}.png") in line and f"(sample {target})" in line
    code, err = _tune(root, capsys, "--debug")
    # raised as the dataset's own type (and a WorkerError), with the worker's message
    assert code == cli.EXIT_BAD_DATA and "CorruptImageError: loader worker" in err, "not the worker path"
    assert err.splitlines()[-1] == line.rstrip("\n")


def test_debug_flag_and_environment_show_the_traceback(tmp_path, capsys, monkeypatch):
    root = _folder(tmp_path / "imgs", 12, bad={4: b"junk"})
    for argv in (["--debug", "tune"], ["tune", "--debug"]):
        assert cli.main([*argv, "--dataset", str(root), *TINY]) == cli.EXIT_BAD_DATA
        err = capsys.readouterr().err
        assert "Traceback" in err and "CorruptImageError" in err
        assert err.splitlines()[-1].startswith("cupy-nwt tune: bad data: ")
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    assert cli.main(["tune", "--dataset", str(root), *TINY]) == cli.EXIT_BAD_DATA
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv(cli.DEBUG_ENV, "0")
    assert cli.main(["tune", "--dataset", str(root), *TINY]) == cli.EXIT_BAD_DATA
    assert "Traceback" not in capsys.readouterr().err


def test_a_dead_worker_exits_5(tmp_path, capsys, monkeypatch):
    from cupy_nwt.nwt.measure import LoaderMeasure

    def dies(self, workers, iterations, warmup):
        raise WorkerDiedError("loader worker 1 (pid 4242) died (killed by SIGKILL) while loading batch 3\n"
                              "second line", worker_id=1, pid=4242, exitcode=-signal.SIGKILL)

    monkeypatch.setattr(LoaderMeasure, "__call__", dies)
    root = _folder(tmp_path / "imgs", 12)
    assert cli.main(["tune", "--dataset", str(root), *TINY]) == cli.EXIT_WORKER
    err = capsys.readouterr().err
    assert err == "cupy-nwt tune: loader worker failed: loader worker 1 (pid 4242) died (killed by SIGKILL) " \
                  "while loading batch 3\n"


def test_an_unexpected_error_is_one_line_exit_1(monkeypatch, capsys):
    def boom():
        raise KeyError("surprise")

    monkeypatch.setattr("cupy_nwt.system.host_info", boom)
    assert cli.main(["info"]) == cli.EXIT_FAILED
    assert capsys.readouterr().err == "cupy-nwt info: unexpected error: KeyError: 'surprise' (--debug shows where)\n"


def test_help_documents_every_exit_code():
    out = subprocess.run([sys.executable, "-m", "cupy_nwt", "--help"], capture_output=True, text=True,
                         check=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(Path(cli.__file__).parents[2])))
    for code in (cli.EXIT_FAILED, cli.EXIT_USAGE, cli.EXIT_NO_GPU, cli.EXIT_BAD_DATA, cli.EXIT_WORKER,
                 cli.EXIT_INTERRUPTED):
        assert f"\n  {code} " in out.stdout, out.stdout
    assert "--debug" in out.stdout and cli.DEBUG_ENV in out.stdout


def test_bad_data_through_the_console_entry_point(tmp_path):
    """The same one line and code from a real process (no pytest capture in between)."""
    root = _folder(tmp_path / "imgs", 12, bad={2: b"junk"})
    env = dict(os.environ, CUPY_NWT_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(Path(cli.__file__).parents[2]))
    env.pop(cli.DEBUG_ENV, None)
    proc = subprocess.run([sys.executable, "-m", "cupy_nwt", "tune", "--dataset", str(root), *TINY],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == cli.EXIT_BAD_DATA
    assert proc.stderr.count("\n") == 1 and str(root / "c2" / "0002.png") in proc.stderr


# --- .npy / .npz files that are empty, cut, garbled, lying or hold Python objects -----------------


def _npy_header(shape: tuple[int, ...], descr: str = "|u1") -> bytes:
    """A well-formed version 1.0 .npy header declaring ``shape`` (the data is up to the caller)."""
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
    return f.getvalue()


def _npz(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _saved(array: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, array, allow_pickle=True)
    return f.getvalue()


IMAGES = np.zeros((600, 32, 32, 3), dtype=np.uint8)
OBJECTS = np.array([1, "a", None], dtype=object)

# name -> (file name, its bytes, words the one line must hold after "<path>: ")
BAD_FILES: dict[str, tuple[str, bytes, str]] = {
    "zero-byte .npy": ("empty.npy", b"", "is empty (0 bytes), not a .npy array"),
    "zero-byte .npz": ("empty.npz", b"", "is empty (0 bytes), not a .npz archive"),
    "truncated .npy": ("cut.npy", _saved(IMAGES)[:1000], "is cut short (or its header lies): it declares "
                       "shape (600, 32, 32, 3) of uint8, 1843200 bytes of data, but 872 bytes follow the header"),
    "garbage .npy": ("noise.npy", bytes(range(256)) * 20, "is not a .npy array (it does not start with NumPy's "
                     "magic string"),
    "garbled .npy header": ("garbled.npy", _npy_header((4,))[:10] + b"{'descr': 'u1', oops" + bytes(100),
                            "has an unreadable .npy header"),
    "object-dtype .npy": ("objects.npy", _saved(OBJECTS), "holds Python objects (dtype object): reading them "
                          "means unpickling"),
    "a header claiming a huge shape": ("huge.npy", _npy_header((10**12, 32, 32, 3)) + bytes(100),
                                       "is cut short (or its header lies): it declares shape "
                                       "(1000000000000, 32, 32, 3) of uint8, "
                                       "3072000000000000 bytes of data, but 100 bytes follow the header"),
    "a header claiming a huge object shape": ("huge-objects.npy", _npy_header((10**30,), "|O") + bytes(8),
                                              "holds Python objects"),
    "a .npy of one value": ("scalar.npy", _saved(np.float32(3)), "holds one float32 value (shape ()), not rows"),
    ".npz with an object array": ("objects.npz", b"", "member 'images.npy' holds Python objects (dtype object)"),
    ".npz that is a zip of nothing": ("nothing.npz", b"", "holds no arrays (a zip archive with nothing in it)"),
    ".npz member claiming a huge shape": ("huge.npz", b"", "member 'images.npy' is cut short (or its header lies)"),
    ".npz member that is not .npy": ("text.npz", b"", "member 'notes.txt' is not a .npy array"),
    ".npz cut short": ("cut.npz", b"", "is not a .npz archive (not a readable zip file"),
    ".npz of arrays that disagree": ("uneven.npz", b"", "its arrays differ in their number of samples (first "
                                     "dimension): images 600, labels 599"),
}


def _bad_file(tmp_path: Path, case: str) -> tuple[Path, str]:
    name, data, words = BAD_FILES[case]
    path = tmp_path / "data" / name
    path.parent.mkdir(exist_ok=True)
    if case == ".npz with an object array":
        _npz(path, {"images.npy": _saved(OBJECTS), "labels.npy": _saved(np.arange(3))})
    elif case == ".npz that is a zip of nothing":
        _npz(path, {})
    elif case == ".npz member claiming a huge shape":
        _npz(path, {"images.npy": _npy_header((10**12, 32, 32, 3)) + bytes(100)})
    elif case == ".npz member that is not .npy":
        _npz(path, {"images.npy": _saved(IMAGES[:4]), "notes.txt": b"hello"})
    elif case == ".npz cut short":
        whole = tmp_path / "whole.npz"
        np.savez(whole, images=IMAGES, labels=np.arange(600))
        path.write_bytes(whole.read_bytes()[:5000])
        whole.unlink()
    elif case == ".npz of arrays that disagree":
        np.savez(path, images=IMAGES, labels=np.arange(599))
    else:
        path.write_bytes(data)
    return path, words


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@pytest.mark.parametrize("command", ["tune", "stats"])
@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_array_file_is_named_in_one_line_exit_4(tmp_path, capsys, case, command):
    path, words = _bad_file(tmp_path, case)
    before = _files_under(tmp_path)
    out = tmp_path / "results" / "out.json"
    options = TINY if command == "tune" else ["--batch-size", "4", "--batches", "2", "--no-progress", "--device",
                                              "cpu"]
    code = cli.main([command, "--dataset", str(path), *options, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_DATA, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"cupy-nwt {command}: bad data: {path}: {words}"), err
    assert _files_under(tmp_path) == before, "a refused data file must leave nothing behind"


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_open_dataset_refuses_a_bad_array_file_naming_it(tmp_path, case):
    from cupy_nwt.data.datasets import open_dataset  # noqa: PLC0415
    from cupy_nwt.errors import (
        CupyNwtError,  # noqa: PLC0415
        DataFileError,  # noqa: PLC0415
    )

    path, words = _bad_file(tmp_path, case)
    with pytest.raises(DataFileError) as info:
        open_dataset(path)
    err = info.value
    assert isinstance(err, CupyNwtError) and isinstance(err, ValueError)
    assert str(err).startswith(f"{path}: {words}") and "\n" not in str(err), str(err)
    assert err.path == str(path)
    again = pickle.loads(pickle.dumps(err))  # it crosses from a worker process intact
    assert type(again) is DataFileError and str(again) == str(err)


def test_good_array_files_still_open(tmp_path):
    from cupy_nwt.data.datasets import ArrayDataset, open_dataset  # noqa: PLC0415

    images = np.random.default_rng(0).integers(0, 256, (10, 8, 8, 3), dtype=np.uint8)
    np.save(tmp_path / "a.npy", images)
    np.save(tmp_path / "f.npy", np.asfortranarray(images))
    np.savez_compressed(tmp_path / "c.npz", labels=np.arange(10), images=images, extra=np.zeros(3))
    np.savez(tmp_path / "two.npz", np.arange(10), images.astype(np.float32))
    np.save(tmp_path / "none.npy", images[:0])
    for name in ("a.npy", "f.npy"):
        d = open_dataset(tmp_path / name)
        assert isinstance(d, ArrayDataset) and isinstance(d.arrays[0], np.memmap)
        np.testing.assert_array_equal(d.arrays[0], images)
    c = open_dataset(tmp_path / "c.npz")
    np.testing.assert_array_equal(c[3][0], images[3])
    assert c[3][1] == 3
    two = open_dataset(tmp_path / "two.npz")
    assert two[2][0] == 2 and two[2][1].dtype == np.float32
    assert len(open_dataset(tmp_path / "none.npy")) == 0


@pytest.mark.parametrize("name", ["empty.tar", "empty.tar.gz", "empty.tgz"])
def test_a_zero_byte_archive_is_named_exit_4(tmp_path, capsys, name):
    path = tmp_path / name
    path.write_bytes(b"")
    code, err = _tune(path, capsys)
    assert code == cli.EXIT_BAD_DATA
    assert _one_line(err).startswith(f"cupy-nwt tune: bad data: {path}: damaged archive at byte offset 0: ")
    assert not (tmp_path / "cache" / "tar").exists() or not list((tmp_path / "cache" / "tar").glob("*.tar"))
