"""``loader.stats()``: per-stage figures since the last call, for every worker kind; the stall warning
names the batch and the worker; the workers' private memory, and the copy-on-read warning.

No timed assertions: the stage seconds are checked against sleeps the dataset itself takes (lower
bounds a slow machine only makes larger), a stall is provoked by a dataset that blocks until the
warning itself releases it, and memory growth comes from an injected reader or a real list of dicts.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import sys
import threading
import time
import warnings

import numpy as np
import pytest
from test_faults import clean  # noqa: F401 - the fixture used below
from test_online import Scripted, tuned
from toy_data import Squares

from cupy_nwt import DataLoader, get_worker_info, pack_records
from cupy_nwt.loader import Listener, LoaderParts, LoaderStats, MemoryGrowthWarning

MEMORY_WARN_BYTES = LoaderParts().memory_warn_bytes  # the default threshold

FETCH_S, TRANSFORM_S = 0.002, 0.005


class Sleepy(Squares):
    """Each sample takes at least FETCH_S to read."""

    def __getitem__(self, i: int):
        time.sleep(FETCH_S)
        return super().__getitem__(i)


def slow_transform(batch, seed):
    time.sleep(TRANSFORM_S)
    return batch


@pytest.mark.usefixtures("clean", "worker_type")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_stage_seconds_cover_what_the_dataset_and_transform_spent(num_workers):
    n, bs = 24, 4
    with DataLoader(Sleepy(n), batch_size=bs, num_workers=num_workers, device="cpu", seed=0,
                    batch_transform=slow_transform, persistent_workers=num_workers > 0) as dl:
        assert sum(1 for _ in dl) == n // bs
        s = dl.stats()
        assert isinstance(s, LoaderStats)
        assert s.batches == s.made == n // bs
        assert s.fetch_s >= n * FETCH_S
        assert s.transform_s >= (n // bs) * TRANSFORM_S
        assert s.collate_s >= 0 and s.copy_s >= 0 and s.waited_s > 0
        # the caller never outpaces sleeping workers: part of its wait is blocked for them; inline, none is
        assert (0 < s.blocked_s <= s.waited_s) if num_workers else s.blocked_s == 0.0
        assert s.busy_fraction is not None and s.busy_fraction > 0
        assert s.num_workers == num_workers
        assert s.prefetch_depth == (4 if num_workers else 0)
        json.dumps(s.to_dict())
        later = dl.stats()  # since the previous call: nothing happened
        assert (later.batches, later.made, later.fetch_s, later.transform_s, later.waited_s, later.blocked_s) == (
            0, 0, 0.0, 0.0, 0.0, 0.0)


@pytest.mark.usefixtures("clean", "worker_type")
def test_memory_is_per_worker_process_and_none_for_threads(worker_type):
    with DataLoader(Squares(32), batch_size=4, num_workers=2, device="cpu", seed=0, persistent_workers=True) as dl:
        list(dl)
        s = dl.stats()
        if worker_type == "thread":
            assert s.memory is None and s.worker_private_bytes is None
        else:
            assert sorted(m.pid for m in s.memory) == sorted(dl.worker_pids())
            assert all(m.uss_bytes > 0 for m in s.memory)
            assert s.worker_private_bytes == sum(m.uss_bytes for m in s.memory)


@pytest.mark.usefixtures("clean", "worker_type")
def test_only_new_tuner_decisions_and_the_live_setting():
    dl = tuned(Squares(64), Scripted((2, 6)), batch_size=2, num_workers=1, cpu_budget=2)
    try:
        first = dl.stats()
        assert [d["action"] for d in first.decisions] == ["start"]
        list(dl)
        s = dl.stats()
        assert [(d["action"], d["workers"], d["slots"]) for d in s.decisions] == [("add_workers", 2, 6)]
        assert (s.num_workers, s.prefetch_depth) == (2, 6)
        assert dl.stats().decisions == ()
    finally:
        dl.close()


class SlowReader:
    """A USS reader that takes a while: the baseline read after the first batch is still running."""

    def __call__(self, pid: int) -> int | None:
        time.sleep(0.3)
        return 1 << 20


@pytest.mark.usefixtures("clean")
def test_workers_added_mid_epoch_are_not_forked_beside_the_memory_baseline_thread(monkeypatch):
    """Python 3.12+ warns of a fork beside a thread (it may deadlock the child); the baseline read is joined first."""
    import os
    import sys

    beside: list[str] = []
    real_fork = os.fork

    def fork():
        for frame in sys._current_frames().values():
            while frame is not None:
                if frame.f_code.co_name == "_baseline" and frame.f_code.co_filename.endswith("_stats.py"):
                    beside.append(frame.f_code.co_name)
                frame = frame.f_back
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    dl = tuned(Squares(64), Scripted((2, 6)), batch_size=2, num_workers=1, cpu_budget=2, worker_type="process",
               multiprocessing_context="fork", parts=LoaderParts(reader=SlowReader()))
    try:
        list(dl)
        assert dl.stats().num_workers == 2
    finally:
        dl.close()
    assert beside == []


class Blocking(Squares):
    """Samples of batch ``block_batch`` wait on ``release`` (a process or thread Event) before returning."""

    def __init__(self, n: int, release, block_batch: int, bs: int, seen) -> None:
        super().__init__(n)
        self.release, self.first, self.seen = release, block_batch * bs, seen

    def __getitem__(self, i: int):
        if i == self.first:
            info = get_worker_info()
            self.seen.value = -1 if info is None else info.id
            self.release.wait()
        return super().__getitem__(i)


class _Releaser(logging.Handler):
    """Sets the event the blocked sample waits on when the stall warning is logged: nothing else frees it."""

    def __init__(self, event) -> None:
        super().__init__(logging.WARNING)
        self.event = event
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.event.set()


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_a_stall_names_the_batch_and_the_worker_that_has_it(worker_type):
    ctx = mp.get_context("fork")
    release = ctx.Event() if worker_type == "process" else threading.Event()
    seen = ctx.Value("i", -2) if worker_type == "process" else type("Seen", (), {"value": -2})()
    handler = _Releaser(release)
    log = logging.getLogger("cupy_nwt.loader")
    log.addHandler(handler)
    try:
        with DataLoader(Blocking(24, release, 3, 4, seen), batch_size=4, num_workers=2, device="cpu",
                        worker_type=worker_type, stall_warning_s=0.05, timeout=60,
                        **({"multiprocessing_context": "fork"} if worker_type == "process" else {})) as dl:
            got = [int(y[0]) for _, y in dl]
            s = dl.stats()
    finally:
        log.removeHandler(handler)
    assert got == list(range(0, 24, 4))  # the blocked batch came, in its turn, once the warning freed it
    assert len(s.stalls) >= 1
    stall = s.stalls[0]
    assert (stall.batch_index, stall.worker_id) == (3, seen.value)
    assert stall.waited_s >= 0.05
    text = handler.records[0].getMessage()
    assert "batch 3 of epoch 0" in text and f"worker {'thread ' if worker_type == 'thread' else ''}{seen.value}" in text


@pytest.mark.parametrize("bad", [0, -1.0, "10", True])
def test_stall_warning_s_must_be_positive_seconds_or_none(bad):
    with pytest.raises(ValueError, match="stall_warning_s must be a positive number"):
        DataLoader(Squares(4), stall_warning_s=bad)
    assert DataLoader(Squares(4), stall_warning_s=None).stall_warning_s is None


class Growing:
    """A USS reader whose readings grow by ``step`` bytes a call per process: copy-on-read, simulated."""

    def __init__(self, step: int) -> None:
        self.step, self.calls = step, {}

    def __call__(self, pid: int) -> int:
        self.calls[pid] = self.calls.get(pid, 0) + 1
        return 10 * 2**20 + self.step * (self.calls[pid] - 1)


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("persistent", [True, False])
def test_memory_growth_warns_once_naming_the_remedy(persistent):
    dl = DataLoader(Squares(16), batch_size=4, num_workers=2, device="cpu", persistent_workers=persistent,
                    multiprocessing_context="fork", parts=LoaderParts(reader=Growing(2 * MEMORY_WARN_BYTES)))
    with dl, pytest.warns(MemoryGrowthWarning, match=r"cupy_nwt\.pack_records") as caught:
        for _ in range(3):
            list(dl)
    assert len([w for w in caught if w.category is MemoryGrowthWarning]) == 1


@pytest.mark.usefixtures("clean")
def test_spawned_workers_growing_do_not_warn_of_copy_on_read():
    """A spawned worker shares no pages with the main process, and with more workers than CPUs one may still be
    starting when the first batch comes: its growth since is its own start-up, not copies of the dataset."""
    dl = DataLoader(Squares(16), batch_size=4, num_workers=2, device="cpu", multiprocessing_context="spawn",
                    parts=LoaderParts(reader=Growing(2 * MEMORY_WARN_BYTES)))
    with dl, warnings.catch_warnings():
        warnings.simplefilter("error", MemoryGrowthWarning)
        list(dl)


@pytest.mark.usefixtures("clean")
def test_flat_memory_does_not_warn():
    dl = DataLoader(Squares(16), batch_size=4, num_workers=2, device="cpu", persistent_workers=True,
                    parts=LoaderParts(reader=Growing(0)))
    with dl, warnings.catch_warnings():
        warnings.simplefilter("error", MemoryGrowthWarning)
        for _ in range(3):
            list(dl)
        assert all(m.growth_bytes == 0 for m in dl.stats().memory)


class Records:
    def __init__(self, records) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        return self.records[i]


def record_ids(samples) -> np.ndarray:
    time.sleep(0.002)  # a batch takes a moment, as decoding would: the workers' baseline is read in the first
    # batches (on a thread), and an epoch of instant batches (40 ms) could end before it was
    return np.fromiter((s["id"] for s in samples), dtype=np.int64, count=len(samples))


class CollectsAtTheEnd:
    """Small arrays; the last sample runs a full garbage collection in the worker."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> np.ndarray:
        if i == 63:
            import gc

            gc.collect()
        return np.full(4, i, np.int64)


