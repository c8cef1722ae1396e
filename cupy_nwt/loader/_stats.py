"""``loader.stats()``: where a loader's time goes, stage by stage, and what its workers hold, since the last call.

Why this shape: a slow input pipeline is slow in one stage (reading samples, collating them, the
``batch_transform``, the copy out or to the device) or short of workers; the figures say which,
over the interval the caller chooses by calling ``stats()`` again, without a profiler and without
adding a sync or a lock to the hot path. Everything is counted on the main thread:

* the caller's wait, by the epoch iterator (``epoch.epoch``): the seconds spent inside ``next()``;
* the seconds each batch spent fetching, collating and in ``batch_transform``, measured where the
  batch is made (``BatchMaker.produce``, in a worker or the main process) and sent back with it;
  busy fraction = those seconds / (wall seconds x workers) (x 1 with ``num_workers=0``: then it is
  the share of the caller's time spent making batches; under online tuning, each active count x the
  seconds it held);
* copy seconds: on the CPU, the copy out of the ring (0 with ``zero_copy``); on the GPU, the host's
  time issuing the H2D copies (and the staging memcpy): with ``pin_memory`` the copy itself runs
  asynchronously and is not timed, without it the driver copies synchronously and that is the copy.

The figures are a listener (``_events``): the stages announce what happened and ``Recorder`` adds it
up, so a new per-stage timer (a field of ``StageTimes``) shows in ``stages`` and ``to_dict()`` with
no change here. Two warnings ride on the same counters. A stall (one ``next()`` waiting longer than
``stall_warning_s``, default ``STALL_WARNING_S``) is logged on ``cupy_nwt.loader`` at WARNING, each
time, naming the batch waited for and the worker that has it. Copy-on-read memory: at each epoch's
end the workers' private memory (USS) is read; when it has grown since their first batch by more
than ``MEMORY_WARN_BYTES`` a worker on average, a ``MemoryGrowthWarning`` is issued, once per loader,
naming the remedy (forked workers only: spawned and forkserver ones share no pages with the main process,
and the pickle they rebuild is the other warning's). Reading a Python object writes its reference count, so forked workers that read
a list of dicts copy the pages they touch: with a shuffled order nearly all of them in the first
epoch (``bench/results/copy_on_read-*.json``: about 140 MB a worker, then flat), so growth over
the workers' life, not growth in every epoch, is what names the cause. The baseline is read on a
thread beside the caller, not on the first batch's path: a worker forked from a large process
(JAX and torch loaded) takes milliseconds to read, sixteen of them longer than torch's whole start.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from .._background import Background
from ..errors import ArgumentError
from ._events import Listener, SkippedSample, StageTimes, Stall

STALL_WARNING_S = 10.0  # the default stall threshold: one next() waiting this long is worth a line
MEMORY_WARN_BYTES = 64 << 20  # workers' private memory grown by this much a worker: the copy-on-read warning
_log = logging.getLogger("cupy_nwt.loader")
_COUNTS = ("delivered", "made", "waited_s", "blocked_s", "copy_s", "skipped")
KEEP_SKIPPED = 100  # skipped samples ``stats()`` lists (every one is counted, and logged)
KEEP_STALLS = 100  # stalls ``stats()`` lists (every one is logged): a job that never asks keeps no more
_reading: list[Background] = []  # baselines being read, by any loader of this process
os.register_at_fork(after_in_child=_reading.clear)  # a forked child has none of the threads reading them


class MemoryGrowthWarning(UserWarning):
    """The loader's worker processes keep private copies of the dataset: pages a forked worker's reads
    copied (copy-on-read), or a large pickle of Python objects each forkserver or spawn worker rebuilds."""


@dataclass(frozen=True)
class WorkerMemory:
    """A worker process's private memory (USS) now, and its growth since its first batch."""

    pid: int
    uss_bytes: int
    growth_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LoaderStats:
    """A loader's figures over ``interval_s`` (since the previous ``stats()``, or since the loader was made).

    ``waited_s`` is the caller's time inside ``next()``; ``blocked_s``, the part of it spent blocked
    for a batch the workers had not made yet (more workers help that; the rest is the loader
    handing batches out, and on a busy machine the caller's process waiting for a CPU).
    ``stages`` sums each batch's ``StageTimes`` (``fetch_s``, ``collate_s``, ``transform_s`` read
    them). ``busy_fraction`` is None when no wall time passed; a batch's seconds count in the interval its
    answer arrives in, so over an interval shorter than making a batch, batches made before it (prefetched)
    can take it past 1: read it over intervals of several batches. ``memory`` is None for thread workers
    (a thread has no private memory of its own) and empty when no worker process is alive.
    ``epoch`` and ``epoch_batches`` come from the newest iteration's progress record, the one
    ``state_dict()`` reads: its epoch and the batches this iteration handed to the caller so far (None before
    the first ``iter()``). ``num_workers_why``: with ``num_workers="auto"``, what the tuner picked
    and why, in one line (``TuneResult.why``), or on a miss that it tunes online; None for a count given. ``skipped_samples`` counts the samples left out of their batches
    (``on_bad_sample="skip"``), ``bad_samples`` lists the first ``KEEP_SKIPPED`` of them; ``stalls``, the
    first ``KEEP_STALLS`` waits past the stall threshold (each is logged when it happens).
    """

    interval_s: float
    batches: int
    waited_s: float
    blocked_s: float
    made: int
    busy_fraction: float | None
    stages: StageTimes
    copy_s: float
    copy: str
    num_workers: int
    prefetch_depth: int
    worker_type: str
    decisions: tuple[dict[str, Any], ...]
    stalls: tuple[Stall, ...]
    memory: tuple[WorkerMemory, ...] | None
    epoch: int | None = None
    epoch_batches: int | None = None
    num_workers_why: str | None = None
    skipped_samples: int = 0
    bad_samples: tuple[SkippedSample, ...] = ()

    @property
    def fetch_s(self) -> float:
        return self.stages.fetch_s

    @property
    def collate_s(self) -> float:
        return self.stages.collate_s

    @property
    def transform_s(self) -> float:
        return self.stages.transform_s

    @property
    def worker_private_bytes(self) -> int | None:
        """The workers' summed private memory (None for thread workers, and where no worker process was alive to
        read: not 0, which would read as workers using none)."""
        return sum(m.uss_bytes for m in self.memory) if self.memory else None

    @property
    def worker_growth_bytes(self) -> int | None:
        """How much the workers' private memory grew since their first batch, summed (None as above)."""
        return sum(m.growth_bytes for m in self.memory) if self.memory else None

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "stages"}
        d.update(self.stages.to_dict())
        d["stalls"] = [s.to_dict() for s in self.stalls]
        d["bad_samples"] = [b.to_dict() for b in self.bad_samples]
        d["memory"] = None if self.memory is None else [m.to_dict() for m in self.memory]
        d["decisions"] = list(self.decisions)
        d["worker_private_bytes"], d["worker_growth_bytes"] = self.worker_private_bytes, self.worker_growth_bytes
        return d


