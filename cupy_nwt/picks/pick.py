"""``DataLoader(num_workers="auto")``'s side of the store: the request, the saved pick, and the pick a
loader tuned online saves.

A hit is the saved pick for this machine and work (the fingerprint), each rank's from its own store. On a miss
the loader tunes online (``loader.tuning``) and, once its tuner has settled, saves what it settled
at through :class:`OnlinePick`, so the next ``"auto"`` loader reuses it. Nothing here searches: the
offline search (``cupy_nwt.nwt``) builds loaders, so it sits above the loader, and this module below.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import system
from .._checks import check_number
from ..errors import ArgumentError, CupyNwtError
from ..ranks import RankLayout, rank_layout
from ..reporting.units import plural
from .fingerprint import Fingerprint, device_kind, machine_fingerprint, work_fingerprint
from .store import SaveOutcome, TuneResult, lookup, pick_store
from .trials import Trial
from .verdict import unreliable_because

# The logger the README documents for every line about picks, whichever package says it (nwt or picks).
LOGGER_NAME = "cupy_nwt.tuner"
_log = logging.getLogger(LOGGER_NAME)

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
    """``num_workers=AutoWorkers(step=...)``: ``"auto"`` with the training step the pick should keep fed.

    ``step`` is a callable taking a batch, or its time in seconds. It is part of the saved pick's
    key, so a pick made for another step is not reused. A pick searched up front with
    ``tune_num_workers(step=...)`` is the fewest workers that leave that step waiting least; on a
    miss the loader tunes online, where the caller's own loop is the step it judges by. Checked here,
    when made.

    Args:
        step: the training step: a callable taking a batch, or seconds per step; None for none.
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


@dataclass(frozen=True)
class SavedPick:
    """A hit: the count and worker type to run, and why (``stats().num_workers_why``)."""

    workers: int
    worker_type: str
    why: str | None


def saved_pick(fp: Fingerprint, *, worker_type: str | None = None, cache_dir: str | Path | None = None) -> SavedPick | None:
    """The saved pick for this machine and work (or similar work); None on a miss.

    Each rank reads its own store (the ranks of one node share it): no collective, so a loader made on one
    rank alone (rank 0's validation set) does not wait for the others. The worker count does not change
    the order, so ranks running different counts still deliver alike. The worker type is ``worker_type``
    if given, else the saved pick's ("process" without one).
    """
    saved = lookup(fp, cache_dir)
    if saved is None:
        return None
    _log_saved(saved, fp)
    kind = worker_type or saved.worker_type
    return SavedPick(int(saved.best_workers), kind, pick_reason(int(saved.best_workers), fp, cache_dir))


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
    online = (f"; tuned online by an earlier loader ({saved.search_end.removeprefix('online: ')})"
              if saved.strategy == "online" else "")
    why_not = unreliable_because(saved)
    return saved.why + online + (f"; unreliable: {why_not}" if why_not else "")


def missing(fp: Fingerprint, start: int, cpus: int, cache_dir: str | Path | None = None, *, tunes: bool = True) -> str:
    """Say once (on ``cupy_nwt.tuner``) that nothing is saved and the loader tunes online from ``start`` of
    ``cpus`` workers (0: none to spare, the main process makes the batches; ``tunes=False``: ``autotune=False``
    said, so ``start`` workers as they are); returns the why."""
    head = f"no saved pick for this machine and work ({pick_store(cache_dir).why_missing(fp)})"
    if cpus < 1:
        why = f"{head}: this rank's share of the node is one CPU, so its main process makes the batches (0 workers)"
        _log.info("num_workers='auto': %s", why)
        return why
    if not tunes:
        why = (f"{head}: autotune=False, so {plural(start, 'worker')} (half the budget of {cpus}), neither tuned "
               "nor saved")
        _log.info("num_workers='auto': %s. To search up front: tune_num_workers(dataset, ...).save_pick() or "
                  "cupy-nwt tune", why)
        return why
    why = (f"{head}: tuning online from {plural(start, 'worker')} (budget {cpus}); the count it settles at is "
           "saved for the next run")
    _log.info("num_workers='auto': %s. To search up front instead: tune_num_workers(dataset, ...).save_pick() "
              "or cupy-nwt tune", why)
    return why


def _log_saved(saved: TuneResult, fp: Fingerprint) -> None:
    key = saved.fingerprint.key if saved.fingerprint is not None else "?"
    similar = ""
    if saved.fingerprint is not None and key != fp.key:
        similar = (f", similar work: {saved.fingerprint.work.sample_bytes} bytes per sample saved, "
                   f"{fp.work.sample_bytes} here")
    kind = f", {saved.worker_type} workers" if saved.worker_type != "process" else ""
    _log.info("num_workers='auto': using saved pick %d (key %s%s%s)", saved.best_workers, key, similar, kind)


ONLINE_TOLERANCE = 0.05  # a training loop's figures are noisier than a search's trials (nwt.fast's 2%)


@dataclass(frozen=True)
class OnlinePick:
    """Where a loader tuned online on a miss saves what it settled at: the key and the loader's settings.

    Data only (a loader's options carry it); :meth:`save` is called once, by the online tuner.
    """

    fingerprint: Fingerprint
    batch_size: int
    prefetch_factor: int
    pin_memory: bool | str
    worker_type: str

    def result(self, workers: int, *, steps: int, elapsed_s: float, wait_s: float, budget: int,
               search_end: str) -> TuneResult:
        """The pick as a ``TuneResult`` (strategy "online"): one run at ``workers``, the caller's loop as
        the tuner saw it over ``steps`` batches since its last change."""
        spi = max(elapsed_s, 1e-9) / steps
        wait = min(1.0, max(0.0, wait_s / max(elapsed_s, 1e-9)))
        seen = Trial(workers, steps, 0, spi, self.batch_size / spi, elapsed_s, None, None, None, "online",
                     wait, max(0.0, elapsed_s - wait_s) / steps)
        return TuneResult(
            best_workers=workers, strategy="online", runs=(seen,), max_workers=max(1, budget), iterations=steps,
            alpha=0.0, tolerance=ONLINE_TOLERANCE, batch_size=self.batch_size, prefetch_factor=self.prefetch_factor,
            pin_memory=self.pin_memory, device=self.fingerprint.work.device, fingerprint=self.fingerprint,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), worker_type=self.worker_type,
            main_process="step", usable_cpus=system.usable_cpus(), search_end=search_end)

    def save(self, workers: int, *, steps: int, elapsed_s: float, wait_s: float, budget: int,
             search_end: str) -> SaveOutcome | None:
        """Save the pick (ranks of a node saving at once are safe: the store's file lock, an atomic
        replace, and a saved pick kept unless this one is faster beyond the noise); says what it did
        on ``cupy_nwt.tuner``. A store that cannot be written is a warning, never the training's end."""
        if steps < 1:
            return None
        result = self.result(workers, steps=steps, elapsed_s=elapsed_s, wait_s=wait_s, budget=budget,
                             search_end=search_end)
        try:
            outcome = result.save_pick()
        except (OSError, CupyNwtError) as exc:
            _log.warning("num_workers='auto': the online tuner settled at %s but the pick could not be "
                         "saved (%s); the next loader will tune online again", plural(workers, "worker"), exc)
            return None
        _log.info("num_workers='auto': the online tuner settled at %s (%s); %s: %s", plural(workers, "worker"), search_end,
                  "saved as the pick for this machine and work" if outcome.replaced else "not saved",
                  outcome.reason)
        return outcome
