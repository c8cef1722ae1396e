"""``cupy-nwt stats``: the per-stage table as rows come, the JSON result, the plot, and one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from test_faults import clean  # noqa: F401 - the fixture used below

from cupy_nwt import cli
from cupy_nwt.cli.stats import HEADERS
from cupy_nwt.loader.ring.ring import live_segments
from cupy_nwt.reporting import plots

TINY = ["--synthetic-n", "256", "--batch-size", "16", "--num-workers", "2", "--device", "cpu", "--no-progress"]


@pytest.mark.usefixtures("clean")
def test_prints_a_row_every_n_batches_across_epochs(capsys):
    assert cli.main(["stats", *TINY, "--batches", "40", "--every", "10"]) == 0  # 16 batches an epoch: 3 epochs
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["batches", "s"] and out[0].rstrip().endswith(HEADERS[-1])
    rows = [line.split() for line in out[1:6]]
    assert [r[0] for r in rows] == ["2*", "10", "20", "30", "40"]  # 2*: the warm-up, one batch from each worker
    assert all(len(r) == len(HEADERS) for r in rows)
    assert any(line.startswith("copy: host copy out of the ring") for line in out)


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_json_result_holds_every_interval(tmp_path, capsys, worker_type):
    path = tmp_path / "stats.json"
    code = cli.main(["stats", *TINY, "--worker-type", worker_type, "--batches", "12", "--every", "5", "--json",
                     "--output", str(path), "--no-transform"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(path.read_text())
    rows = printed["rows"]
    assert [(r["batches"], r["warmup"]) for r in rows] == [(2, True), (5, False), (10, False), (12, False)]
    assert sum(r["stats"]["batches"] for r in rows) == 12
    assert all(r["stats"]["transform_s"] == 0.0 for r in rows)
    assert all((r["stats"]["memory"] is None) == (worker_type == "thread") for r in rows)
    assert printed["config"]["worker_type"] == worker_type


@pytest.mark.usefixtures("clean")
@pytest.mark.skipif(not plots.matplotlib_available(), reason="matplotlib is not installed")
def test_plot_writes_a_png(tmp_path, capsys):
    png = tmp_path / "stats.png"
    assert cli.main(["stats", *TINY, "--batches", "8", "--every", "4", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.usefixtures("clean")
def test_a_dataset_file(tmp_path, capsys):
    path = tmp_path / "images.npy"
    np.save(path, np.zeros((64, 32, 32, 3), np.uint8))
    assert cli.main(["stats", "--dataset", str(path), *TINY[2:], "--batches", "4", "--every", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:3]] == ["2*", "4"]


@pytest.mark.parametrize("argv, needle", [
    (["--batches", "0"], "--batches must be >= 1"),
    (["--every", "x"], "--every must be a whole number"),
    (["--num-workers", "-1"], "--num-workers must be >= 0"),
    (["--dataset", "/no/such/path"], "no such dataset path"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    assert cli.main(["stats", *TINY, *argv]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_ctrl_c_keeps_the_rows_so_far_in_the_table_and_the_file(tmp_path, worker_type):
    """A long watch stopped with Ctrl-C (SIGINT to the whole foreground group, workers included, as a
    terminal sends it): the rows so far, a last one where it stood, the file written, exit 130, one line."""
    path = tmp_path / "stats.json"
    proc = subprocess.Popen([sys.executable, "-m", "cupy_nwt", "stats", *TINY, "--worker-type", worker_type,
                             "--batches", "1000000", "--every", "5", "--output", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "CUPY_NWT_CACHE_DIR": str(tmp_path / "cache")},
                            preexec_fn=_default_sigint)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(4)]  # the header and three rows
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == cli.EXIT_INTERRUPTED, err
    assert err.strip().count("\n") == 0 and "interrupted after" in err and str(path) in err, err
    saved = json.loads(path.read_text())
    assert saved["interrupted"] is True and len(saved["rows"]) >= 3
    done = saved["rows"][-1]["batches"]
    assert f"interrupted after {done} of 1000000 batches" in err
    if worker_type == "process":  # the interrupt stopped the workers: their memory is unknown there, not 0
        assert saved["rows"][-2]["stats"]["worker_private_bytes"] > 0
        last = saved["rows"][-1]["stats"]
        assert last["worker_private_bytes"] is None or last["worker_private_bytes"] > 0
    assert sum(r["stats"]["batches"] for r in saved["rows"]) == done  # every delivered batch in some row
    assert lines[0].split()[:2] == ["batches", "s"] and "steady state" in out
    assert live_segments(proc.pid) == set()  # no ring left in /dev/shm
    assert [p.pid for p in psutil.process_iter() if _group(p) == proc.pid] == []  # nor a worker


def _default_sigint() -> None:
    """A terminal's program takes Ctrl-C; one started in the background of a script (CI) inherits SIGINT
    ignored, which Python then leaves ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _group(p):
    try:
        return os.getpgid(p.pid)
    except OSError:
        return None


def test_a_busy_share_past_100_is_explained_under_the_table():
    """Over an interval shorter than making one batch, prefetched batches arrive in it: its busy share reads
    past 100 %, which the footer explains (it is the figure's definition, not a measurement gone wrong)."""
    from dataclasses import replace

    from cupy_nwt.cli.stats import WatchConfig, footer, run_watch
    from cupy_nwt.data.datasets import ArrayDataset

    data = ArrayDataset(np.zeros((64, 4), np.float32), np.arange(64))
    result = run_watch(data, "tiny", WatchConfig(batch_size=8, batches=4, every=1, num_workers=0, device="cpu"))
    calm = replace(result, rows=tuple(replace(r, stats=replace(r.stats, busy_fraction=0.5)) for r in result.rows))
    assert "busy % past 100" not in footer(calm)
    rows = list(calm.rows)
    rows[2] = replace(rows[2], stats=replace(rows[2].stats, busy_fraction=3.0))
    assert f"busy % past 100 (at batch {rows[2].batches}): a batch counts where it arrives" in footer(
        replace(calm, rows=tuple(rows)))


class _Stalls:
    """Samples at once for a second and a half, then each a second: the loop waits inside ``next()`` when
    Ctrl-C comes."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> np.ndarray:
        if 1.5 < time.monotonic() - self.t0 < 30:  # quick again after that: a missed interrupt fails, not hangs
            time.sleep(1)
        return np.full(4, i, np.float32)


@pytest.mark.usefixtures("clean")
def test_the_row_taken_where_ctrl_c_stopped_the_workers_says_their_memory_is_unknown_not_zero():
    """Ctrl-C inside ``next()`` stops the workers; the last row is then read with none alive. It said 0 MiB of
    worker memory (and +0 growth), in the table, the file and the plot, where they had used tens of MiB."""
    import threading

    from cupy_nwt.cli.stats import WatchConfig, run_watch

    config = WatchConfig(batch_size=8, num_workers=2, device="cpu", batches=20_000, every=50)
    # Ctrl-C as a terminal's: a run started in the background (CI's shell) inherits SIGINT ignored
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        result = run_watch(_Stalls(), "stalls", config)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, handler)
    assert result.interrupted and result.rows[-2].stats.worker_private_bytes
    last = result.rows[-1].stats
    assert last.worker_private_bytes is None or last.worker_private_bytes > 0
    assert last.worker_growth_bytes is None or last.memory
