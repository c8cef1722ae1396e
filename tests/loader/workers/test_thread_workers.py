"""Thread workers where they differ from processes: no pickling, no /dev/shm, per-thread worker info,
threads that cannot be killed; and the tuner's worker-type search and saved pick."""

from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np
import pytest
from test_faults import NO_HANG_S, clean, live_worker_threads  # noqa: F401 - clean: the fixture used below
from toy_data import Squares

from cupy_nwt import (
    DataLoader,
    IterableDataset,
    LoaderError,
    LoaderTimeoutError,
    WorkerDiedError,
    get_worker_info,
    tune_num_workers,
)
from cupy_nwt._worker_info import worker_seed
from cupy_nwt.loader.ring.ring import live_segments
from cupy_nwt.loader.workers.thread import STUCK_SUFFIX
from cupy_nwt.picks.store import TuneResult


class Who(Squares):
    def __getitem__(self, i: int):
        info = get_worker_info()
        assert info is not None
        return {"x": np.full(2, i, np.int64), "seed": info.seed, "id": info.id, "thread": threading.get_ident()}


def unpicklable(samples):
    return {"x": np.stack([s[0] for s in samples]), "fn": lambda: len(samples)}


class Blocks(Squares):
    """Sample 0 waits for ``release``: a sample stuck in user code."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.release = threading.Event()

    def __getitem__(self, i: int):
        if i == 0:
            self.release.wait(60)
        return super().__getitem__(i)


class Exits(Squares):
    def __getitem__(self, i: int):
        raise SystemExit(5)


@pytest.mark.usefixtures("clean")
def test_threads_give_the_process_workers_batches_without_shm_or_pids():
    kw = dict(batch_size=5, shuffle=True, seed=4, num_workers=2, device="cpu", output="numpy")
    with DataLoader(Squares(37), worker_type="process", **kw) as dl:
        ref = [(x.copy(), y.copy()) for x, y in dl]
    before = live_segments(os.getpid())
    with DataLoader(Squares(37), worker_type="thread", **kw) as dl:
        it = iter(dl)
        got = [next(it)]
        assert live_worker_threads() == ["cupy_nwt-worker-0", "cupy_nwt-worker-1"]
        assert dl.worker_pids() == [] and dl.start_method == "thread"
        got += list(it)
        assert dl.layout is not None  # the ring exists, in anonymous memory
    assert live_segments(os.getpid()) == before
    assert len(got) == len(ref) and all((a == c).all() and (b == d).all() for (a, b), (c, d) in zip(got, ref))


def test_batches_are_handed_over_unpickled():
    with DataLoader(Squares(8), batch_size=4, collate_fn=unpicklable, num_workers=1, worker_type="thread",
                    device="cpu") as dl:
        assert [b["fn"]() for b in dl] == [4, 4]


def test_worker_info_is_per_thread_with_the_process_workers_seeds():
    seen = []
    with DataLoader(Who(24), batch_size=3, num_workers=2, seed=9, worker_type="thread", device="cpu") as dl:
        for b in dl:
            assert get_worker_info() is None  # the main thread, while the workers run
            seen += list(zip(b["id"].tolist(), b["seed"].tolist(), b["thread"].tolist()))
    assert {(w, s) for w, s, _ in seen} == {(w, worker_seed(9, w, 0)) for w in (0, 1)}
    assert threading.get_ident() not in {t for _, _, t in seen} and len({t for _, _, t in seen}) == 2


@pytest.mark.usefixtures("clean")
def test_persistent_threads_survive_epochs_and_end_on_close():
    with DataLoader(Who(20), batch_size=4, num_workers=2, persistent_workers=True, worker_type="thread",
                    device="cpu") as dl:
        first = {t for b in dl for t in b["thread"].tolist()}
        assert len(live_worker_threads()) == 2
        second = {t for b in dl for t in b["thread"].tolist()}
        assert first == second and len(first) == 2
    assert live_worker_threads() == []


def test_a_stuck_thread_times_out_and_is_left_to_finish_with_a_warning(caplog):
    data = Blocks(8)
    earlier = {t for t in threading.enumerate() if t.name.endswith(STUCK_SUFFIX)}  # other tests' stuck threads
    dl = DataLoader(data, batch_size=2, num_workers=1, timeout=0.5, worker_type="thread", device="cpu")
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="cupy_nwt.loader.workers.thread"):
        with pytest.raises(LoaderTimeoutError, match="waiting for batch 0"):
            next(iter(dl))
        dl.close()
    assert time.monotonic() - t0 < NO_HANG_S  # a hang guard: shutdown's wait is bounded
    assert any("still in user code" in r.getMessage() for r in caplog.records)
    stuck = [t for t in threading.enumerate() if t.name.endswith(STUCK_SUFFIX) and t not in earlier]
    assert stuck
    data.release.set()
    for t in stuck:
        t.join(NO_HANG_S)
    assert not any(t.is_alive() for t in stuck)


@pytest.mark.usefixtures("clean")
def test_a_thread_that_dies_is_a_worker_died_error():
    with DataLoader(Exits(8), batch_size=2, num_workers=2, worker_type="thread", device="cpu") as dl:
        with pytest.raises(WorkerDiedError, match="worker thread .* SystemExit"):
            list(dl)


class Lines(IterableDataset):
    """A stream that opens its file in ``__init__``: process workers share it by fork, a thread's copy cannot."""

    def __init__(self, path) -> None:
        self.file = open(path)  # noqa: SIM115 - held open, as such a dataset does

    def __iter__(self):
        info = get_worker_info()
        self.file.seek(0)
        return (line.strip() for k, line in enumerate(self.file) if k % info.num_workers == info.id)


