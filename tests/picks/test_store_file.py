"""The store of picks where the user's folders are not what it expects: a folder it cannot write, a store
that is a symlink. Each works, or is one ``CupyNwtError`` naming the folder and ``CUPY_NWT_CACHE_DIR``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cupy_nwt
from cupy_nwt import DataLoader, lookup
from cupy_nwt.data.datasets import ArrayDataset
from cupy_nwt.errors import ArgumentError, SavedPickError
from cupy_nwt.nwt.trials import Measurement
from cupy_nwt.nwt.tune import tune_num_workers

DATA = ArrayDataset(np.zeros((64, 4, 4, 3), np.uint8), np.arange(64) % 10)


def _tuned(data=DATA):
    """A search of counts 0..2 whose fastest is 2."""
    return tune_num_workers(data, batch_size=8, max_workers=3, iterations=8, strategy="fast", device="cpu",
                            progress=False,
                            measure=lambda w, i, u: Measurement(0.2 if w == 2 else 1.0, 1.0, None, None, 0.005))


def _no_lock_here(folder) -> None:
    """What a folder this user cannot write does to the store (as root a mode would not stop it): no lock
    file can be made beside the store."""
    (folder / "num_workers.json.lock").unlink(missing_ok=True)
    (folder / "num_workers.json.lock").mkdir()


def test_a_store_in_a_folder_that_cannot_be_written_still_gives_its_pick(tmp_path, monkeypatch):
    _tuned().save_pick(tmp_path)
    _no_lock_here(tmp_path)
    assert lookup(_tuned().fingerprint, tmp_path).best_workers == 2
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))
    with DataLoader(DATA, batch_size=8, num_workers="auto", device="cpu") as loader:
        assert loader.num_workers == 2


def test_saving_into_a_folder_that_cannot_be_written_is_one_line_naming_it(tmp_path):
    _no_lock_here(tmp_path)
    with pytest.raises(ArgumentError, match=rf"^the cache folder {tmp_path} cannot hold the saved picks: .*; set "
                                            r"CUPY_NWT_CACHE_DIR \(or cache_dir=\) to a folder you can write$"):
        _tuned().save_pick(tmp_path)


def test_a_store_that_is_a_symlink_is_saved_where_it_points(tmp_path):
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    _tuned().save_pick(shared)
    mine.mkdir()
    (mine / "num_workers.json").symlink_to(shared / "num_workers.json")
    other = _tuned(ArrayDataset(np.zeros((64, 9), np.uint8), np.arange(64)))
    other.save_pick(mine)
    assert (mine / "num_workers.json").is_symlink()
    assert len(json.loads((shared / "num_workers.json").read_text())["results"]) == 2
    assert lookup(_tuned().fingerprint, mine).best_workers == 2


def test_a_store_whose_lock_another_process_keeps_is_one_line_not_a_timeout_traceback(tmp_path, monkeypatch):
    """A tuner stopped (SIGSTOP, a debugger) while saving keeps the lock: the next save waits the lock's
    time, then says so in one line naming the lock, instead of filelock's bare Timeout."""
    from filelock import FileLock

    import cupy_nwt.picks.store_file as store_file

    monkeypatch.setattr(store_file, "LOCK_TIMEOUT_S", 0.2)
    tuned = _tuned()
    tuned.save(cache_dir=tmp_path)
    held = FileLock(str(tmp_path / "num_workers.json.lock"))
    with held, pytest.raises(SavedPickError, match=r"num_workers\.json\.lock stayed held by another process for "
                                                    r"0\.2 s .*the picks were not saved"):
        tuned.save(cache_dir=tmp_path)
    assert lookup(tuned.fingerprint, tmp_path).best_workers == 2  # a reader takes no lock


def test_a_store_a_newer_version_wrote_is_neither_renamed_nor_overwritten(tmp_path, caplog):
    """Two versions on one machine (a new one in another environment): the older one once renamed the
    newer one's store aside as 'bad', losing its picks to it. It reads nothing from it and saves nothing
    over it, and says why."""
    store = tmp_path / "num_workers.json"
    newer = json.dumps({"format": "cupy_nwt.num_workers/2", "results": {"k": {"whatever": 1}}})
    store.write_text(newer)
    tuned = _tuned()
    with caplog.at_level("WARNING", logger="cupy_nwt.tuner"):
        assert lookup(tuned.fingerprint, tmp_path) is None
    assert "was written by a newer cupy_nwt (cupy_nwt.num_workers/2" in caplog.text
    with pytest.raises(SavedPickError, match="written by a newer cupy_nwt .*left as it is; set CUPY_NWT_CACHE_DIR"):
        tuned.save(cache_dir=tmp_path)
    assert store.read_text() == newer and sorted(p.name for p in tmp_path.iterdir()) == [
        "num_workers.json", "num_workers.json.lock"]


def test_a_store_that_is_no_regular_file_is_neither_read_renamed_nor_replaced(tmp_path, caplog):
    """A pipe (or a device a link names: /dev/zero) where the store should be: reading it would block or never end,
    and renaming it aside would move the system's device away. It is left as it is, and said."""
    store = tmp_path / "num_workers.json"
    os.mkfifo(store)
    tuned = _tuned()
    with caplog.at_level("WARNING", logger="cupy_nwt.tuner"):
        assert lookup(tuned.fingerprint, tmp_path) is None
    assert "is no regular file: it is left as it is" in caplog.text
    with pytest.raises(SavedPickError, match="is no regular file: it is left as it is"):
        tuned.save(cache_dir=tmp_path)
    assert store.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["num_workers.json",
                                                                             "num_workers.json.lock"]