@pytest.mark.usefixtures("clean")
def test_the_collector_in_a_worker_does_not_copy_the_inherited_heap():
    """gc.freeze() at worker start: a full collection in a forked worker leaves the parent's objects
    alone (without it, it writes to each of them and copies every page they sit on)."""
    heap = [{"i": i, "s": str(i)} for i in range(300_000)]  # about 80 MB the worker inherits
    with DataLoader(CollectsAtTheEnd(), batch_size=8, num_workers=1, device="cpu", persistent_workers=True,
                    multiprocessing_context="fork") as dl:
        assert len(list(dl)) == 8
        grown = dl.stats().worker_growth_bytes
    assert len(heap) == 300_000 and grown is not None and grown < 8 * 2**20, grown


@pytest.mark.usefixtures("clean")
def test_a_list_of_dicts_grows_forked_workers_and_its_packed_form_does_not():
    records = [{"id": i, "name": f"item-{i}", "tags": [i % 7, i % 11]} for i in range(40_000)]
    growth = {}
    for form, ds in (("list", Records(records)), ("packed", pack_records(records))):
        with DataLoader(ds, batch_size=256, shuffle=True, seed=0, num_workers=2, device="cpu", collate_fn=record_ids,
                        persistent_workers=True, multiprocessing_context="fork", parts=LoaderParts(memory_warn_bytes=2 * 2**20),
                        ) as dl, warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            list(dl)
            growth[form] = dl.stats().worker_growth_bytes
            warned = [x for x in w if x.category is MemoryGrowthWarning]
        assert len(warned) == (1 if form == "list" else 0), form
    assert growth["list"] > 4 * 2**20 > growth["packed"]


