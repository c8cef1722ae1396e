"""``tune_num_workers``: check the search's arguments, run one strategy, return its :class:`TuneResult`.

Two strategies over the same measurements: ``"paper"`` (``paper.py``, Algorithm 1 of the NWT paper:
every count 0..N-1 in order, greedy) and ``"fast"`` (``fast.py``: near the exhaustive best for a
fraction of its cost). Without a ``measure`` a trial runs the real loader (``measure.py``).
"""

from __future__ import annotations

import datetime as _dt
import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from .. import cuda, system
from .._checks import check_bool, check_int, check_number
from ..errors import ArgumentError, ArgumentTypeError
from ..loader._options import check_pin_value, check_worker_room
from ..loader.workers.kinds import check_worker_type
from ..picks.fingerprint import Fingerprint, device_kind, machine_fingerprint, work_fingerprint
from ..picks.pick import check_step
from ..picks.store import TuneResult, TypeBest
from ..picks.trials import Trial, combine_runs
from ..picks.verdict import UnreliablePickWarning
from ..ranks import rank_layout, worker_budget
from ..reporting.progress import ProgressBar
from ..reporting.units import fmt_bytes
from . import measure as _measure
from .fast import DEFAULT_TOLERANCE, FAST_BUDGET, MIN_FAST_ITERATIONS, _FastSearch, open_cap
from .footprint import search_memory_limit
from .paper import _algorithm1
from .trials import MeasureFn, _Runner

STRATEGIES = ("paper", "fast")
MAIN_PROCESS = ("auto", "waits", "busy")


def resolve_main_process(main_process: str, device: str) -> str:
    """What the main process does during training: "waits" on the GPU's step, or is "busy" with a CPU one.

    "auto" follows the device batches go to (``device_kind``'s answer): a GPU step leaves the
    main process mostly waiting for the device, a CPU step keeps it computing on one of the CPUs the
    workers share.
    """
    if main_process not in MAIN_PROCESS:
        raise ArgumentError(f"main_process must be one of {', '.join(MAIN_PROCESS)}, got {main_process!r}")
    if main_process == "auto":
        return "waits" if device == "cuda" else "busy"
    return main_process


@dataclass(frozen=True)
class TuneArguments:
    """``tune_num_workers``'s arguments, checked: the search's range (``n`` counts, ``open_search``), the device
    resolved, the main process's load. ``cpus`` is this rank's share of the node (``ranks.worker_budget``: the
    usable CPUs for a single process) and ``local_world_size`` the ranks sharing it, both from the launcher."""

    worker_types: tuple[str, ...]
    batch_size: int
    iterations: int
    prefetch_factor: int
    cpus: int
    n: int
    open_search: bool
    alpha: float
    tolerance: float
    step: Any
    device: str
    main_process: str
    local_world_size: int = 1


