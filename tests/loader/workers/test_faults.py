"""Faults through the public API; after each: no new cupy_nwt_* segment, no live child process."""

from __future__ import annotations

import gc
import os
import re
import signal
import threading
import time

import numpy as np
import psutil
import pytest
from toy_data import Squares

from cupy_nwt import DataLoader, LoaderError, LoaderTimeoutError, RingMemoryError, WorkerDiedError, WorkerError
from cupy_nwt.loader.ring.ring import live_segments
from cupy_nwt.loader.workers.thread import STUCK_SUFFIX

pytestmark = pytest.mark.usefixtures("worker_type")

NO_HANG_S = 15.0  # generous on a loaded 2-core machine; a hang would be unbounded


class FailsAt(Squares):
    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int):
        if i == self.bad:
            explode(i)
        return super().__getitem__(i)


def explode(i: int) -> None:
    raise ValueError(f"cannot read sample {i}")


SLOW_RELEASE = threading.Event()


class Slow(Squares):
    """Waits ``delay`` s in ``__getitem__`` (at sample ``at``, or at each), or until ``clean`` ends the test: a
    thread worker left waiting cannot be stopped, and would run on beside every process forked after it."""

    def __init__(self, n: int, delay: float, at: int | None = None) -> None:
        super().__init__(n)
        self.delay, self.at = delay, at

    def __getitem__(self, i: int):
        if self.at is None or i == self.at:
            SLOW_RELEASE.wait(self.delay)
        return super().__getitem__(i)


class ExitsAt(Squares):
    def __getitem__(self, i: int):
        if i == 20:
            os._exit(3)
        return super().__getitem__(i)


def failing_init(worker_id: int) -> None:
    raise RuntimeError(f"no licence for worker {worker_id}")


def _infrastructure(p: psutil.Process) -> bool:
    """multiprocessing's per-interpreter helpers (resource tracker, forkserver), not loader workers."""
    try:
        cmd = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return True
    return "resource_tracker" in cmd or "forkserver" in cmd


