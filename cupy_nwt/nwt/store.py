"""A tuning's result and where picks are kept: :class:`TuneResult`, its JSON form, and :func:`lookup`.

The store itself (one JSON file per machine, keyed by fingerprint) is ``fingerprint.ResultStore``;
this module gives it the result's shape. It sits below the loader: ``num_workers="auto"`` reads a
saved pick through it (``pick.py``) without importing the tuner, which builds loaders.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .fingerprint import Fingerprint, ResultStore, read_json, write_json_atomic
from .trials import Trial, combine_runs

RESULT_FORMAT = "cupy_nwt.tune_result/1"


@dataclass(frozen=True)
class TypeBest:
    """A worker type's own best in a search over several: its count, rate and what its search cost."""

    worker_type: str
    best_workers: int
    samples_per_second: float
    search_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TuneResult:
    """The pick, every run in order (``runs``) and one combined trial per count (``trials``).

    ``worker_type`` is the pick's kind of worker ("process" or "thread"); ``runs`` are that type's.
    When several types were searched, ``other_types`` holds the best each of the others reached.
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
            "prefetch_factor", "pin_memory", "device", "created", "worker_type")}
        d["other_types"] = [o.to_dict() for o in self.other_types]
        d["format"] = RESULT_FORMAT
        d["search_seconds"] = self.search_seconds
        d["fingerprint"] = self.fingerprint.to_dict() if self.fingerprint else None
        d["trials"] = [t.to_dict() for t in self.trials]
        d["runs"] = [r.to_dict() for r in self.runs]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TuneResult":
        if not isinstance(d, dict) or d.get("format") != RESULT_FORMAT:
            raise ValueError(f"not a {RESULT_FORMAT} document")
        try:
            return cls(
                best_workers=int(d["best_workers"]),
                strategy=str(d["strategy"]),
                runs=tuple(Trial(**r) for r in d["runs"]),
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
                worker_type=str(d.get("worker_type", "process")),  # saved before types were searched
                other_types=tuple(TypeBest(**o) for o in d.get("other_types", ())),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed tune result: {exc!r}") from None

    def save(self, path: str | Path | None = None, cache_dir: str | Path | None = None) -> Path:
        """Write to ``path``; without one, into the machine-wide store under this result's fingerprint."""
        if path is not None:
            return write_json_atomic(path, self.to_dict())
        if self.fingerprint is None:
            raise ValueError("this result has no fingerprint (tuned without a dataset): give save() a path")
        return ResultStore(cache_dir).put(self.fingerprint.key, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "TuneResult":
        return cls.from_dict(read_json(path))


def lookup(fp: Fingerprint, cache_dir: str | Path | None = None, similar: bool = True) -> TuneResult | None:
    """The saved result for this machine and work (or similar work), if any."""
    rec = ResultStore(cache_dir).find(fp, similar=similar)
    return TuneResult.from_dict(rec) if rec is not None else None