def check_tune_arguments(*, batch_size: int = 128, max_workers: int | None = None, iterations: int = 100,
                         alpha: float = 0.5, strategy: str = "paper", device: str = "auto", prefetch_factor: int = 2,
                         tolerance: float = DEFAULT_TOLERANCE, worker_types: str | Sequence[str] = ("process",),
                         main_process: str = "auto", step: Any = None, real_loader: bool = True) -> TuneArguments:
    """Every check ``tune_num_workers`` makes of its arguments, before any work: a caller with a long
    preparation (the ``tune`` command builds a dataset first) calls it first, so a bad argument costs nothing.

    One-line ``ArgumentError`` for a bad one; with ``real_loader`` (trials run the loader, no ``measure``)
    also ``NoGPUError`` for ``device="cuda"`` without a usable GPU, and ``ArgumentError`` for a
    ``max_workers`` whose counts this machine cannot hold, as ``DataLoader(num_workers=...)`` refuses them.
    """
    if isinstance(worker_types, str):
        worker_types = (worker_types,)
    if not isinstance(worker_types, Sequence):
        raise ArgumentTypeError(f"worker_types must be 'process', 'thread' or a sequence of them, got {worker_types!r}")
    types = tuple(check_worker_type(t) for t in worker_types)
    if not types or len(set(types)) != len(types):
        raise ArgumentError(f"worker_types must name 'process' and/or 'thread' once each, got {worker_types!r}")
    if strategy not in STRATEGIES:
        raise ArgumentError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    batch_size = check_int("batch_size", batch_size, ge=1)
    iterations = check_int("iterations", iterations, ge=1)
    prefetch_factor = check_int("prefetch_factor", prefetch_factor, ge=1)
    layout = rank_layout()  # under a launcher the rank searches its share, as num_workers="auto" runs within it
    cpus = worker_budget(layout, system.usable_cpus())
    n = cpus if max_workers is None else check_int("max_workers", max_workers, ge=1)
    open_search = max_workers is None and strategy == "fast"
    if open_search:
        n = cpus + 1  # counts 0..cpus at least: one worker per CPU is often the best
    alpha = check_number("alpha", alpha, ge=0, unit="seconds per 100 iterations")
    tolerance = check_number("tolerance", tolerance, ge=0, lt=0.5)
    if strategy == "fast" and iterations < MIN_FAST_ITERATIONS:
        raise ArgumentError(f"the fast strategy needs iterations >= {MIN_FAST_ITERATIONS}, got {iterations}")
    step = check_step(step)
    resolved = device_kind(device)
    load = resolve_main_process(main_process, resolved)
    if real_loader:
        if resolved == "cuda":
            cuda.require_gpu()
        if max_workers is not None:
            for t in types:
                check_worker_room(n - 1, worker_type=t, device=resolved, prefetch_factor=prefetch_factor,
                                  option="max_workers", value=n)
    return TuneArguments(types, batch_size, iterations, prefetch_factor, cpus, n, open_search, float(alpha),
                         float(tolerance), step, resolved, load, layout.local_world_size)


