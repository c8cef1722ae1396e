"""``num_workers="auto"`` reuses what the tune step of docs/tuner.md saved, and says in one log line whether it
uses a saved pick or, on a miss, tunes online, and why; what the online tuner settles at is saved, and the
next ``"auto"`` loader reuses it without tuning. Written as a user's script would be: a small map-style
dataset, a loop over epochs."""

from __future__ import annotations

import inspect
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import cupy_nwt
from cupy_nwt import DataLoader, tune_num_workers
from cupy_nwt.data.datasets import SyntheticCIFAR10
from cupy_nwt.data.transforms import CifarTrainTransform
from cupy_nwt.nwt.measure import LoaderMeasure
from cupy_nwt.nwt.trials import Measurement
from cupy_nwt.picks.pick import auto_fingerprint
from cupy_nwt.picks.store import TuneResult, lookup

N, BATCH = 64, 8


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _no_more_searching(monkeypatch) -> None:
    def search(*args, **kwargs):
        raise AssertionError("num_workers='auto' ran the offline search")

    monkeypatch.setattr("cupy_nwt.nwt.tune.tune_num_workers", search)


def _auto_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "cupy_nwt.tuner" and "num_workers='auto'" in r.getMessage()]


def test_pin_memory_defaults_agree():
    """pin_memory is part of the saved pick's key: the tuner must default to what the loader defaults to."""
    def default(fn):
        return inspect.signature(fn).parameters["pin_memory"].default

    loader = default(DataLoader.__init__)
    assert loader is False
    assert default(tune_num_workers) is loader
    assert default(auto_fingerprint) is loader
    assert default(LoaderMeasure.__init__) is loader


def test_readme_flow_tune_save_then_auto_reuses(cache, monkeypatch, caplog):
    data, aug = SyntheticCIFAR10(n=N), CifarTrainTransform()
    result = tune_num_workers(data, batch_size=BATCH, strategy="fast", batch_transform=aug, max_workers=2,
                              iterations=8, progress=False)
    result.save()
    _no_more_searching(monkeypatch)
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        loader = DataLoader(data, batch_size=BATCH, num_workers="auto", batch_transform=aug)
    with loader:
        assert loader.num_workers == result.best_workers
    expected = f"num_workers='auto': using saved pick {result.best_workers} (key {result.fingerprint.key})"
    assert _auto_lines(caplog) == [expected]


