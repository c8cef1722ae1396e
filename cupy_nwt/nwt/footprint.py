"""Peak memory of a set of processes (a loader: its main process plus its workers), sampled in the background.

Why not tracemalloc, as the NWT paper did: it sees only Python allocations of the process that runs
it, so the memory the paper reports for worker processes is invisible to it. We read the kernel's
view instead, through psutil ``memory_full_info()`` (``/proc/PID/smaps_rollup`` on Linux):

* USS (unique set size): pages only that process maps; what would be freed if it exited.
* PSS (proportional set size): each shared page (the shared-memory ring, copy-on-write dataset
  pages after fork, libraries) divided among the processes that map it. Summed over every process
  that maps a page, PSS counts it exactly once: the sum is the loader's real footprint, which is why
  PSS is the figure the tuner compares and USS is reported beside it.

The set of processes is asked for afresh at every sample (workers start and stop during a trial);
a process that vanishes between the listing and the read is skipped, never an error.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from ..errors import ArgumentError, MisuseError
from ..system import memory_room

DEFAULT_INTERVAL_S = 0.025
# Reading smaps_rollup walks the target's page tables (~0.5 ms per process): never let the sampler
# spend more than 1/DUTY_LIMIT of its time reading, or it would slow the loader it measures.
DUTY_LIMIT = 5


@dataclass(frozen=True)
class MemorySample:
    """One reading of the process set, summed over the processes that answered."""

    pss_bytes: int | None
    uss_bytes: int | None
    rss_bytes: int
    processes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryPeak:
    """Peaks over a sampling window; each peak is taken separately over the samples."""

    pss_bytes: int | None
    uss_bytes: int | None
    rss_bytes: int
    max_processes: int
    samples: int

    @property
    def bytes(self) -> int:
        """The footprint the tuner compares: PSS where the OS reports it, else USS, else RSS."""
        for v in (self.pss_bytes, self.uss_bytes):
            if v is not None:
                return v
        return self.rss_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bytes"] = self.bytes
        return d


_Pids = Callable[[], Iterable[int]]
SEARCH_MEMORY_SHARE = 0.5


def search_memory_limit() -> int:
    """The peak footprint (PSS of main process + workers) an open search may grow a loader to.

    This process's own memory plus half of what is free now (a container's limit included): the rest
    is left to the training the pick is for (a model, its optimiser, the framework's caches).
    """
    own = psutil.Process().memory_info().rss
    return int(own + SEARCH_MEMORY_SHARE * memory_room().bytes)


class _ProcessCache:
    """psutil.Process objects by PID, so a reused PID is not mistaken for the process it replaced."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def read(self, pids: Iterable[int]) -> MemorySample:
        pss = uss = rss = 0
        have_pss = have_uss = True
        n = 0
        for pid in dict.fromkeys(int(p) for p in pids):
            proc = self._procs.get(pid)
            try:
                if proc is None or not proc.is_running():
                    proc = self._procs[pid] = psutil.Process(pid)
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                self._procs.pop(pid, None)
                continue
            n += 1
            rss += int(info.rss)
            p, u = getattr(info, "pss", None), getattr(info, "uss", None)
            have_pss &= p is not None
            have_uss &= u is not None
            pss += int(p or 0)
            uss += int(u or 0)
        return MemorySample(pss if have_pss and n else None, uss if have_uss and n else None, rss, n)


def sample(pids: Iterable[int]) -> MemorySample:
    """Read the given processes once (processes that are gone are skipped)."""
    return _ProcessCache().read(pids)


class MemorySampler:
    """Samples a process set on a background thread until ``stop()``; use as a context manager.

    ``pids`` is called at every sample and returns the processes to add to this one (for a
    loader: ``loader.worker_pids``). The first sample is taken in ``start()`` and the last in
    ``stop()``, so even a window shorter than the interval is measured.
    """

    def __init__(self, pids: _Pids | None = None, interval: float = DEFAULT_INTERVAL_S,
                 include_self: bool = True) -> None:
        if not interval > 0:
            raise ArgumentError(f"sampling interval must be > 0 seconds, got {interval!r}")
        self._pids = pids
        self._include_self = include_self
        self.interval = float(interval)
        self._cache = _ProcessCache()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reset()

    def _reset(self) -> None:
        self._pss: int | None = None
        self._uss: int | None = None
        self._rss = 0
        self._procs = 0
        self._samples = 0
        self._pss_seen = self._uss_seen = True

    def _current_pids(self) -> list[int]:
        pids = [os.getpid()] if self._include_self else []
        if self._pids is not None:
            pids.extend(self._pids())
        return pids

    def sample_now(self) -> MemorySample:
        """Take one sample and fold it into the peaks."""
        s = self._cache.read(self._current_pids())
        with self._lock:
            if s.processes:
                self._samples += 1
                self._rss = max(self._rss, s.rss_bytes)
                self._procs = max(self._procs, s.processes)
                self._pss_seen &= s.pss_bytes is not None
                self._uss_seen &= s.uss_bytes is not None
                if s.pss_bytes is not None:
                    self._pss = max(self._pss or 0, s.pss_bytes)
                if s.uss_bytes is not None:
                    self._uss = max(self._uss or 0, s.uss_bytes)
        return s

    @property
    def peak(self) -> MemoryPeak:
        with self._lock:
            return MemoryPeak(
                pss_bytes=self._pss if self._pss_seen else None,
                uss_bytes=self._uss if self._uss_seen else None,
                rss_bytes=self._rss,
                max_processes=self._procs,
                samples=self._samples,
            )

    def _run(self) -> None:
        wait = self.interval
        while not self._stop.wait(wait):
            t0 = time.perf_counter()
            self.sample_now()
            wait = max(self.interval, DUTY_LIMIT * (time.perf_counter() - t0))

    def start(self) -> "MemorySampler":
        if self._thread is not None:
            raise MisuseError("this MemorySampler is already running")
        self._reset()
        self._stop.clear()
        self.sample_now()
        self._thread = threading.Thread(target=self._run, name="cupy_nwt-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> MemoryPeak:
        """Stop the thread, take a last sample, and return the peaks of the window."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample_now()
        return self.peak

    def __enter__(self) -> "MemorySampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