def test_a_store_that_would_outgrow_what_a_reader_takes_drops_its_oldest_picks(tmp_path, monkeypatch, caplog):
    """The reader refuses a store past ``MAX_STORE_BYTES``: one more pick used to lose every pick at once. The
    writer makes room instead, dropping the picks saved longest ago, and says how many."""
    from cupy_nwt.picks import schema

    def tuned(batch_size: int):
        return tune_num_workers(DATA, batch_size=batch_size, max_workers=3, iterations=8, strategy="paper",
                                device="cpu", progress=False, measure=lambda w, i, u: 1.0 / (w + 1))

    picks = {bs: tuned(bs) for bs in (8, 9, 10, 11)}
    for bs in (8, 9, 10):
        picks[bs].save_pick(tmp_path)
    store = tmp_path / "num_workers.json"
    doc = json.loads(store.read_text())
    saved_at = {8: "2026-03-01T00:00:00+00:00", 9: "2026-01-01T00:00:00+00:00", 10: "2026-02-01T00:00:00+00:00"}
    for rec in doc["results"].values():
        rec["created"] = saved_at[rec["batch_size"]]
    store.write_text(json.dumps(doc, indent=2) + "\n")
    monkeypatch.setattr(schema, "MAX_STORE_BYTES", store.stat().st_size + 200)  # room for three picks, not four
    with caplog.at_level("INFO", logger="cupy_nwt.tuner"):
        assert picks[11].save_pick(tmp_path).replaced
    assert [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()] == [
        f"saved picks {store}: dropped the oldest 1 pick to stay within the {schema.MAX_STORE_BYTES} bytes a store may "
        "hold"]
    assert store.stat().st_size <= schema.MAX_STORE_BYTES and not list(tmp_path.glob("*.bad-*"))
    assert lookup(picks[9].fingerprint, tmp_path, similar=False) is None  # saved longest ago
    for bs in (8, 10, 11):
        assert lookup(picks[bs].fingerprint, tmp_path, similar=False).batch_size == bs


DAMAGED = '{"format": "cupy_nwt.num_workers/1", "results": {'  # cut short by a crash or a full disk


def test_a_damaged_store_in_a_folder_that_cannot_be_written_is_a_miss_with_one_warning(tmp_path, monkeypatch,
                                                                                        caplog):
    """A cache shared read-only still reads, damaged too: a miss for "auto" (it raised before), said once; a
    caller that will not search, and a save, get one error each."""
    (tmp_path / "num_workers.json").write_text(DAMAGED)
    _no_lock_here(tmp_path)
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))
    with caplog.at_level("WARNING", logger="cupy_nwt.tuner"):
        with DataLoader(DATA, batch_size=8, num_workers="auto", device="cpu", autotune=False) as loader:
            assert loader.stats().num_workers_why.startswith("no saved pick")
        assert lookup(_tuned().fingerprint) is None
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"saved picks: {tmp_path / 'num_workers.json'} not valid JSON")
    assert "and it cannot be set aside" in warning and warning.endswith("meanwhile it reads as empty")
    with pytest.raises(SavedPickError, match="cannot be set aside .*remove it by hand"):
        lookup(_tuned().fingerprint, strict=True)
    with pytest.raises(ArgumentError, match="cannot hold the saved picks"):
        _tuned().save_pick()
    assert (tmp_path / "num_workers.json").read_text() == DAMAGED


_READ_ONLY_USER = """
import logging, sys
import numpy as np
from cupy_nwt import DataLoader, tune_num_workers
from cupy_nwt.errors import SavedPickError

logging.basicConfig(level=logging.WARNING, format="%(message)s")
data = np.zeros((64, 4), np.float32)
with DataLoader(data, batch_size=8, num_workers="auto", device="cpu", autotune=False) as loader:
    print(loader.stats().num_workers_why)
result = tune_num_workers(data, batch_size=8, max_workers=2, iterations=4, strategy="paper", device="cpu",
                          progress=False, measure=lambda w, i, u: 1.0 / (w + 1))
try:
    result.save_pick()
except SavedPickError as exc:
    print("save:", exc)
"""


def test_a_damaged_store_in_a_read_only_folder_reads_as_a_miss_for_its_user(tmp_path):
    """As a user the folder's mode stops (root with the capabilities that pass over modes dropped), with the
    lock file an earlier save left: reading could lock but not set the file aside."""
    user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"] if os.geteuid() == 0 else []
    if user and shutil.which("setpriv") is None:
        pytest.skip("root writes anywhere, and setpriv is not here to drop that")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "num_workers.json").write_text(DAMAGED)
    (cache / "num_workers.json.lock").touch()
    cache.chmod(0o555)
    try:
        if subprocess.run([*user, "touch", str(cache / "x")], capture_output=True, check=False).returncode == 0:
            pytest.skip("this user writes into a read-only folder")
        env = dict(os.environ, CUPY_NWT_CACHE_DIR=str(cache), PYTHONPATH=str(Path(cupy_nwt.__file__).parents[1]))
        proc = subprocess.run([*user, sys.executable, "-c", _READ_ONLY_USER], capture_output=True, text=True,
                              env=env, timeout=120, check=False)
    finally:
        cache.chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    why, saved = proc.stdout.splitlines()
    assert why.startswith("no saved pick") and saved.startswith("save: ")
    assert "cannot be set aside (Permission denied): remove it by hand" in saved
    (warning,) = proc.stderr.splitlines()
    assert warning.startswith(f"saved picks: {cache / 'num_workers.json'} not valid JSON")
    assert warning.endswith("meanwhile it reads as empty")