class CopiesOnce(IterableDataset):
    """A stream whose second copy fails (the first thread already runs)."""

    copies = 0

    def __iter__(self):
        return iter(range(4))

    def __deepcopy__(self, memo):
        type(self).copies += 1
        if type(self).copies > 1:
            raise MemoryError("no room for another copy")
        return CopiesOnce()


@pytest.mark.usefixtures("clean")
def test_a_stream_thread_workers_cannot_copy_is_refused_in_one_line(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"line{k}\n" for k in range(10)))
    data = Lines(path)
    with DataLoader(data, batch_size=2, num_workers=2, worker_type="process", device="cpu") as dl:
        assert sorted(x for b in dl for x in b) == sorted(f"line{k}" for k in range(10))
    with DataLoader(data, batch_size=2, num_workers=2, worker_type="thread", device="cpu") as dl:
        with pytest.raises(LoaderError, match="copying Lines failed: TypeError: cannot pickle") as ei:
            next(iter(dl))
    assert "\n" not in str(ei.value) and "worker_type='process'" in str(ei.value)
    assert live_worker_threads() == []
    data.file.close()


@pytest.mark.usefixtures("clean")
def test_threads_started_before_a_failed_start_are_stopped():
    with DataLoader(CopiesOnce(), batch_size=2, num_workers=2, worker_type="thread", device="cpu") as dl:
        with pytest.raises(LoaderError, match="MemoryError: no room for another copy"):
            next(iter(dl))
        assert live_worker_threads() == []


@pytest.mark.parametrize("kwargs, match", [
    (dict(worker_type="fiber"), "worker_type must be 'process' or 'thread', got 'fiber'"),
    (dict(worker_type="thread", num_workers=1, multiprocessing_context="fork"), "applies to process workers"),
    (dict(worker_type="thread", num_workers=1, multiprocessing_context="spawn"), "applies to process workers"),
])
def test_worker_type_is_checked_in_one_line(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataLoader(Squares(4), device="cpu", **kwargs)


# -- the tuner


def curve(workers: int, iterations: int, warmup: int, *, worker_type: str) -> float:
    """Seconds per batch: threads 2x faster than processes at every count, best at 2 workers."""
    base = {0: 1.0, 1: 0.5}.get(workers, 0.3 + 0.01 * (workers - 2))  # 3: 0.31, and on (the open search may look)
    return base / 2 if worker_type == "thread" else base


def test_the_search_covers_worker_types_and_records_the_winner(tmp_path):
    result = tune_num_workers(batch_size=4, max_workers=4, iterations=20, measure=curve, progress=False,
                              worker_types=("process", "thread"))
    assert result.worker_type == "thread" and result.best_workers == 2
    assert [(o.worker_type, o.best_workers) for o in result.other_types] == [("process", 2)]
    assert result.other_types[0].samples_per_second == pytest.approx(4 / 0.3)
    back = TuneResult.load(result.save(tmp_path / "pick.json"))
    assert back == result
    old = {k: v for k, v in result.to_dict().items() if k not in ("worker_type", "other_types")}
    assert TuneResult.from_dict(old).worker_type == "process"  # a pick saved before types were searched


def zero_is_best(workers: int, iterations: int, warmup: int, *, worker_type: str) -> float:
    """Seconds per batch: 0 workers best for both types, "thread" measured 5x faster by chance (the noise of
    one pipeline measured twice: at 0 workers both types are the main process alone)."""
    base = 0.01 if workers == 0 else 1.0
    return base / 5 if worker_type == "thread" else base


def test_a_pick_of_zero_workers_keeps_the_first_type_not_the_noise_between_two_measurements_of_one_pipeline():
    result = tune_num_workers(batch_size=4, max_workers=3, iterations=20, measure=zero_is_best, progress=False,
                              worker_types=("process", "thread"))
    assert (result.best_workers, result.worker_type) == (0, "process")
    flipped = tune_num_workers(batch_size=4, max_workers=3, iterations=20, measure=zero_is_best, progress=False,
                               worker_types=("thread", "process"))
    assert (flipped.best_workers, flipped.worker_type) == (0, "thread")  # the first named, whichever measured faster


def test_auto_applies_the_saved_worker_type(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))
    data = Squares(64)
    result = tune_num_workers(data, batch_size=8, max_workers=3, iterations=20, measure=curve, progress=False,
                              worker_types=("process", "thread"), device="cpu")
    result.save()
    with DataLoader(data, batch_size=8, num_workers="auto", device="cpu") as dl:
        assert (dl.num_workers, dl.worker_type) == (2, "thread")
    with DataLoader(data, batch_size=8, num_workers="auto", device="cpu", worker_type="process") as dl:
        assert (dl.num_workers, dl.worker_type) == (2, "process")  # a type given wins over the pick's


def test_without_a_saved_pick_auto_tunes_online_with_the_type_given_else_processes(tmp_path, monkeypatch):
    """A miss searches nothing: the loader tunes online with the worker type given, else processes."""
    def search(*args, **kwargs):
        raise AssertionError("num_workers='auto' ran the offline search")

    monkeypatch.setattr("cupy_nwt.nwt.tune.tune_num_workers", search)
    for i, (kw, want) in enumerate([(dict(autotune=True, cpu_budget=3), "process"), ({}, "process"),
                                    (dict(worker_type="thread"), "thread"),
                                    (dict(autotune=True, cpu_budget=3, worker_type="thread"), "thread")]):
        monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / str(i)))
        with DataLoader(Squares(64), batch_size=8, num_workers="auto", device="cpu", **kw) as dl:
            assert dl.worker_type == want and dl.decisions[0].action == "start"
            assert len(list(dl)) == 8
