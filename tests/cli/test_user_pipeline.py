"""``tune`` and ``stats`` run the user's own pipeline, and the pick is found again by the loader.

A user with their own decode step and batch augmentation tunes once from the shell, then builds
``DataLoader(..., num_workers="auto")`` on the same pipeline in their script: the loader must take
the saved pick, not search again. Without ``--transform``/``--batch-transform``, ``--dataset`` runs
with no transform at all (it used to get the CIFAR augmentation unasked).
"""

from __future__ import annotations

import importlib
import json
import logging
import textwrap

import numpy as np
import pytest

from cupy_nwt import DataLoader, cli
from cupy_nwt.data.datasets import open_dataset
from cupy_nwt.picks.store import ResultStore

TINY = ["--max-workers", "2", "--iterations", "8", "--batch-size", "8", "--device", "cpu", "--no-progress"]

MODULE = '''
import numpy as np

def to_float(image):
    """The user's per-sample step: uint8 HWC -> float32 in [0, 1]."""
    return np.asarray(image, dtype=np.float32) / 255.0

class Jitter:
    """The user's batch augmentation, a class with a (batch, seed) call."""
    def __call__(self, batch, seed=None):
        images, labels = batch
        rng = np.random.default_rng(seed)
        return images + rng.normal(0, 0.01, images.shape).astype(np.float32), labels

broken = 3
'''


@pytest.fixture
def user(tmp_path, monkeypatch):
    (tmp_path / "mypipeline.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "imgs.npz"
    rng = np.random.default_rng(0)
    np.savez(path, images=rng.integers(0, 255, (64, 32, 32, 3), dtype=np.uint8), labels=np.arange(64) % 10)
    return path


def test_tune_then_auto_on_the_same_pipeline_reuses_the_pick(user, tmp_path, capsys, caplog):
    assert cli.main(["tune", "--dataset", str(user), *TINY, "--transform", "mypipeline:to_float",
                     "--batch-transform", "mypipeline:Jitter"]) == 0
    (record,) = ResultStore(tmp_path / "cache").records().values()
    work = record["fingerprint"]["work"]
    assert work["sample_transform"] == "mypipeline.to_float" and work["transform"] == "mypipeline.Jitter"
    assert work["sample_bytes"] == 32 * 32 * 3 * 4 + 8  # float32 after the user's step, + the label

    mypipeline = importlib.import_module("mypipeline")  # the user's module, on the path the fixture set

    caplog.set_level(logging.INFO, logger="cupy_nwt.tuner")
    data = open_dataset(user, transform=mypipeline.to_float)
    with DataLoader(data, batch_size=8, batch_transform=mypipeline.Jitter(), num_workers="auto", device="cpu",
                    output="numpy") as dl:
        assert dl.num_workers == record["best_workers"]
        images, _ = next(iter(dl))
        assert images.dtype == np.float32
    assert "using saved pick" in caplog.text and "tuning online" not in caplog.text


def test_a_different_pipeline_does_not_take_that_pick(user, tmp_path, caplog):
    assert cli.main(["tune", "--dataset", str(user), *TINY, "--transform", "mypipeline:to_float"]) == 0
    caplog.set_level(logging.INFO, logger="cupy_nwt.tuner")
    from cupy_nwt.picks.fingerprint import Fingerprint, machine_fingerprint, work_fingerprint  # noqa: PLC0415
    from cupy_nwt.picks.store import lookup  # noqa: PLC0415

    raw = open_dataset(user)  # the same files without the user's step: another pipeline
    fp = Fingerprint(machine_fingerprint(), work_fingerprint(raw, batch_size=8, pin_memory=False, device="cpu"))
    assert lookup(fp, tmp_path / "cache") is None


def test_dataset_runs_untransformed_unless_asked(user, tmp_path, capsys):
    assert cli.main(["tune", "--dataset", str(user), *TINY, "--json", "--no-save"]) == 0
    work = json.loads(capsys.readouterr().out)["fingerprint"]["work"]
    assert work["transform"] is None and work["sample_transform"] is None
    assert cli.main(["tune", "--dataset", str(user), *TINY, "--json", "--no-save", "--batch-transform", "cifar"]) == 0
    assert json.loads(capsys.readouterr().out)["fingerprint"]["work"]["transform"] == \
        "cupy_nwt.data.transforms.CifarTrainTransform"
    assert cli.main(["tune", "--dataset", str(user), *TINY, "--json", "--no-save", "--main-process", "waits"]) == 0
    assert json.loads(capsys.readouterr().out)["main_process"] == "waits"  # a GPU step's load, asked for on the CPU


@pytest.mark.parametrize("option, spec, message", [
    ("--transform", "nosuchmodule:f", "--transform nosuchmodule:f: no module named 'nosuchmodule'"),
    ("--transform", "mypipeline:nothing", "--transform mypipeline:nothing: mypipeline has no attribute 'nothing'"),
    ("--batch-transform", "mypipeline", "--batch-transform must be module:attribute"),
    ("--batch-transform", "mypipeline:broken", "--batch-transform mypipeline:broken: broken is a int, not a callable"),
])
def test_a_missing_callable_is_one_line(user, capsys, option, spec, message):
    for command in ("tune", "stats"):
        extra = TINY if command == "tune" else ["--batch-size", "8", "--device", "cpu", "--no-progress",
                                                "--batches", "2", "--num-workers", "0"]
        assert cli.main([command, "--dataset", str(user), *extra, option, spec]) == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert err.startswith(f"cupy-nwt {command}: {message}") and err.count("\n") == 1


def test_stats_runs_the_users_pipeline(user, capsys):
    assert cli.main(["stats", "--dataset", str(user), "--batch-size", "8", "--device", "cpu", "--no-progress",
                     "--batches", "4", "--every", "2", "--num-workers", "0", "--json",
                     "--transform", "mypipeline:to_float", "--batch-transform", "mypipeline:Jitter"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"][-1]["batches"] == 4