def test_cli_tune_then_auto_reuses(cache, monkeypatch, caplog):
    env = dict(os.environ, PYTHONPATH=str(Path(cupy_nwt.__file__).parents[1]))
    proc = subprocess.run([sys.executable, "-m", "cupy_nwt", "tune", "--synthetic-n", str(N), "--batch-size",
                           str(BATCH), "--max-workers", "2", "--iterations", "8", "--no-progress", "--json"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    best = TuneResult.from_dict(json.loads(proc.stdout)).best_workers
    _no_more_searching(monkeypatch)
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        loader = DataLoader(SyntheticCIFAR10(n=N), batch_size=BATCH, num_workers="auto",
                            batch_transform=CifarTrainTransform())
    with loader:
        assert loader.num_workers == best
    lines = _auto_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith(f"num_workers='auto': using saved pick {best} (key ")


def test_a_miss_says_in_one_line_that_it_tunes_online_and_never_searches(cache, monkeypatch, caplog):
    data = SyntheticCIFAR10(n=N)
    _no_more_searching(monkeypatch)
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        DataLoader(data, batch_size=BATCH, num_workers="auto", device="cpu").close()
    (line,) = _auto_lines(caplog)
    assert line.startswith(f"num_workers='auto': no saved pick for this machine and work (nothing saved in "
                           f"{cache / 'num_workers.json'}): tuning online from ")
    assert line.endswith("To search up front instead: tune_num_workers(dataset, ...).save_pick() or cupy-nwt tune")
    tune_num_workers(data, batch_size=BATCH, device="cpu", strategy="fast", max_workers=2, progress=False,
                     measure=lambda w, i, u: Measurement([0.02, 0.01][w], 0.1)).save_pick()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        DataLoader(data, batch_size=BATCH, num_workers="auto", device="cpu", pin_memory=True).close()
    (line,) = _auto_lines(caplog)
    assert ("(the closest saved work differs in pin_memory False saved, True here): tuning online from "
            in line)


class Squares:
    """A user's map-style dataset."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(16, i * i, np.float32)


def _train(loader: DataLoader, epochs: int) -> int:
    """A user's loop: a few ms of work on each batch (the caller's step)."""
    seen = 0
    for _ in range(epochs):
        for batch in loader:
            time.sleep(0.003)
            seen += len(batch)
    return seen


def test_a_miss_tunes_online_saves_what_it_settled_at_and_the_next_loader_reuses_it(cache, monkeypatch, caplog):
    _no_more_searching(monkeypatch)
    data = Squares()
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        with DataLoader(data, batch_size=4, num_workers="auto", device="cpu") as loader:
            assert loader.decisions[0].action == "start"
            assert "tuning online from " in loader.stats().num_workers_why
            assert _train(loader, epochs=4) == 4 * 256
            settled = loader.decisions[-1].workers
    searched, saved = _auto_lines(caplog)
    assert "tuning online from " in searched
    assert saved.startswith(f"num_workers='auto': the online tuner settled at {settled} worker")
    assert "saved as the pick for this machine and work" in saved
    fp = auto_fingerprint(data, batch_size=4, device="cpu")
    pick = lookup(fp)
    assert pick is not None and pick.strategy == "online" and pick.best_workers == settled
    assert pick.search_end.startswith("online: ") and pick.wait_fraction is not None
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        with DataLoader(data, batch_size=4, num_workers="auto", device="cpu") as again:
            assert again.num_workers == settled and again.decisions == ()  # reused: no tuning at all
            assert "tuned online by an earlier loader" in again.stats().num_workers_why
            assert _train(again, epochs=1) == 256
    assert _auto_lines(caplog) == [f"num_workers='auto': using saved pick {settled} (key {fp.key})"]


def test_autotune_false_said_keeps_a_miss_from_tuning_or_saving(cache, monkeypatch, caplog):
    """A user who turns tuning off gets the starting count as it is: no tuner decisions, nothing saved."""
    _no_more_searching(monkeypatch)
    data = Squares()
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        with DataLoader(data, batch_size=4, num_workers="auto", device="cpu", autotune=False) as loader:
            assert loader.decisions == ()
            assert "autotune=False" in loader.stats().num_workers_why
            assert _train(loader, epochs=2) == 2 * 256
            assert loader.decisions == ()
    (line,) = _auto_lines(caplog)
    assert "autotune=False, so " in line and "neither tuned nor saved" in line
    assert lookup(auto_fingerprint(data, batch_size=4, device="cpu")) is None


def test_why_missing_names_another_machine(cache):
    from dataclasses import replace  # noqa: PLC0415

    from cupy_nwt.picks.fingerprint import (  # noqa: PLC0415
        Fingerprint,
        machine_fingerprint,
        work_fingerprint,
    )
    from cupy_nwt.picks.store import ResultStore  # noqa: PLC0415

    here = Fingerprint(machine_fingerprint(), work_fingerprint(SyntheticCIFAR10(n=N), batch_size=BATCH,
                                                               device="cpu"))
    elsewhere = replace(here, machine=replace(here.machine, cpu_model="another CPU"))
    ResultStore().put(elsewhere.key, {"fingerprint": elsewhere.to_dict()})
    assert ResultStore().why_missing(here) == "1 saved pick(s), none for this machine"


def test_auto_builds_where_a_corrupt_first_image_would_be_skipped(cache, tmp_path):
    """The fingerprint's read of sample 0 in the main process must not fail a loader whose workers skip it."""
    from cupy_nwt.data import ImageFolder, encode_png  # noqa: PLC0415

    folder = tmp_path / "photos" / "a"
    folder.mkdir(parents=True)
    (folder / "000.png").write_bytes(b"corrupt")
    for i in range(1, 16):
        (folder / f"{i:03d}.png").write_bytes(encode_png(np.full((8, 8, 3), i, np.uint8)))
    with DataLoader(ImageFolder(folder.parent), batch_size=8, num_workers="auto", device="cpu",
                    on_bad_sample="skip") as loader:
        assert sorted(int(x) for b in loader for x in b[0][:, 0, 0, 0]) == list(range(1, 16))
