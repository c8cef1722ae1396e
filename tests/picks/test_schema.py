"""A saved record the schema passes is one ``TuneResult`` builds: a field no cupy_nwt writes makes the store
damaged (set aside, one warning naming it, a miss for ``num_workers="auto"``); an optional field left out reads."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest

from cupy_nwt import DataLoader, tune_num_workers
from cupy_nwt.picks import schema
from cupy_nwt.picks.fingerprint import MachineFingerprint, WorkFingerprint
from cupy_nwt.picks.store import TypeBest
from cupy_nwt.picks.trials import Trial

DATA = np.zeros((256, 8), np.float32)
ANOTHER_TYPE = {"worker_type": "thread", "best_workers": 1, "samples_per_second": 1.0, "search_seconds": 1.0}


def _save_and_edit(edit) -> None:
    """Save a pick of 2 workers for DATA in the cache folder, then change its record with ``edit``."""
    result = tune_num_workers(DATA, batch_size=16, strategy="paper", max_workers=3, iterations=4, device="cpu",
                              measure=lambda w, i, u: 0.05 / (w + 1), progress=False, warn=False)
    path = result.save_pick().path
    doc = json.loads(path.read_text())
    (record,) = doc["results"].values()
    edit(record)
    path.write_text(json.dumps(doc))


def _auto_workers() -> int:
    with DataLoader(DATA, batch_size=16, num_workers="auto", device="cpu", autotune=False) as loader:
        return loader.num_workers


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(("where", "edit"), [
    ("runs[0]", lambda rec: rec["runs"][0].update(note="x")),
    ("other_types[0]", lambda rec: rec.update(other_types=[{**ANOTHER_TYPE, "note": "x"}])),
    ("fingerprint.machine", lambda rec: rec["fingerprint"]["machine"].update(note="x")),
    ("fingerprint.work", lambda rec: rec["fingerprint"]["work"].update(note="x")),
])
def test_a_record_with_a_field_no_version_writes_is_set_aside_as_a_miss(cache, caplog, where, edit):
    _save_and_edit(edit)
    with caplog.at_level(logging.WARNING, logger="cupy_nwt.tuner"):
        assert _auto_workers() == 1  # a miss: half the budget, untuned
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(cache / "num_workers.json") in warnings[0]
    assert f"{where} has a field no cupy_nwt writes: 'note'" in warnings[0]
    assert len(list(cache.glob("num_workers.json.bad-*"))) == 1
    _save_and_edit(lambda rec: None)  # the store takes picks again
    assert _auto_workers() == 2


@pytest.mark.parametrize("edit", [
    lambda rec: [run.pop(k) for run in rec["runs"] for k in ("peak_memory_bytes", "peak_uss_bytes", "rel_error")],
    lambda rec: [rec["fingerprint"]["machine"].pop(k) for k in ("gpu_name", "pcie")],
    lambda rec: rec["fingerprint"]["work"].pop("transform"),
    lambda rec: rec.update(other_types=[ANOTHER_TYPE]),
], ids=["a run's optional figures", "the machine's GPU", "the batch transform", "another type's placement"])
def test_a_record_without_a_field_the_schema_calls_optional_still_gives_its_pick(cache, caplog, edit):
    _save_and_edit(edit)
    with caplog.at_level(logging.WARNING, logger="cupy_nwt.tuner"):
        assert _auto_workers() == 2
    assert not caplog.records and not list(cache.glob("num_workers.json.bad-*"))


@pytest.mark.parametrize(("keys", "cls"), [("TRIAL_KEYS", Trial), ("TYPE_BEST_KEYS", TypeBest),
                                           ("MACHINE_KEYS", MachineFingerprint), ("WORK_KEYS", WorkFingerprint)])
def test_the_schema_names_every_field_a_saved_object_is_built_from(keys, cls):
    assert getattr(schema, keys) == {f.name for f in dataclasses.fields(cls)}