@pytest.mark.parametrize("pin", [True, "staging", False])
def test_the_prefetcher_announces_its_copy_time(pin):
    from test_prefetch import LazyCuda, assert_batches, run

    from cupy_nwt.loader.device.prefetch import DevicePrefetcher

    class Heard(Listener):
        copy_s, made_n = 0.0, 0

        def copied(self, seconds):
            self.copy_s += seconds

        def made(self, times):
            self.made_n += 1

    ops, heard = LazyCuda(), Heard()
    out, expected, _ = run(DevicePrefetcher(pin, ops, events=heard), ops)
    assert_batches(out, expected)
    assert heard.copy_s > 0 and heard.made_n == 0  # copies timed here; the batches' making is the source's to count


@pytest.mark.gpu
@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("pin", [True, False])
def test_gpu_stats_count_the_device_copy(pin):
    with DataLoader(Squares(64), batch_size=8, num_workers=2, device="cuda", pin_memory=pin) as dl:
        assert sum(1 for _ in dl) == 8
        s = dl.stats()
    assert s.batches == s.made == 8 and s.copy_s > 0 and s.copy.startswith("h2d")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stats_and_state_dict_read_one_progress_record_after_break(num_workers):
    """A user's loop leaves early; stats() and state_dict() tell the same story of the epoch."""
    loader = DataLoader(Squares(40), batch_size=4, num_workers=num_workers, device="cpu", seed=5)
    assert loader.stats().epoch is None
    for i, _ in enumerate(loader):
        if i == 2:
            break
    figures = loader.stats()
    assert (figures.epoch, figures.epoch_batches) == (0, 3)
    state = loader.state_dict()
    assert state["epoch"] == 0
    rest = DataLoader(Squares(40), batch_size=4, num_workers=num_workers, device="cpu", seed=5)
    rest.load_state_dict(state)
    assert sum(1 for _ in rest) == 10 - figures.epoch_batches
    loader.close()


