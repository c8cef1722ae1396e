"""``num_workers="auto"`` reuses what the tune step of docs/tuner.md saved, and says in one log line whether it
uses a saved pick or searches, and why."""

from __future__ import annotations

import inspect
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cupy_nwt
from cupy_nwt import DataLoader, tune_num_workers
from cupy_nwt.data.datasets import SyntheticCIFAR10
from cupy_nwt.data.transforms import CifarTrainTransform
from cupy_nwt.nwt.measure import LoaderMeasure
from cupy_nwt.nwt.pick import auto_num_workers
from cupy_nwt.nwt.store import TuneResult

N, BATCH = 64, 8


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _no_more_searching(monkeypatch) -> None:
    def search(*args, **kwargs):
        raise AssertionError("num_workers='auto' searched again instead of using the saved pick")

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
    assert default(auto_num_workers) is loader
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


def test_a_search_says_why_in_one_line(cache, monkeypatch, caplog):
    data = SyntheticCIFAR10(n=N)
    searches = []

    def fake_tune(dataset, **kw):
        searches.append(kw)
        return tune_num_workers(dataset, **{**kw, "max_workers": 2, "iterations": 8})

    monkeypatch.setattr("cupy_nwt.nwt.tune.tune_num_workers", fake_tune)
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        DataLoader(data, batch_size=BATCH, num_workers="auto", device="cpu").close()
    expected = (f"num_workers='auto': no saved pick for this machine and work (nothing saved in "
                f"{cache / 'num_workers.json'}): searching (fast strategy)")
    searched, picked = _auto_lines(caplog)  # why it searched, then what it picked and why
    assert searched == expected and picked.startswith("num_workers='auto': picked ")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        DataLoader(data, batch_size=BATCH, num_workers="auto", device="cpu", pin_memory=True).close()
    expected = ("num_workers='auto': no saved pick for this machine and work (the closest saved work differs "
                "in pin_memory False saved, True here): searching (fast strategy)")
    assert _auto_lines(caplog)[0] == expected and len(_auto_lines(caplog)) == 2
    assert [kw["pin_memory"] for kw in searches] == [False, True]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        DataLoader(data, batch_size=BATCH, num_workers="auto", device="cpu", pin_memory=True).close()
    assert len(searches) == 2 and _auto_lines(caplog)[0].startswith("num_workers='auto': using saved pick ")


def test_why_missing_names_another_machine(cache):
    from dataclasses import replace  # noqa: PLC0415

    from cupy_nwt.nwt.fingerprint import (  # noqa: PLC0415
        Fingerprint,
        machine_fingerprint,
        work_fingerprint,
    )
    from cupy_nwt.nwt.store import ResultStore  # noqa: PLC0415

    here = Fingerprint(machine_fingerprint(), work_fingerprint(SyntheticCIFAR10(n=N), batch_size=BATCH,
                                                               device="cpu"))
    elsewhere = replace(here, machine=replace(here.machine, cpu_model="another CPU"))
    ResultStore().put(elsewhere.key, {"fingerprint": elsewhere.to_dict()})
    assert ResultStore().why_missing(here) == "1 saved pick(s), none for this machine"
