"""A pick is keyed by the dataset it was tuned on: its type, and the folder or file it reads where it names one.

Two datasets whose samples are one size can want very different counts (an in-memory array wants none, a
dataset that reads a file per sample several); a pick saved before the dataset was keyed reads as a miss.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import DataLoader, lookup, tune_num_workers
from cupy_nwt.data import ImageFolder, encode_png
from cupy_nwt.picks.fingerprint import Fingerprint

ROWS = np.zeros((256, 8), np.float32)


class FilePerSample:
    """Samples of ROWS' size, as a dataset that reads one file each would return them."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(8, i, np.float32)


def _save_pick(data) -> Fingerprint:
    """Tune on ``data`` (a fake curve whose best is 2 workers) and save the pick."""
    result = tune_num_workers(data, batch_size=16, strategy="paper", max_workers=3, iterations=4, device="cpu",
                              measure=lambda w, i, u: 0.05 / (w + 1), progress=False, warn=False)
    assert result.best_workers == 2 and result.save_pick().replaced
    return result.fingerprint


def _why(data) -> str:
    with DataLoader(data, batch_size=16, num_workers="auto", device="cpu", autotune=False) as loader:
        return loader.stats().num_workers_why


def _folder(root: Path) -> Path:
    (root / "a").mkdir(parents=True)
    for i in range(16):
        (root / "a" / f"{i}.png").write_bytes(encode_png(np.full((4, 4, 3), i, np.uint8)))
    return root


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_pick_for_one_dataset_is_not_reused_for_another_whose_samples_are_as_big():
    _save_pick(ROWS)
    assert _why(ROWS).startswith("picked 2 workers")
    why = _why(FilePerSample())
    assert why.startswith("no saved pick for this machine and work") and "FilePerSample" in why


def test_two_folders_are_two_picks_and_one_folder_is_one_from_anywhere(tmp_path, monkeypatch):
    first, second = _folder(tmp_path / "first"), _folder(tmp_path / "second")
    _save_pick(ImageFolder(first))
    assert _why(ImageFolder(second)).startswith("no saved pick")
    monkeypatch.chdir(tmp_path)
    assert _why(ImageFolder("first")).startswith("picked 2 workers")


def test_a_pick_saved_before_the_dataset_was_keyed_is_a_miss_not_an_error(cache, caplog):
    fp = _save_pick(ROWS)
    store = cache / "num_workers.json"
    doc = json.loads(store.read_text())
    (record,) = doc["results"].values()
    record["fingerprint"]["work"].pop("dataset", None)
    old_key = Fingerprint.from_dict(record["fingerprint"]).key
    doc["results"] = {old_key: record}
    store.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="cupy_nwt.tuner"):
        assert lookup(fp) is None
        assert _why(ROWS).startswith("no saved pick")
    assert not caplog.records and not list(cache.glob("num_workers.json.bad-*"))
