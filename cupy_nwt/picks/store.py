"""A tuning's result and where picks are kept: :class:`TuneResult`, its JSON form, the store of picks
(:func:`pick_store`) and :func:`lookup`.

The store is one JSON file (``store_file.ResultStore``: where it lives, its lock, what a damaged or
unwritable one does), keyed by the fingerprint of ``fingerprint.py``. This module sits below the loader: ``num_workers="auto"`` reads a
saved pick through it (``pick.py``) without importing the tuner, which builds loaders.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._checks import check_path
from ..errors import ArgumentError, ArgumentTypeError, MissingPathError, SavedPickError
from ..reporting.tables import write_json
from . import schema
from .fingerprint import Fingerprint
from .schema import build, check_record, parse_document
from .store_file import STORE_FORMAT as STORE_FORMAT  # re-exported: the store is named from here
from .store_file import STORE_NAME as STORE_NAME
from .store_file import ResultStore
from .trials import Trial, combine_runs
from .verdict import core_left, explain, reliability

RESULT_FORMAT = "cupy_nwt.tune_result/1"
REPLACE_Z = 2.0  # a new pick replaces a saved one only when faster by this many standard errors


def _read_json(path: Path) -> Any:
    with open(path, "rb") as f:
        data = f.read(schema.MAX_STORE_BYTES + 1)
    try:
        return parse_document(data)
    except SavedPickError as exc:
        raise SavedPickError(f"{path}: {exc}") from None


def read_json(path: str | os.PathLike[str]) -> Any:
    p = check_path("path", path)
    if not p.is_file():
        raise MissingPathError(f"no saved result at {p}")
    return _read_json(p)


def pick_store(cache_dir: str | Path | None = None) -> ResultStore:
    """The machine-wide store of picks, every record checked when read: one that does not build a
    :class:`TuneResult` makes the store damaged, set aside like any other (``store_file``)."""
    return ResultStore(cache_dir, check=TuneResult.from_dict)


@dataclass(frozen=True)
class TypeBest:
    """A candidate pipeline's own best in a search over several (worker types, decode placements):
    its count, rate and what its search cost."""

    worker_type: str
    best_workers: int
    samples_per_second: float
    search_seconds: float
    placement: str = "cpu"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TuneResult:
    """The pick, every run in order (``runs``) and one combined trial per count (``trials``).

    ``worker_type`` is the pick's kind of worker ("process" or "thread"); ``runs`` are that type's.
    When several types were searched, ``other_types`` holds the best each of the others reached.
    ``main_process``: the main process's load the trials represented ("waits": a GPU step, "busy":
    a CPU step; "step": the user's step ran in every trial; "" when a custom measure ran them);
    ``search_end``: why the search looked no further. ``placement`` is where the pick's pipeline
    decodes ("cpu": in the workers); candidates searched beside it are in ``other_types``.
    ``why`` says in one line what was picked and why, ``warning`` why it may not hold on another run
    (noisy trials, a count beside it unmeasured, a busy neighbour; ``verdict.py``), or None.
    """

    best_workers: int
    strategy: str
    runs: tuple[Trial, ...]
    max_workers: int
    iterations: int
    alpha: float
    tolerance: float
    batch_size: int
    prefetch_factor: int
    pin_memory: bool | str
    device: str
    fingerprint: Fingerprint | None = None
    created: str = ""
    worker_type: str = "process"
    other_types: tuple[TypeBest, ...] = ()
    main_process: str = ""
    usable_cpus: int | None = None
    search_end: str = ""
    placement: str = "cpu"

    @property
    def why(self) -> str:
        """What was picked and why, in one line (``verdict.explain``)."""
        return explain(self)

    @property
    def core_left(self) -> str | None:
        """Where the pick leaves a CPU to the main process and that lowered the wait, a clause saying so (``verdict``)."""
        return core_left(self)

    @property
    def warning(self) -> str | None:
        """Why the pick may not hold on another run, with what to do; None when the trials were steady."""
        return reliability(self)

    @property
    def wait_fraction(self) -> float | None:
        """The consumer's wait at the pick, as a share of its loop (None: tuned without a step)."""
        best = self.best_trial
        return best.wait_fraction if best is not None else None

    @property
    def samples_per_second(self) -> float:
        """The pick's measured throughput (its runs combined); 0.0 when it was picked unmeasured."""
        best = self.best_trial
        return best.samples_per_second if best is not None else 0.0

    @property
    def rel_error(self) -> float | None:
        """The relative standard error of that throughput (None: the measure reported none)."""
        best = self.best_trial
        return best.rel_error if best is not None else None

    @property
    def trials(self) -> tuple[Trial, ...]:
        return tuple(combine_runs(self.runs).values())

    @property
    def best_trial(self) -> Trial | None:
        return next((t for t in self.trials if t.workers == self.best_workers), None)

    @property
    def search_seconds(self) -> float:
        """What the search cost: the sum of its runs' wall time, every worker type's."""
        return sum(r.wall_seconds for r in self.runs) + sum(o.search_seconds for o in self.other_types)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in (
            "best_workers", "strategy", "max_workers", "iterations", "alpha", "tolerance", "batch_size",
            "prefetch_factor", "pin_memory", "device", "created", "worker_type", "main_process", "usable_cpus",
            "search_end", "samples_per_second", "rel_error", "placement", "wait_fraction", "why", "warning")}
        d["other_types"] = [o.to_dict() for o in self.other_types]
        d["format"] = RESULT_FORMAT
        d["search_seconds"] = self.search_seconds
        d["fingerprint"] = self.fingerprint.to_dict() if self.fingerprint else None
        d["trials"] = [t.to_dict() for t in self.trials]
        d["runs"] = [r.to_dict() for r in self.runs]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TuneResult":
        """The result a stored document describes, every field checked first (``schema.check_record``)."""
        check_record(d, RESULT_FORMAT)
        try:
            return cls(
                best_workers=int(d["best_workers"]),
                strategy=str(d["strategy"]),
                runs=tuple(build(Trial, r) for r in d["runs"]),
                max_workers=int(d["max_workers"]),
                iterations=int(d["iterations"]),
                alpha=float(d["alpha"]),
                tolerance=float(d["tolerance"]),
                batch_size=int(d["batch_size"]),
                prefetch_factor=int(d["prefetch_factor"]),
                pin_memory=d["pin_memory"] if isinstance(d["pin_memory"], str) else bool(d["pin_memory"]),
                device=str(d["device"]),
                fingerprint=Fingerprint.from_dict(d["fingerprint"]) if d.get("fingerprint") else None,
                created=str(d.get("created", "")),
                worker_type=str(d.get("worker_type", "process")),  # a record without one ran process workers
                other_types=tuple(build(TypeBest, o) for o in d.get("other_types", ())),
                main_process=str(d.get("main_process", "")),
                usable_cpus=d.get("usable_cpus"),
                search_end=str(d.get("search_end", "")),
                placement=str(d.get("placement", "cpu")),
            )
        except SavedPickError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise SavedPickError(f"malformed tune result: {exc!r}") from None

    def save(self, path: str | Path | None = None, cache_dir: str | Path | None = None) -> Path:
        """Write to ``path``; without one, into the machine-wide store (see :meth:`save_pick`).

        Args:
            path: a JSON file to write this result to.
            cache_dir: the store's folder, when ``path`` is None (default: the user cache dir).
        """
        if path is not None:
            return write_json(self.to_dict(), path)
        return self.save_pick(cache_dir).path

    def save_pick(self, cache_dir: str | Path | None = None) -> "SaveOutcome":
        """Record this pick in the machine-wide store under its fingerprint, unless a saved one holds.

        A pick saved for the same fingerprint (same machine, same work) stays unless this one is
        faster beyond the measurements' uncertainty (:func:`replaces`): two searches on an
        unchanged machine draw different noise, and the second must not undo the first for a
        difference the measurements cannot tell from none. A saved pick whose trials were unreliable gives
        way to a reliable search of its count: rerunning is what its warning asks. A changed machine or
        pipeline is another fingerprint, so it is searched and saved afresh.
        """
        if self.fingerprint is None:
            raise ArgumentError("this result has no fingerprint (tuned without a dataset): give save() a path")
        decided: dict[str, Any] = {}

        def keep(old: dict[str, Any]) -> bool:
            saved = TuneResult.from_dict(old)
            decided["saved"] = saved
            return not replaces(self, saved)

        path = pick_store(cache_dir).put(self.fingerprint.key, self.to_dict(), keep=keep)
        saved = decided.get("saved")
        if saved is None:
            return SaveOutcome(path, True, self, "the first pick for this machine and work")
        if replaces(self, saved) and _same_pick(self, saved):
            return SaveOutcome(path, True, self, f"the saved pick's count ({saved.best_workers}) again, and this "
                               "search's trials were reliable where the saved pick's were not")
        if replaces(self, saved):
            return SaveOutcome(path, True, self, f"faster than the saved pick {saved.best_workers} "
                               "beyond the uncertainty")
        if saved.best_workers == self.best_workers:
            return SaveOutcome(path, False, saved, f"the saved pick is the same count ({saved.best_workers})")
        if self.warning is not None and saved.warning is None:
            return SaveOutcome(path, False, saved, f"kept the saved pick {saved.best_workers}: this search's trials "
                               "were unreliable and the saved pick's were not")
        return SaveOutcome(path, False, saved, f"kept the saved pick {saved.best_workers}: this search's "
                           f"{self.best_workers} is not faster than it beyond the uncertainty")

    @classmethod
    def load(cls, path: str | Path) -> "TuneResult":
        """A result saved with ``save(path)``; :class:`SavedPickError` (a ``CupyNwtError``) naming the file if bad.

        Args:
            path: the JSON file ``save(path)`` wrote.
        """
        doc = read_json(path)
        try:
            return cls.from_dict(doc)
        except SavedPickError as exc:
            raise SavedPickError(f"{path}: {exc}") from None