def tune_num_workers(dataset: Any = None, batch_size: int = 128, max_workers: int | None = None,
                     iterations: int = 100, alpha: float = 0.5, strategy: str = "paper", device: str = "auto",
                     pin_memory: bool | str = False, prefetch_factor: int = 2, measure: MeasureFn | None = None,
                     progress: bool = True, *, tolerance: float = DEFAULT_TOLERANCE,
                     batch_transform: Any = None, worker_types: str | Sequence[str] = ("process",),
                     main_process: str = "auto", memory_limit: int | None = None,
                     step: Callable[[Any], Any] | float | None = None, warn: bool = True) -> TuneResult:
    """Search worker counts for the loader of ``dataset`` (``paper.py``, ``fast.py``).

    ``max_workers`` bounds the counts to 0 .. max_workers-1 (the paper's N). Without it the paper
    strategy searches 0 .. usable CPUs - 1, as Algorithm 1 does; the fast one is open (``fast.py``):
    at least up to the usable CPUs, further while throughput still rises, up to ``fast.open_cap``
    and while the extrapolated peak memory stays within ``memory_limit`` bytes (default: this process's
    memory plus half of what is free now, ``footprint.search_memory_limit``). Under a launcher (torchrun,
    SLURM, MPI: ``ranks.rank_layout``) "usable CPUs" is this rank's share of the node, and the saved pick is
    keyed by the ranks per node, as ``num_workers="auto"`` looks it up in that rank.

    ``main_process`` is the main process's load during training, represented in every trial of
    the real loader: "waits" (a GPU step: the main process waits for the device) or "busy" (a CPU
    step: one CPU is kept busy beside the loader); "auto" picks by the device.

    ``alpha`` is the paper's threshold in seconds per 100 iterations (strategy "paper");
    ``tolerance`` is the fast strategy's relative one. ``measure(workers, iterations, warmup)``
    replaces the real loader trial. ``pin_memory`` defaults to the DataLoader's own default
    (False): it is part of the saved result's key, so tune with the loader's settings for
    ``num_workers="auto"`` to find the pick.

    ``worker_types`` ("process", "thread" or both) are searched one after the other, the same
    strategy over each; the pick is the type whose best count is fastest, and the result records it
    (``worker_type``) with the others' bests. With several types a custom ``measure`` is called
    with a ``worker_type`` keyword too.

    ``step`` is the user's training step, which the pick should keep fed: a callable taking a
    batch, or its time in seconds (slept as a GPU step, spun as a CPU one: ``main_process``). Each
    trial then runs it on every batch in this process, as training will, and times the consumer's
    whole loop (its wait in ``next()`` plus the step); the search minimises that loop, so with a
    fixed step the pick is the count that leaves the consumer waiting least
    (``Trial.wait_fraction``), and among counts within the tolerance and the noise of it, the
    fewest workers (``fast.py``). Workers that crowd out the main process lengthen its loop, so a
    count that leaves it a core wins where that lowers the wait. The step is part of the saved
    pick's key. Use the fast strategy with a step: Algorithm 1's ``alpha`` (seconds per 100
    iterations) would swallow every difference of a short step's loop.

    ``result.why`` says in one line what was picked and why; when the pick may not hold on another
    run (noisy trials, a count beside it left unmeasured, other processes busy on the CPUs),
    ``result.warning`` says so and what to do, and (``warn``) an
    :class:`~cupy_nwt.picks.verdict.UnreliablePickWarning` is issued.

    Args:
        dataset: what the loader reads (default: the synthetic CIFAR-10).
        batch_size: the loader's batch size, as in training: it sets each batch's work.
        max_workers: counts searched are 0 .. max_workers-1 (the paper's N); None: see above.
        iterations: batches timed per trial (the paper's 100).
        alpha: the paper strategy's threshold, seconds per 100 iterations.
        strategy: "paper" (Algorithm 1) or "fast" (near the best at a fraction of the cost).
        device: where batches go, "cuda", "cpu" or "auto", as in training.
        pin_memory: the loader's ``pin_memory``: part of the saved pick's key.
        prefetch_factor: the loader's ``prefetch_factor``.
        measure: replaces the real loader trial (tests, custom pipelines).
        progress: show the search on stderr.
        tolerance: the fast strategy's relative threshold.
        batch_transform: the loader's ``batch_transform``: its cost is part of each batch.
        worker_types: "process", "thread" or both (a sequence), searched one after the other.
        main_process: the main process's load in training: "waits", "busy" or "auto".
        memory_limit: bytes the open fast search's extrapolated peak memory (main process and workers) may
            reach; at least this process's own memory, and only with ``strategy="fast"`` and no ``max_workers``.
        step: the training step the pick should keep fed: a callable taking a batch, or its time in seconds.
        warn: issue an ``UnreliablePickWarning`` when the pick may not hold on another run (``result.warning``).
    """
    c = check_tune_arguments(batch_size=batch_size, max_workers=max_workers, iterations=iterations, alpha=alpha,
                             strategy=strategy, device=device, prefetch_factor=prefetch_factor, tolerance=tolerance,
                             worker_types=worker_types, main_process=main_process, step=step,
                             real_loader=measure is None)
    progress, warn = check_bool("progress", progress), check_bool("warn", warn)
    pin_memory = check_pin_value(pin_memory)
    if measure is not None and not callable(measure):
        raise ArgumentTypeError(f"measure must be a callable measure(workers, iterations, warmup) or None, "
                                f"got {type(measure).__name__}")
    memory_limit = _check_memory_limit(memory_limit, c.open_search, own=measure is None)
    if c.open_search and memory_limit is None and measure is None:
        memory_limit = search_memory_limit()
    fp = None
    if dataset is not None:
        fp = Fingerprint(machine_fingerprint(), work_fingerprint(
            dataset, batch_size=c.batch_size, batch_transform=batch_transform, prefetch_factor=c.prefetch_factor,
            pin_memory=pin_memory, device=c.device, local_world_size=c.local_world_size, step=c.step))
    if measure is None and dataset is None:
        raise ArgumentError("give a dataset to tune the loader on, or a measure callable")
    searched: list[Searched] = []
    for kind in c.worker_types:
        if measure is None:
            m: MeasureFn = _measure.LoaderMeasure(dataset, batch_size=c.batch_size, prefetch_factor=c.prefetch_factor,
                                                pin_memory=pin_memory, device=device,
                                                batch_transform=batch_transform, worker_type=kind,
                                                main_process=c.main_process, step=c.step)
        else:
            m = measure if len(c.worker_types) == 1 else functools.partial(measure, worker_type=kind)  # type: ignore[call-arg]
        label = f"NWT ({strategy})" if len(c.worker_types) == 1 else f"NWT ({strategy}, {kind} workers)"
        with ProgressBar(c.n if strategy == "paper" else None, label, unit="trial", enabled=progress) as bar:
            runner = _Runner(m, c.batch_size, bar, cpus=c.cpus)
            if strategy == "paper":
                best = _algorithm1(runner, c.n, c.iterations, c.alpha)
                top, why = c.n, f"counts 0..{c.n - 1} (Algorithm 1)"
            else:
                search = _FastSearch(runner, c.n, c.iterations, c.tolerance, FAST_BUDGET,
                                     cap=open_cap(c.cpus) if c.open_search else None, memory_limit=memory_limit)
                best = search.search()
                top, why = search.n, search.stop_reason
        searched.append(Searched("cpu", kind, best, tuple(runner.runs), top, why))
    win = choose(searched)
    bests = [s.best() for s in searched]
    chosen = searched[win]
    result = TuneResult(
        best_workers=chosen.best_workers, strategy=strategy, runs=chosen.runs, max_workers=chosen.max_workers,
        iterations=c.iterations, alpha=c.alpha, tolerance=c.tolerance, batch_size=c.batch_size,
        prefetch_factor=c.prefetch_factor, pin_memory=pin_memory,
        device=c.device, fingerprint=fp, created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        worker_type=chosen.worker_type, other_types=tuple(b for i, b in enumerate(bests) if i != win),
        main_process=("step" if callable(c.step) else c.main_process) if measure is None else "", usable_cpus=c.cpus,
        search_end=chosen.search_end, placement=chosen.placement,
    )
    if warn and result.warning:
        warnings.warn(result.warning, UnreliablePickWarning, stacklevel=2)
    return result


