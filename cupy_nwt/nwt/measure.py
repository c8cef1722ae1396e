"""Measuring the real loader: a trial as ``measure(workers, iterations, warmup)``, and steady rates.

The only module of the tuner that imports :class:`~cupy_nwt.loader.DataLoader`; the searches and
the store work on any measure callable (see ``trials.py``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .. import cuda
from ..data.contract import map_length
from ..errors import ArgumentError
from ..loader import DataLoader
from ..loader._options import PIN_WITHOUT_GPU
from ..picks.fingerprint import device_kind
from ..picks.pick import check_step
from ..ranks import device_for_rank, rank_layout
from .contention import CpuWindow
from .footprint import DEFAULT_INTERVAL_S, MemorySampler
from .trials import MeasureFn, Measurement, whole_rounds


class LoaderMeasure:
    """A trial on the real loader, as ``measure(workers, iterations, warmup)``.

    Builds a :class:`~cupy_nwt.loader.DataLoader` with that many workers (shuffled, seeded,
    ``drop_last`` so every batch is full, persistent workers so a short dataset wraps into the
    next epoch without a restart), takes ``warmup + iterations`` batches and closes it. On the GPU
    each batch counts as arrived once the consumer's stream has its H2D copy (we synchronise it).
    Memory is sampled over the main process and the live workers from the first batch to the last
    (the sampling thread starts once the workers are forked: a worker forked beside a running thread
    may inherit a lock it held, and Python 3.12 warns of such a fork), and the CPUs other processes
    took meanwhile are read from the kernel's accounting (``contention.py``).
    ``worker_type`` ("process" or "thread") is the loader's.

    With ``warmup == 0`` (the paper) the clock starts before the loader is built, so start-up
    counts; otherwise it runs from the last warm-up batch to the last timed one, and the warm-up
    also takes the rest of the workers' first ``prefetch_factor`` rounds (``workers x
    (prefetch_factor - 1)`` more batches): they are made at start-up, together, so a short trial
    that timed them would credit a count with batches it made before the clock started, the more
    so the more workers it has.

    ``main_process`` is the main process's load during training: "waits" (a GPU step; nothing
    added) or "busy" (a CPU step: one CPU is the training step's for the whole trial). "busy"
    reserves it: a spinning process is pinned to one CPU and the trial's own process and its
    workers to the others (``_BusyCpu``). Unpinned, the scheduler would share out the spinner's CPU
    among the workers, the more of it the more workers there are, so a count's rate would rise with
    oversubscription that a real training step would pay for.

    The loader's warning that a count has more workers than CPUs is silenced in trials: a search
    past the CPU count means it, and the runner says so once (``trials._Runner``).

    ``step`` puts the user's training step in the loop, as training will run it: a callable given
    each batch, or a step time in seconds (slept when the main process "waits" for a GPU, spun on
    its CPU when "busy"; no other CPU is then reserved, the step is the main process's load). The
    trial then times the consumer's whole loop (``seconds_per_iteration``: its wait in ``next()``
    plus the step) and reports the share of it spent waiting (``wait_fraction``) and the step's
    mean time. On the GPU the consumer's stream is synchronised after the step as after the copy,
    so the step's time is the device's.

    ``decode`` is a stage the consumer runs on each batch before the step (a GPU decode of encoded
    bytes, ``placement.py``): its time counts in the loop, not in the step, so ``wait_fraction`` is
    the share of the loop spent outside the step. ``zero_copy`` is the loader's: a batch of views
    into the ring, which such a stage reads before the next batch is asked for.

    Before the first trial, one untimed batch is made in this process (``preflight``), through
    ``decode`` too: it compiles Numba transforms and kernels and pages in a memory-mapped dataset,
    one-off costs that would otherwise land on whichever trial runs first. It counts in neither
    strategy's cost.
    """

    def __init__(self, dataset: Any, *, batch_size: int = 128, prefetch_factor: int = 2,
                 pin_memory: bool | str = False, device: str = "auto", batch_transform: Any = None,
                 seed: int = 0, multiprocessing_context: str | None = None,
                 memory_interval: float = DEFAULT_INTERVAL_S, worker_type: str = "process",
                 main_process: str = "waits", step: Callable[[Any], Any] | float | None = None,
                 decode: Callable[[Any], Any] | None = None, zero_copy: bool = False) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.device = device_kind(device)
        self.loader_device = _trial_device(device, self.device)
        if pin_memory and self.loader_device == "cpu":  # said here once, not by each trial's loader
            warnings.warn(PIN_WITHOUT_GPU, UserWarning, stacklevel=3)
        self.batch_transform = batch_transform
        self.seed = seed
        self.multiprocessing_context = multiprocessing_context
        self.worker_type = worker_type
        self.memory_interval = memory_interval
        if main_process not in ("waits", "busy"):
            raise ArgumentError(f"main_process must be 'waits' or 'busy', got {main_process!r}")
        self.main_process = main_process
        self.step = check_step(step)
        if decode is not None and not callable(decode):
            raise ArgumentError(f"decode must be a callable taking a batch, got {type(decode).__name__}")
        self.decode = decode
        self.zero_copy = bool(zero_copy)
        self._ready = False
        self._others = CpuWindow()
        n = map_length(dataset, "tuning")
        if n < batch_size:
            raise ArgumentError(f"the dataset has {n} samples, fewer than one batch of {batch_size}")

    def _loader(self, workers: int) -> DataLoader:
        # rank 0 of 1 explicitly: under a launcher a trial measures one loader, not a shard of the data
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
            warnings.filterwarnings("ignore", message=re.escape(PIN_WITHOUT_GPU), category=UserWarning)
            return DataLoader(
                self.dataset, batch_size=self.batch_size, shuffle=True, seed=self.seed, drop_last=True,
                num_workers=workers, prefetch_factor=self.prefetch_factor, pin_memory=self.pin_memory,
                device=self.loader_device, batch_transform=self.batch_transform, persistent_workers=True,
                zero_copy=self.zero_copy, multiprocessing_context=self.multiprocessing_context if workers else None,
                rank=0, world_size=1, worker_type=self.worker_type,
            )

    def preflight(self) -> None:
        with self._loader(0) as loader:
            batch = next(iter(loader))
            if self.decode is not None:
                self.decode(batch)
        self._ready = True

    def __call__(self, workers: int, iterations: int, warmup: int) -> Measurement:
        if not self._ready:
            self.preflight()
        stamps: list[float] = []
        busy = _BusyCpu() if self.main_process == "busy" and self.step is None else None
        try:
            return self._trial(workers, iterations, warmup, stamps, busy)
        finally:
            if busy is not None:
                busy.release()

    def _trial(self, workers: int, iterations: int, warmup: int, stamps: list[float],
               busy: _BusyCpu | None = None) -> Measurement:
        own = [os.getpid()] + ([busy.spinner.pid] if busy is not None else [])
        self._others.begin(own)
        t_begin = time.perf_counter()
        loader = self._loader(workers)
        sync = None
        if loader.device_id is not None:
            sync = cuda.stream_synchronizer(loader.device_id)
        if warmup > 0:
            warmup += workers * (self.prefetch_factor - 1)
        step = self._step_fn()
        stepped: list[float] = []
        sampler = MemorySampler(loader.worker_pids, interval=self.memory_interval)
        try:
            for batch in _endless(loader, warmup + iterations):
                if not stamps:  # the workers are up: the sampler's thread starts after their fork, not beside it
                    sampler.start()
                if sync is not None:
                    sync()
                if busy is not None and not stamps:
                    busy.confine(loader.worker_pids())  # forkserver's workers do not inherit ours
                if self.decode is not None:
                    batch = self.decode(batch)
                if step is not None:
                    t_step = time.perf_counter()
                    step(batch)
                    if sync is not None:
                        sync()
                    stepped.append(time.perf_counter() - t_step)
                stamps.append(time.perf_counter())
            sampler.stop()
            others = self._others.end(own + loader.worker_pids())
        finally:
            sampler.stop()
            loader.close()
        wall = time.perf_counter() - t_begin
        start = t_begin if warmup == 0 else stamps[warmup - 1]
        loop = stamps[-1] - start
        spi = loop / iterations
        peak = sampler.peak
        wait = step_s = None
        if step is not None:
            step_s = sum(stepped[warmup:]) / iterations
            wait = min(1.0, max(0.0, 1.0 - step_s * iterations / loop))
        return Measurement(spi, wall, peak.bytes if peak.samples else None, peak.uss_bytes,
                           _batch_means_error(stamps[max(warmup, 1) - 1:], round_size=max(1, workers)),
                           warmup_batches=warmup, wait_fraction=wait, step_seconds=step_s, other_cpus=others)

    def _step_fn(self) -> Callable[[Any], Any] | None:
        """The step the consumer runs on each batch: the user's, or its time slept or spun."""
        if self.step is None or callable(self.step):
            return self.step
        seconds = float(self.step)
        if self.main_process == "busy":
            return functools.partial(_spin, seconds)
        return lambda _batch: time.sleep(seconds)


def _spin(seconds: float, _batch: Any) -> None:
    """A CPU step: keep this process's CPU busy for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass




# Spins until killed, or until its parent is gone (a killed tuner leaves no busy CPU behind).
_SPIN = "import os\np = os.getppid()\nwhile os.getppid() == p:\n    for _ in range(200000):\n        pass\n"


class _BusyCpu:
    """One CPU kept busy for a trial (the main process's CPU training step), the loader on the others.

    The spinner is pinned to the first usable CPU and this thread (whose new threads and forked
    workers inherit it) to the rest; ``confine`` pins workers that did not inherit it. With one
    usable CPU, or where affinity cannot be set, nothing is pinned and the spinner only competes.
    It runs in a session of its own, so a Ctrl-C at the terminal interrupts the tuner, which ends
    it, and not the spinner, which would die printing a traceback of its own.
    """

    def __init__(self) -> None:
        self.spinner = subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, start_new_session=True)
        self.saved: set[int] | None = None
        self.rest: set[int] = set()
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if len(cpus) < 2:
            return
        try:
            os.sched_setaffinity(self.spinner.pid, {cpus[0]})
            self.saved, self.rest = set(cpus), set(cpus[1:])
            os.sched_setaffinity(0, self.rest)
        except OSError:
            self.saved = None

    def confine(self, pids: Sequence[int]) -> None:
        for pid in pids if self.saved is not None else ():
            with contextlib.suppress(OSError):  # a worker that already exited
                os.sched_setaffinity(pid, self.rest)

    def release(self) -> None:
        try:
            self.spinner.kill()
            self.spinner.wait()
        finally:
            if self.saved is not None:
                os.sched_setaffinity(0, self.saved)


def _trial_device(device: str, resolved: str) -> str:
    """The device trial loaders use: "cuda:N" as given, else this rank's GPU (trials run as rank 0 of 1)."""
    if resolved != "cuda" or device.startswith("cuda:"):
        return device if resolved == "cuda" else resolved
    cuda.require_gpu()
    return f"cuda:{device_for_rank(rank_layout(), cuda.device_count())}"


def steady_rates(measure: MeasureFn, counts: Sequence[int], *, batch_size: int, iterations: int = 50,
                 repeats: int = 3) -> dict[int, float]:
    """Median samples/s of each worker count, start-up excluded, the counts interleaved per round.

    For judging picks after a search on equal footing: interleaving makes drift on a shared machine
    (another job, thermal throttling) hit every count alike instead of whichever ran last. Each
    count times ``iterations`` rounded up to whole rounds of its workers (``trials.whole_rounds``).
    """
    rounds = interleaved_rates(measure, counts, batch_size=batch_size, iterations=iterations, repeats=repeats)
    return {w: statistics.median(r) for w, r in rounds.items()}


def interleaved_rates(measure: MeasureFn, counts: Sequence[int], *, batch_size: int, iterations: int = 50,
                      repeats: int = 3) -> dict[int, list[float]]:
    """Samples/s of each count in each of ``repeats`` rounds (round r is index r of every list)."""
    if repeats < 1 or iterations < 1:
        raise ArgumentError(f"repeats and iterations must be >= 1, got {repeats}, {iterations}")
    rates: dict[int, list[float]] = {int(w): [] for w in counts}
    for _ in range(repeats):
        for w in rates:
            m = measure(w, whole_rounds(iterations, w), w + 1)
            spi = m.seconds_per_iteration if isinstance(m, Measurement) else float(m)
            rates[w].append(batch_size / spi)
    return rates


def _endless(loader: Any, count: int) -> Iterator[Any]:
    """``count`` batches, starting new epochs as needed."""
    while count > 0:
        for batch in loader:
            yield batch
            count -= 1
            if count == 0:
                return


def _batch_means_error(stamps: Sequence[float], groups: int = 4, round_size: int = 1) -> float | None:
    """Relative standard error of the mean interval, from the means of consecutive groups.

    Batches arrive in bursts (one per worker round), so single intervals are far from independent;
    the means of a few consecutive groups of whole rounds (``round_size`` batches each) are close
    to it, which is what makes this estimate honest for a pipelined loader. A group that cut a
    round would see a burst or a wait depending on where it falls, and report that as noise.
    """
    intervals = [b - a for a, b in zip(stamps, stamps[1:])]
    rounds = len(intervals) // round_size
    groups = min(groups, rounds)
    size = rounds // groups * round_size if groups else 0
    if groups < 2 or size < 2:
        return None
    means = [sum(intervals[i * size:(i + 1) * size]) / size for i in range(groups)]
    mean = sum(means) / groups
    if mean <= 0:
        return None
    var = sum((m - mean) ** 2 for m in means) / (groups - 1)
    return math.sqrt(var / groups) / mean
