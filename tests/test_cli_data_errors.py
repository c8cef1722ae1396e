"""``cupy-nwt tune --dataset`` on bad data: one line naming the file, member or sample, exit 4 (5 for a
dead worker), and the traceback only with ``--debug`` or ``CUPY_NWT_DEBUG=1``.

Runs go through ``cli.main`` in this process (what the console script calls), with tiny searches.
"""

from __future__ import annotations

import gzip
import io
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import cli
from cupy_nwt.datasets import encode_png, write_tar_shard
from cupy_nwt.loader.epoch.sampler import BatchSampler
from cupy_nwt.loader.workers.process import WorkerDiedError

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
    code, err = _tune(path, capsys)
    assert code == cli.EXIT_BAD_DATA
    line = _one_line(err)
    assert f"{path}: sample 0 is a float32 scalar" in line and "--no-transform" in line


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
    assert code == cli.EXIT_BAD_DATA and "WorkerError: loader worker" in err, "not the worker path"
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
    from cupy_nwt import tuner  # noqa: PLC0415

    def dies(self, workers, iterations, warmup):
        raise WorkerDiedError("loader worker 1 (pid 4242) died (killed by SIGKILL) while loading batch 3\n"
                              "second line", worker_id=1, pid=4242, exitcode=-signal.SIGKILL)

    monkeypatch.setattr(tuner.LoaderMeasure, "__call__", dies)
    root = _folder(tmp_path / "imgs", 12)
    assert cli.main(["tune", "--dataset", str(root), *TINY]) == cli.EXIT_WORKER
    err = capsys.readouterr().err
    assert err == "cupy-nwt tune: loader worker failed: loader worker 1 (pid 4242) died (killed by SIGKILL) " \
                  "while loading batch 3\n"


def test_an_unexpected_error_is_one_line_exit_1(monkeypatch, capsys):
    def boom():
        raise KeyError("surprise")

    monkeypatch.setattr(cli.system, "host_info", boom)
    assert cli.main(["info"]) == cli.EXIT_FAILED
    assert capsys.readouterr().err == "cupy-nwt info: unexpected error: KeyError: 'surprise' (--debug shows where)\n"


def test_help_documents_every_exit_code():
    out = subprocess.run([sys.executable, "-m", "cupy_nwt", "--help"], capture_output=True, text=True,
                         check=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(Path(cli.__file__).parents[1])))
    for code in (cli.EXIT_FAILED, cli.EXIT_USAGE, cli.EXIT_NO_GPU, cli.EXIT_BAD_DATA, cli.EXIT_WORKER,
                 cli.EXIT_INTERRUPTED):
        assert f"\n  {code} " in out.stdout, out.stdout
    assert "--debug" in out.stdout and cli.DEBUG_ENV in out.stdout


def test_bad_data_through_the_console_entry_point(tmp_path):
    """The same one line and code from a real process (no pytest capture in between)."""
    root = _folder(tmp_path / "imgs", 12, bad={2: b"junk"})
    env = dict(os.environ, CUPY_NWT_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(Path(cli.__file__).parents[1]))
    env.pop(cli.DEBUG_ENV, None)
    proc = subprocess.run([sys.executable, "-m", "cupy_nwt", "tune", "--dataset", str(root), *TINY],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == cli.EXIT_BAD_DATA
    assert proc.stderr.count("\n") == 1 and str(root / "c2" / "0002.png") in proc.stderr
