"""The tuning behind ``num_workers="auto"``: once per machine, under a file lock, then saved.

Importing this module registers :func:`_tune_once` as the tuner of ``pick.auto_num_workers`` (what
the loader calls): the loader reaches the tuner only through that slot, since the tuner builds
loaders. ``import cupy_nwt`` imports this module, so ``DataLoader(num_workers="auto")`` always has it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from . import pick
from . import tune as _tune
from .fingerprint import Fingerprint
from .pick import _log, _log_saved, auto_num_workers
from .store import lookup, pick_store
from .trials import MeasureFactory

__all__ = ["TUNE_LOCK_SUFFIX", "auto_num_workers"]

TUNE_LOCK_SUFFIX = ".tune.lock"


def _tune_once(fp: Fingerprint, dataset: Any, cache_dir: str | Path | None, *,
               measure_factory: MeasureFactory | None = None, **kw: Any) -> int:
    """Tune under the machine-wide lock unless someone saved a pick while we waited for it.

    ``kw`` are ``tune_num_workers``'s loader settings and ``max_workers``; without a
    ``measure_factory`` the search measures the real loader.
    """
    store_path = pick_store(cache_dir).path
    store_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(store_path) + TUNE_LOCK_SUFFIX)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        _log.info("num_workers='auto': another process is tuning on this machine; waiting for its result")
        lock.acquire()  # flock: released by the OS too if the tuning process dies, so no stale lock
    try:
        saved = lookup(fp, cache_dir)
        if saved is not None:
            _log_saved(saved, fp)
            return saved.best_workers
        if measure_factory is not None:
            kw["measure"] = measure_factory(
                dataset, batch_size=kw["batch_size"], prefetch_factor=kw["prefetch_factor"],
                pin_memory=kw["pin_memory"], device=kw["device"], batch_transform=kw["batch_transform"],
                **({"step": kw["step"]} if kw.get("step") is not None else {}))
        result = _tune.tune_num_workers(dataset, strategy="fast", progress=False, **kw)
        _log.info("num_workers='auto': %s", result.why)
        return replace(result, fingerprint=fp).save_pick(cache_dir).in_force.best_workers
    finally:
        lock.release()


pick.register_tuner(_tune_once)