@dataclass(frozen=True)
class SaveOutcome:
    """What saving a pick did: the store, whether this pick is now the saved one, the pick in force, and why."""

    path: Path
    replaced: bool
    in_force: TuneResult
    reason: str


def replaces(new: TuneResult, saved: TuneResult) -> bool:
    """Whether ``new``'s pick is faster than ``saved``'s beyond ``REPLACE_Z`` combined standard errors.

    Where the new search measured the saved count itself (same worker type), the two are compared
    within that search: same conditions, so a saved figure that was measured on a lucky (or an
    unlucky) day neither locks the pick in nor loses it. Otherwise the new pick's throughput is
    compared with the saved one. The margin is at least the search's own tolerance: counts that
    close are equal to it. The same count replaces itself only to clear a warning: a search whose trials
    were reliable replaces a saved pick of its count whose trials were not (the warning's remedy, a steady
    rerun, must not leave the pick flagged for ever); a saved pick with no measured
    throughput (picked unmeasured, or a record without one) gives way to a measured one. A
    search whose trials were unreliable (``warning``: noise, a busy neighbour) never replaces a pick that
    was not: its speed-up may be the load it met.
    """
    if _same_pick(new, saved):
        return new.warning is None and saved.warning is not None
    if new.warning is not None and saved.warning is None:
        return False
    if new.samples_per_second <= 0:
        return False
    if new.worker_type == saved.worker_type:
        again = next((t for t in new.trials if t.workers == saved.best_workers), None)
        if again is not None:
            return _beyond(new.samples_per_second, new.rel_error, again.samples_per_second, again.rel_error,
                           new.tolerance)
    if saved.samples_per_second <= 0:
        return True
    return _beyond(new.samples_per_second, new.rel_error, saved.samples_per_second, saved.rel_error, new.tolerance)