class _Slow:
    def __len__(self) -> int:
        return 150

    def __getitem__(self, i: int) -> int:
        time.sleep(0.004)
        return i


def test_a_job_that_never_asks_for_stats_keeps_a_bounded_list_of_stalls(caplog):
    """Every stall is logged when it happens; ``stats()`` lists the first ``KEEP_STALLS``, so a long job that
    never calls it does not keep one record per stall for ever."""
    from cupy_nwt.loader._stats import KEEP_STALLS

    with caplog.at_level(logging.ERROR, logger="cupy_nwt.loader"), DataLoader(
            _Slow(), batch_size=1, num_workers=1, worker_type="thread", stall_warning_s=0.001) as dl:
        assert sum(1 for _ in dl) == 150
        s = dl.stats()
    assert len(s.stalls) == KEEP_STALLS == 100


@pytest.mark.parametrize("event", ["stall", "bad sample"])
def test_stats_polled_from_a_monitoring_thread_lists_every_event_once(monkeypatch, event):
    """A job may read ``stats()`` from a logging thread while the loop runs: each stall and skipped sample
    appears in exactly one call's list (none falls between a poll's read and its reset). The thread switch
    interval is made tiny and the lists' caps lifted, so that every event is one the poll could race."""
    from cupy_nwt.loader import _stats
    from cupy_nwt.loader._events import SkippedSample, Stall

    monkeypatch.setattr(_stats, "KEEP_STALLS", 10**9)
    monkeypatch.setattr(_stats, "KEEP_SKIPPED", 10**9)
    monkeypatch.setattr(_stats._log, "disabled", True)
    recorder, n, seen, done = _stats.Recorder(), 50_000, [], threading.Event()

    def listed() -> int:
        s = recorder.stats(decisions=(), workers=1, depth=2, copy="none", worker_type="thread", pids=None)
        return len(s.stalls) if event == "stall" else len(s.bad_samples)

    def poll() -> None:
        while not done.is_set():
            seen.append(listed())

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        poller = threading.Thread(target=poll)
        poller.start()
        for i in range(n):
            if event == "stall":
                recorder.stalled(Stall(0, i, 0, "is being read by worker 0", 1.0))
            else:
                recorder.skipped(SkippedSample(0, i, i, "sample", "unreadable"))
        done.set()
        poller.join()
    finally:
        sys.setswitchinterval(before)
    assert sum(seen) + listed() == n


def test_two_threads_about_to_fork_both_wait_for_the_memory_read_in_progress():
    """Two threads of a program each starting a loader (or adding a worker) settle the baseline reads first,
    so that neither forks beside the reading thread: the second must not pass while the first waits on it."""
    from cupy_nwt.loader import _stats

    release = threading.Event()
    recorder = _stats.Recorder(reader=lambda pid: 1 << 20 if release.wait() else None)
    recorder.first_batch([123])
    settled: list[str] = []
    threads = [threading.Thread(target=lambda name=name: (_stats.settle_baselines(), settled.append(name)))
               for name in ("first", "second")]
    try:
        for t in threads:
            t.start()
            time.sleep(0.1)
        assert settled == []  # neither has passed while the read runs
    finally:
        release.set()
        for t in threads:
            t.join(timeout=10)
    assert sorted(settled) == ["first", "second"]


def test_baselines_of_workers_that_are_gone_are_let_go_when_new_workers_start():
    """Workers started afresh each epoch (forkserver, spawn, not persistent) each get a memory baseline: those of
    past epochs' workers, which have exited, are dropped, so they neither pile up over a long run nor read as a
    later process's that the kernel gave the same pid."""
    import subprocess

    from cupy_nwt.loader import _stats

    recorder = _stats.Recorder(reader=lambda pid: 1 << 20, forked=False)
    for epoch in range(5):
        procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
        pids = [p.pid for p in procs]
        recorder.first_batch(pids)
        _stats.settle_baselines()
        assert set(recorder.first) == set(pids)  # this epoch's workers only
        recorder.ended(pids)
        for p in procs:
            p.kill()
            p.wait()