MemoryReader = Callable[[int], "int | None"]  # pid -> USS bytes (None: gone or not readable)


def settle_baselines() -> None:
    """Wait for the workers' memory baselines still being read: a process about to fork calls it, so that
    no worker starts beside a thread of this module. Each read is waited on by every caller, and removed by
    whichever finds it done first: two threads starting loaders at once both wait for it."""
    for reading in list(_reading):
        reading.wait()
        with suppress(ValueError):
            _reading.remove(reading)


def read_uss(pid: int) -> int | None:
    """A process's unique set size, the memory that is its own; None when it is gone, hidden, or unreadable
    (no file descriptor left to open its /proc files with)."""
    try:
        return int(psutil.Process(pid).memory_full_info().uss)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, AttributeError, OSError):
        return None


class Recorder(Listener):
    """A loader's figures: running totals of what its stages announce, stalls seen, the workers'
    memory, and the last mark. ``reader`` reads a worker's memory, ``clock`` the time; ``warn_bytes``
    is the average growth a worker that warns of copy-on-read."""

    def __init__(self, reader: MemoryReader = read_uss, clock: Callable[[], float] = time.perf_counter,
                 warn_bytes: int = MEMORY_WARN_BYTES, forked: bool = True) -> None:
        self.reader, self.clock, self.warn_bytes = reader, clock, warn_bytes
        self.forked = forked  # copy-on-read is forked workers' alone; a spawned one may still be starting at the
        # first batch (more workers than CPUs), so its growth since then would be its own start-up
        self.totals: dict[str, float] = dict.fromkeys((*_COUNTS, *StageTimes.names()), 0.0)
        self.stalls: list[Stall] = []
        self.bad: list[SkippedSample] = []
        self._kept = threading.Lock()  # the lists and the mark: stats() may be polled from a monitoring thread
        self.first: dict[int, int] = {}  # pid -> USS at its first batch
        self.warned = False
        self.settled = False  # an epoch ended with its workers measured: fresh workers are not read again
        self._mark = (clock(), dict(self.totals), 0, 0.0)  # (time, totals, decisions seen, worker-seconds)

    # -- events

    def waited(self, epoch: int, seconds: float, delivered: bool) -> None:
        self.totals["waited_s"] += seconds
        if delivered:
            self.totals["delivered"] += 1

    def blocked(self, seconds: float) -> None:
        self.totals["blocked_s"] += seconds

    def made(self, times: StageTimes) -> None:
        t = self.totals
        t["made"] += 1
        for name, seconds in zip(times.__slots__, times.values()):
            t[name] += seconds

    def copied(self, seconds: float) -> None:
        self.totals["copy_s"] += seconds

    def stalled(self, stall: Stall) -> None:
        """A ``next()`` has waited past the threshold: say so now, and keep it for ``stats()``."""
        with self._kept:
            if len(self.stalls) < KEEP_STALLS:
                self.stalls.append(stall)
        what = "any batch" if stall.batch_index is None else f"batch {stall.batch_index}"
        _log.warning("loader: waited %.1f s so far for %s of epoch %d, which %s", stall.waited_s, what, stall.epoch,
                     stall.where)

    def skipped(self, sample: SkippedSample) -> None:
        """A sample was left out of its batch: say so now, once, and count it for ``stats()``."""
        with self._kept:
            self.totals["skipped"] += 1
            if len(self.bad) < KEEP_SKIPPED:
                self.bad.append(sample)
        _log.warning("loader: skipped a bad sample in batch %d of epoch %d: %s: %s", sample.batch_index, sample.epoch,
                     sample.source, sample.reason)

    def first_batch(self, pids: Sequence[int]) -> None:
        """An iteration delivered its first batch: read the baseline of workers not seen before, until an epoch
        has ended with workers measured. Fresh workers each epoch (not persistent) grow as the first epoch's
        did, and a worker forked from a large process (JAX and torch loaded) takes milliseconds to read: the
        reads run on a thread (system calls: the caller keeps the interpreter), joined before anything looks
        at them or the process forks again."""
        todo = [] if self.settled else [pid for pid in pids if pid not in self.first]
        if not todo:
            return
        settle_baselines()
        live = set(pids)  # workers of past epochs are gone (forkserver, spawn): their baselines go too, or a
        self.first = {pid: uss for pid, uss in self.first.items() if pid in live or _alive(pid)}  # reused pid's
        _reading.append(Background(self._baseline, todo))

    def _baseline(self, pids: Sequence[int]) -> None:
        for pid, uss in self._read(pids):
            self.first.setdefault(pid, uss)

    def ended(self, pids: Sequence[int]) -> None:
        """Workers are still up at an epoch's end: warn once if their memory grew as copy-on-read does."""
        settle_baselines()
        known = [pid for pid in pids if pid in self.first]
        if self.warned or not known or not self.forked:
            return
        grown = [uss - self.first[pid] for pid, uss in self._read(known)]
        self.settled = True
        if grown and sum(grown) / len(grown) > self.warn_bytes:
            self.warned = True
            warnings.warn(
                f"the loader's {len(grown)} worker process(es) grew by {sum(grown) / len(grown) / 2**20:.0f} MiB of "
                "private memory each since their first batch: reading Python objects (a list of dicts, of strings) "
                "writes their reference counts, so each forked worker copies the dataset's pages. Pack the records "
                "into NumPy columns that workers share without copying: cupy_nwt.pack_records(records)",
                MemoryGrowthWarning, stacklevel=5)

    def _read(self, pids: Iterable[int]) -> list[tuple[int, int]]:
        return [(pid, uss) for pid in pids if (uss := self.reader(pid)) is not None]

    # -- the figures

    def stats(self, *, decisions: Sequence[Any], workers: int, depth: int, copy: str, worker_type: str,
              pids: Sequence[int] | None, epoch: int | None = None,
              epoch_batches: int | None = None, num_workers_why: str | None = None,
              worker_seconds: float | None = None) -> LoaderStats:
        """The figures since the last call; ``pids`` the worker processes to read (None: threads, no memory);
        ``worker_seconds`` the active workers' running total of seconds, where online tuning changes their count
        (None: ``workers`` throughout)."""
        with self._kept:
            now, totals = self.clock(), dict(self.totals)
            then, before, seen, worked_before = self._mark
            self._mark = (now, totals, len(decisions), worker_seconds or 0.0)
            stalls, self.stalls = tuple(self.stalls), []
            bad, self.bad = tuple(self.bad), []
        d = {k: totals[k] - before[k] for k in totals}
        wall = now - then
        span = wall * max(1, workers) if worker_seconds is None else worker_seconds - worked_before
        stages = StageTimes(**{name: d[name] for name in StageTimes.names()})
        memory = None
        if pids is not None:
            settle_baselines()
            memory = tuple(WorkerMemory(pid, uss, uss - self.first.get(pid, uss)) for pid, uss in self._read(pids))
        return LoaderStats(
            interval_s=wall, batches=int(d["delivered"]), waited_s=d["waited_s"], blocked_s=d["blocked_s"],
            made=int(d["made"]), busy_fraction=stages.total() / span if wall > 0 and span > 0 else None,
            stages=stages, copy_s=d["copy_s"], copy=copy, num_workers=workers, prefetch_depth=depth,
            worker_type=worker_type, decisions=tuple(x.to_dict() for x in decisions[seen:]), stalls=stalls,
            memory=memory, epoch=epoch, epoch_batches=epoch_batches, num_workers_why=num_workers_why,
            skipped_samples=int(d["skipped"]), bad_samples=bad)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: it exists
    return True


def copy_kind(device: str, pin_memory: bool | str, num_workers: int, zero_copy: bool) -> str:
    """What ``copy_s`` measured for a loader of these settings."""
    if device == "cuda":
        return "h2d issue (host side; async when pinned)" if pin_memory else "h2d (pageable, synchronous)"
    if num_workers == 0:
        return "none (num_workers=0 on the CPU: batches are made in the caller's own arrays)"
    return "none (zero_copy)" if zero_copy else "host copy out of the ring"


def check_stall(value: object) -> float | None:
    """``stall_warning_s`` as given (a positive number of seconds, or None), or a one-line ValueError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ArgumentError(f"stall_warning_s must be a positive number of seconds or None, got {value!r}")
    return float(value)