def _same_pick(new: TuneResult, saved: TuneResult) -> bool:
    return new.best_workers == saved.best_workers and new.worker_type == saved.worker_type


def _beyond(rate: float, err: float | None, other: float, other_err: float | None, tolerance: float) -> bool:
    margin = max(tolerance, REPLACE_Z * math.hypot(err or 0.0, other_err or 0.0))
    return rate > other * (1 + margin)


def lookup(fp: Fingerprint, cache_dir: str | Path | None = None, similar: bool = True, *,
           strict: bool = False) -> TuneResult | None:
    """The saved result for this machine and work (or similar work), if any.

    A store that cannot be read or does not validate is set aside (renamed ``*.bad-<time>``) with
    one warning naming it and why; then this returns None, so the caller searches afresh, or, with
    ``strict`` (a caller that will not search), raises one :class:`SavedPickError`.

    Args:
        fp: the machine and work to look up (``Fingerprint``).
        cache_dir: the store's folder (default: the user cache dir, ``CUPY_NWT_CACHE_DIR``).
        similar: accept a pick for similar work (the same machine and work but for a sample size within
            ``fingerprint.SIMILAR_RATIO``) when none is exact.
        strict: raise ``SavedPickError`` for a damaged store (once it is set aside) instead of returning None.
    """
    if not isinstance(fp, Fingerprint):
        raise ArgumentTypeError(f"fp must be a Fingerprint (a TuneResult's .fingerprint), got {fp!r}")
    rec = pick_store(cache_dir).find(fp, similar=similar, strict=strict)
    return TuneResult.from_dict(rec) if rec is not None else None