def live_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not _infrastructure(p):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def live_worker_threads() -> list[str]:
    """Thread workers still running, less those shutdown found stuck in user code (they cannot be killed)."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith("cupy_nwt-worker-") and not t.name.endswith(STUCK_SUFFIX)]


def stuck_worker_threads() -> list[threading.Thread]:
    """Thread workers that shutdown found stuck in user code."""
    return [t for t in threading.enumerate() if t.name.startswith("cupy_nwt-worker-") and t.name.endswith(STUCK_SUFFIX)]


@pytest.fixture
def clean():
    """Asserts the test left no cupy_nwt segment of this process, no live child and no worker thread behind,
    once a ``Slow`` sample has returned (a worker thread stuck in one ends; stuck, it is not counted).

    Other test runs on the machine may own cupy_nwt segments at the same time: only names carrying
    this process id count. Children alive before the test (torch's own workers, which a torch iterator
    that an earlier case's kept traceback still references keeps alive) are not this test's.
    """
    before = live_segments(os.getpid())
    older = {p.pid for p in live_children()}
    stuck_before = set(stuck_worker_threads())

    def left() -> list[psutil.Process]:
        return [p for p in live_children() if p.pid not in older]

    yield
    SLOW_RELEASE.set()
    for t in set(stuck_worker_threads()) - stuck_before:
        t.join(NO_HANG_S)
    SLOW_RELEASE.clear()
    gc.collect()
    deadline = time.monotonic() + 5.0
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == []
    while live_worker_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_worker_threads() == []
    assert live_segments(os.getpid()) - before == set()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataset_exception_reaches_the_caller_with_worker_sample_and_traceback(clean, num_workers):
    dl = DataLoader(FailsAt(64, bad=13), batch_size=8, num_workers=num_workers, device="cpu")
    got = []
    with pytest.raises(WorkerError) as ei:
        for _, y in dl:
            got.append(y)
    err = ei.value
    assert [y.tolist() for y in got] == [list(range(8))]  # in order: batch 0 first, then the failure
    assert err.sample_index == 13 and err.batch_index == 1 and err.exc_type == "ValueError"
    assert "cannot read sample 13" in str(err) and "sample index 13" in str(err)
    assert "in explode" in err.traceback_text and "in explode" in str(err)
    assert isinstance(err.__cause__, ValueError)
    if num_workers:
        named = (f"loader worker thread {err.worker_id} failed" if dl.worker_type == "thread"  # a thread's pid is ours
                 else f"loader worker {err.worker_id} (pid {err.pid}) failed")
        assert err.worker_id in (0, 1) and named in str(err)
    else:
        assert err.worker_id is None and "main process" in str(err)
    dl.close()


@pytest.mark.process_only("a thread cannot be SIGKILLed apart from its process")
def test_killed_worker_is_reported_with_pid_and_signal_without_hanging(clean):
    dl = DataLoader(Slow(400, delay=0.005), batch_size=4, num_workers=2, device="cpu")
    it = iter(dl)
    next(it)
    victim = dl.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerDiedError) as ei:
        for _ in it:
            pass
    assert time.monotonic() - t0 < NO_HANG_S
    err = ei.value
    assert err.pid == victim and err.signal_name == "SIGKILL"
    assert f"pid {victim}" in str(err) and "SIGKILL" in str(err) and f"worker {err.worker_id}" in str(err)
    assert dl.worker_pids() == []


@pytest.mark.process_only("os._exit in a thread ends the whole process")
def test_worker_exiting_by_itself_is_reported_with_its_exit_code(clean):
    with DataLoader(ExitsAt(64), batch_size=8, num_workers=2, device="cpu") as dl:
        with pytest.raises(WorkerDiedError, match="exit code 3"):
            list(dl)


def test_timeout_raises_a_clear_error(clean):
    dl = DataLoader(Slow(32, delay=30.0, at=12), batch_size=4, num_workers=2, timeout=0.3, device="cpu")
    t0 = time.monotonic()
    with pytest.raises(LoaderTimeoutError, match=r"timeout=0.3 s.*batch 3"):
        list(dl)
    assert time.monotonic() - t0 < NO_HANG_S  # includes stopping the stuck worker
    assert isinstance(LoaderTimeoutError("x"), TimeoutError)


def test_a_timeout_takes_no_turn_so_a_saved_state_resumes_at_that_batch(clean):
    """The timeout is raised while batch 3 is still being made: ``state_dict()`` then stands before it,
    and a new loader resumed from it delivers it and the rest, every sample once."""
    dl = DataLoader(Slow(32, delay=3.0, at=12), batch_size=4, num_workers=2, timeout=0.4, seed=1, device="cpu")
    it = iter(dl)
    labels = [label for _ in range(3) for label in next(it)[1].tolist()]
    with pytest.raises(LoaderTimeoutError, match="batch 3"):
        next(it)
    state = dl.state_dict()
    it.close()
    again = DataLoader(Squares(32), batch_size=4, num_workers=2, seed=1, device="cpu")
    again.load_state_dict(state)
    labels += [label for _, batch_labels in again for label in batch_labels.tolist()]
    assert labels == list(range(32))


def test_keyboard_interrupt_in_the_loop_body_shuts_everything_down(clean):
    dl = DataLoader(Slow(400, delay=0.002), batch_size=4, num_workers=2, device="cpu")
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(dl):
            if i == 3:
                raise KeyboardInterrupt
    assert dl.worker_pids() == []


def test_break_ends_non_persistent_workers_at_once(clean):
    dl = DataLoader(Squares(400), batch_size=4, num_workers=3, device="cpu")
    for i, _ in enumerate(dl):
        if i == 2:
            break
    assert dl.worker_pids() == []


@pytest.mark.process_only("worker_pids() are processes; test_loader_threads checks the threads")
def test_break_keeps_persistent_workers_until_close(clean):
    dl = DataLoader(Squares(80), batch_size=4, shuffle=True, seed=1, num_workers=2, persistent_workers=True, device="cpu")
    for i, _ in enumerate(dl):
        if i == 2:
            break
    pids = dl.worker_pids()
    assert len(pids) == 2
    labels = np.concatenate([y for _, y in dl])  # stale tasks of the broken epoch must not leak in
    assert sorted(labels.tolist()) == list(range(80))
    ref = DataLoader(Squares(80), batch_size=4, shuffle=True, seed=1, device="cpu")
    ref.set_epoch(1)
    assert np.array_equal(labels, np.concatenate([y for _, y in ref]))
    assert dl.worker_pids() == pids
    dl.close()
    dl.close()
    assert dl.worker_pids() == []


@pytest.mark.process_only("worker_pids() are processes; test_loader_threads checks the threads")
def test_loader_dropped_without_close_cleans_up(clean):
    dl = DataLoader(Squares(200), batch_size=4, num_workers=2, persistent_workers=True, device="cpu")
    it = iter(dl)
    next(it)
    pids = dl.worker_pids()
    assert pids
    del it, dl
    gc.collect()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_failing_worker_init_fn_is_reported(clean):
    with DataLoader(Squares(64), batch_size=4, num_workers=2, worker_init_fn=failing_init, device="cpu") as dl:
        with pytest.raises(WorkerError, match=r"worker_init_fn.*no licence for worker"):
            list(dl)


@pytest.mark.process_only("start methods are for processes")
def test_unpicklable_dataset_with_spawn_is_a_clear_error(clean):
    class Local(Squares):
        pass

    with DataLoader(Local(8), batch_size=4, num_workers=1, multiprocessing_context="spawn", device="cpu") as dl:
        with pytest.raises(LoaderError, match="by pickling, and that failed"):
            list(dl)


@pytest.mark.process_only("a thread ring is anonymous memory, not /dev/shm")
def test_full_dev_shm_fails_up_front_with_the_size_needed(clean, monkeypatch):
    import errno

    import cupy_nwt.loader.ring.ring as shm

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    monkeypatch.delattr(os, "memfd_create")  # the fallback: a /dev/shm segment
    with DataLoader(Squares(64), batch_size=8, num_workers=2, device="cpu") as dl:
        with pytest.raises(shm.ShmSpaceError, match=r"ring needs .* MiB of /dev/shm.*--shm-size"):
            list(dl)
        assert dl.worker_pids() == []


@pytest.mark.process_only("a thread ring is this process's anonymous memory, never reserved")
def test_memory_refusing_the_ring_fails_up_front_with_the_size_needed(clean, monkeypatch):
    import errno

    import cupy_nwt.loader.ring.ring as shm

    def no_memory(fd, offset, length):
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

    monkeypatch.setattr(os, "posix_fallocate", no_memory)
    # samples that take a moment, as real ones do: the epoch outlasts the allocating thread's refusal, which
    # is raised at the pool's next wait (an epoch of 64 instant samples could end before that thread ran)
    with DataLoader(Slow(64, 0.005), batch_size=8, num_workers=2, device="cpu") as dl:
        with pytest.raises(shm.ShmSpaceError) as info:  # code written for /dev/shm still catches it
            list(dl)
        assert dl.worker_pids() == []
    assert type(info.value) is RingMemoryError
    assert re.fullmatch(r"the loader's ring needs \d+\.\d MiB of shared memory \(\d+ bytes\) but only .* are free "
                        r"(in available memory|under the cgroup memory limit) .*\(Cannot allocate memory\); lower batch_size, "
                        r"num_workers or prefetch_factor, .*", str(info.value))


class RecordError(Exception):
    """An error whose own message has a bug: ``str()`` of it raises."""

    def __init__(self, record) -> None:
        super().__init__(record)
        self.record = record

    def __str__(self) -> str:
        return "bad record " + self.record["id"]


class BadRecordAt(Squares):
    def __getitem__(self, i):
        if i == 3:
            raise RecordError({"name": "x"})
        return super().__getitem__(i)


class Refuses:
    """A sample object whose pickling raises something other than a PicklingError."""

    def __reduce__(self):
        raise RuntimeError("this object refuses to be pickled")


class RefusingSamples(Squares):
    def __getitem__(self, i):
        return Refuses() if i == 5 else super().__getitem__(i)


def as_is(samples):
    return samples


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_whose_str_raises_still_reaches_the_caller_as_its_own_type(clean, num_workers):
    """As under torch. The worker used to die reporting it (its message could not be made), the caller getting a
    WorkerDiedError; the main process raised a TypeError making the batch's failure."""
    with DataLoader(BadRecordAt(8), batch_size=2, num_workers=num_workers, device="cpu") as dl:
        with pytest.raises(RecordError) as ei:
            list(dl)
    assert isinstance(ei.value, WorkerError)


@pytest.mark.process_only("thread workers hand batches over without pickling them")
def test_a_batch_whose_pickling_raises_any_error_fails_that_batch_not_the_worker(clean):
    with DataLoader(RefusingSamples(8), batch_size=2, num_workers=2, collate_fn=as_is, device="cpu") as dl:
        it = iter(dl)
        got = [next(it), next(it)]
        with pytest.raises(WorkerError, match="the batch does not pickle.*RuntimeError: this object refuses"):
            next(it)
        got.append(next(it))
    assert len(got) == 3


class InterruptedOnce(Squares):
    """Ctrl-C (or a watchdog's signal handler raising) lands while sample 9 is read, once."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.interrupted = False

    def __getitem__(self, i):
        if i == 9 and not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        return super().__getitem__(i)


def test_an_iteration_interrupted_inside_next_says_so_and_its_state_resumes_the_rest(clean):
    """A script that catches the interrupt and calls next() again on the same iterator got StopIteration: the
    epoch ended early, 8 batches of 20 delivered, with no error (torch's iterator goes on)."""
    with DataLoader(InterruptedOnce(40), batch_size=2, device="cpu") as dl:
        it = iter(dl)
        got = [next(it) for _ in range(4)]
        with pytest.raises(KeyboardInterrupt):
            next(it)
        with pytest.raises(LoaderError, match="this iteration ended with KeyboardInterrupt after 4 batches"):
            next(it)
        with pytest.raises(StopIteration):  # said once: a loop that catches errors and goes on then ends
            next(it)
        dl.load_state_dict(dl.state_dict())
        got += list(dl)
    assert [int(y[0]) for _, y in got] == list(range(0, 40, 2))