def _check_memory_limit(memory_limit: object, open_search: bool, *, own: bool) -> int | None:
    """``memory_limit`` in bytes, refused where it could not mean anything: a bound only the open fast search
    grows against, and (``own``: the real loader's trials) one below this process's own memory, which every
    trial's peak includes, so no count could ever fit."""
    limit = check_int("memory_limit", memory_limit, ge=1, optional=True)
    if limit is None:
        return None
    if not open_search:
        raise ArgumentError("memory_limit bounds only the open search (strategy='fast' without max_workers), "
                            "so it would be ignored here")
    rss = psutil.Process().memory_info().rss if own else 0
    if limit < rss:
        raise ArgumentError(f"memory_limit must be at least this process's own memory ({fmt_bytes(rss)} now), "
                            f"which every trial's peak includes, got {limit} ({fmt_bytes(limit)})")
    return limit


@dataclass(frozen=True)
class Searched:
    """One candidate pipeline's search: where it decodes, its worker type, its pick and every run."""

    placement: str
    worker_type: str
    best_workers: int
    runs: tuple[Trial, ...]
    max_workers: int
    search_end: str

    @property
    def best_trial(self) -> Trial | None:
        """The pick's runs combined; None when the search picked it unmeasured (one count to search)."""
        return combine_runs(self.runs).get(self.best_workers)

    def best(self) -> TypeBest:
        t = self.best_trial
        return TypeBest(self.worker_type, self.best_workers, t.samples_per_second if t is not None else 0.0,
                        sum(r.wall_seconds for r in self.runs), self.placement)


def choose(candidates: Sequence[Searched]) -> int:
    """The index of the candidate pipeline whose pick keeps the consumer's loop shortest.

    Each candidate (a decode placement and a worker type, each searched for its own count) is
    judged at its pick by seconds per iteration: with the user's step in the loop that is the step
    plus the consumer's wait, so the least loop is the least wait; without, the highest throughput.
    A candidate picked unmeasured (one count to search) loses to any measured one; ties go to the
    earlier candidate (the CPU placement, process workers, come first). Picks of 0 workers of one placement
    are one pipeline whatever the worker type (the main process makes every batch): they count as the best
    of their measurements, so the type of such a pick is the earlier one, not the noise between them.
    """
    def measured(i: int) -> float:
        t = candidates[i].best_trial
        return t.seconds_per_iteration if t is not None else float("inf")

    def loop(i: int) -> float:
        c = candidates[i]
        if c.best_workers != 0:
            return measured(i)
        return min(measured(j) for j, o in enumerate(candidates) if o.best_workers == 0 and o.placement == c.placement)

    return min(range(len(candidates)), key=lambda i: (loop(i), i))
