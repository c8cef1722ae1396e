"""``DataLoader(num_workers="auto")``: the saved pick for this machine and work, else one tuning.

This is the part of the tuner the loader calls, so it imports only what sits below the loader
(the store, fingerprints, the rank layout). The tuning itself builds loaders, so the loader cannot
import it without a circle; it reaches it through a slot instead: ``cupy_nwt.nwt.auto`` registers
its tuner here when imported, and ``import cupy_nwt`` imports it. A saved pick needs no tuner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._checks import check_number
from ..errors import ArgumentError, MisuseError
from ..ranks import RankLayout, agree, rank_layout, worker_budget
from .fingerprint import Fingerprint, device_kind, machine_fingerprint, work_fingerprint
from .store import TuneResult, lookup, pick_store
from .trials import MeasureFactory

# The name these lines have always had (the README documents it), kept when the tuner was split up.
LOGGER_NAME = "cupy_nwt.tuner"
_log = logging.getLogger(LOGGER_NAME)

# (fp, dataset, cache_dir, *, measure_factory, batch_size, device, pin_memory, prefetch_factor,
#  batch_transform, max_workers) -> the pick, saved under fp
Tuner = Callable[..., int]
_tuner: Tuner | None = None


MAX_STEP_S = 3600.0


def check_step(step: Any) -> Callable[[Any], Any] | float | None:
    """The user's training step as trials run it: a callable taking a batch, or seconds per step
    (a finite number > 0, at most ``MAX_STEP_S``); None for none."""
    if step is None or callable(step):
        return step
    if isinstance(step, (str, bytes)):
        raise ArgumentError(f"step must be a callable taking a batch or a step time in seconds, got {step!r}")
    return check_number("step", step, gt=0, le=MAX_STEP_S, unit="seconds")


@dataclass(frozen=True)
class AutoWorkers:
    """``num_workers=AutoWorkers(step=...)``: ``"auto"`` with what the tuning should keep fed.

    ``step`` is the training step the loader feeds: a callable taking a batch (run on the tuning's
    batches in this process, as training will run it) or its time in seconds. The pick is then the
    fewest workers that leave the step waiting least, rather than the fastest loader on its own
    (``tune_num_workers(step=...)``); the step is part of the saved pick's key. Checked here, when made.
    """

    step: Callable[[Any], Any] | float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "step", check_step(self.step))


def auto_request(num_workers: Any) -> AutoWorkers | None:
    """What a ``num_workers`` argument asks of the tuner: ``"auto"`` and ``AutoWorkers`` ask for a
    pick (the settings it carries), anything else is a count (None)."""
    if isinstance(num_workers, AutoWorkers):
        return num_workers
    if isinstance(num_workers, str) and num_workers == "auto":
        return AutoWorkers()
    return None


def register_tuner(tuner: Tuner) -> None:
    """Set what ``num_workers="auto"`` runs when nothing is saved (``cupy_nwt.nwt.auto`` does, at import)."""
    global _tuner  # noqa: PLW0603 - one slot per process, filled once by the tuner's import
    _tuner = tuner


def registered_tuner() -> Tuner:
    if _tuner is None:
        raise MisuseError("num_workers='auto' found no saved pick and no tuner is registered: "
                           "import cupy_nwt (it registers cupy_nwt.nwt.auto) before building the loader")
    return _tuner


def auto_num_workers(dataset: Any, *, batch_size: int, prefetch_factor: int = 2, pin_memory: bool | str = False,
                     device: str = "auto", batch_transform: Any = None,
                     cache_dir: str | Path | None = None, layout: RankLayout | None = None,
                     measure_factory: MeasureFactory | None = None) -> int:
    """The worker count of :func:`auto_pick` (the worker type left to the loader)."""
    return auto_pick(dataset, batch_size=batch_size, prefetch_factor=prefetch_factor, pin_memory=pin_memory,
                     device=device, batch_transform=batch_transform, cache_dir=cache_dir, layout=layout,
                     measure_factory=measure_factory)[0]


def auto_pick(dataset: Any, *, batch_size: int, prefetch_factor: int = 2, pin_memory: bool | str = False,
              device: str = "auto", batch_transform: Any = None, cache_dir: str | Path | None = None,
              layout: RankLayout | None = None, measure_factory: MeasureFactory | None = None,
              worker_type: str | None = None, search_types: tuple[str, ...] = ("process",),
              step: Callable[[Any], Any] | float | None = None) -> tuple[int, str]:
    """A saved pick for this machine and work, else tune (fast) once and save.

    One rank on the node: the search is open (at least up to the usable CPUs, further while
    throughput rises; ``fast.py``). Several ranks (``layout``; by default the launcher's variables):
    a rank may use its share of the node's CPUs (``distributed.worker_budget``: counts 0 .. budget-1
    are searched) and the
    fingerprint records how many ranks share the node. Tuning happens only under a machine-wide
    lock beside the store, and whoever holds it looks in the store again before tuning, so when all
    ranks of a node start at once exactly one tunes while the others wait and then reuse its result
    (the lock also keeps unrelated tunings on one machine from measuring each other). The tuning
    rank measures while the others wait, so its trials see less contention than training will.
    Where the program has a communicator (``torch.distributed`` initialised, or mpi4py under an MPI
    launcher), every rank then takes rank 0's pick, so all nodes use one count. Every rank must call
    this at the same point, as the DataLoader constructor does.

    ``measure_factory`` builds the trials' measure, called like
    :class:`~cupy_nwt.nwt.measure.LoaderMeasure` (the default): for another loader, or a test.

    Returns the count and the worker type: ``worker_type`` if given, else the saved pick's (a pick
    saved before worker types were searched is "process"). A search here measures ``worker_type``
    only when given, else each of ``search_types`` (by default processes only, to keep its cost;
    the online tuner asks for both) and keeps the faster type with its count.

    ``step`` (``AutoWorkers(step=...)``): the training step the search keeps fed, part of the key.
    """
    layout = rank_layout() if layout is None else layout
    fp = auto_fingerprint(dataset, batch_size=batch_size, prefetch_factor=prefetch_factor, pin_memory=pin_memory,
                          device=device, batch_transform=batch_transform, layout=layout, step=step)
    saved = lookup(fp, cache_dir)
    if saved is not None:
        _log_saved(saved, fp)
        pick, kind = saved.best_workers, worker_type or saved.worker_type
    else:
        kinds = (worker_type,) if worker_type else tuple(search_types)
        _log.info("num_workers='auto': no saved pick for this machine and work (%s): searching (fast strategy)",
                  pick_store(cache_dir).why_missing(fp))
        pick = registered_tuner()(fp, dataset, cache_dir, measure_factory=measure_factory, batch_size=batch_size,
                                  device=device, pin_memory=pin_memory, prefetch_factor=prefetch_factor,
                                  batch_transform=batch_transform,
                                  max_workers=worker_budget(layout) if layout.local_world_size > 1 else None,
                                  **({"worker_types": kinds} if kinds != ("process",) else {}),
                                  **({"step": step} if step is not None else {}))
        tuned = lookup(fp, cache_dir)  # the tuner saved its result: the type it found faster
        kind = tuned.worker_type if tuned is not None and tuned.worker_type in kinds else kinds[0]
    agreed, via = agree(pick, layout)
    if via is not None and agreed != pick:
        _log.info("num_workers='auto': this rank's saved pick is %d, rank 0's (via %s) is %d; using rank 0's",
                  pick, via, agreed)
    return int(agreed), kind


def auto_fingerprint(dataset: Any, *, batch_size: int, prefetch_factor: int = 2, pin_memory: bool | str = False,
                     device: str = "auto", batch_transform: Any = None, layout: RankLayout | None = None,
                     step: Any = None) -> Fingerprint:
    """The key ``num_workers="auto"`` saves and finds its pick under, for this machine and work."""
    layout = rank_layout() if layout is None else layout
    return Fingerprint(machine_fingerprint(), work_fingerprint(
        dataset, batch_size=batch_size, batch_transform=batch_transform, prefetch_factor=prefetch_factor,
        pin_memory=pin_memory, device=device_kind(device), local_world_size=layout.local_world_size, step=step))


def pick_reason(workers: int, fp: Fingerprint, cache_dir: str | Path | None = None) -> str | None:
    """Why ``num_workers="auto"`` runs ``workers``: the saved pick's one line (``TuneResult.why``), with
    its warning when its trials were noisy; None when nothing saved describes that count."""
    saved = lookup(fp, cache_dir)
    if saved is None or saved.best_workers != workers:
        return None
    return saved.why + ("; unreliable: its trials were too noisy to tell the counts apart" if saved.warning else "")


def _log_saved(saved: TuneResult, fp: Fingerprint) -> None:
    key = saved.fingerprint.key if saved.fingerprint is not None else "?"
    similar = ""
    if saved.fingerprint is not None and key != fp.key:
        similar = (f", similar work: {saved.fingerprint.work.sample_bytes} bytes per sample saved, "
                   f"{fp.work.sample_bytes} here")
    kind = f", {saved.worker_type} workers" if saved.worker_type != "process" else ""
    _log.info("num_workers='auto': using saved pick %d (key %s%s%s)", saved.best_workers, key, similar, kind)
