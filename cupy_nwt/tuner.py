"""Old home of the Num Worker Tuner, kept as re-exports for one release: import from ``cupy_nwt``.

The tuner now lives in :mod:`cupy_nwt.nwt`, split by job (see its docstring). Each name is looked
up in its new module when asked for, so this shim imports nothing it is not asked for and always
hands out what that module holds. To replace a name (a test's monkeypatch), set it in its module.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "Measurement": "cupy_nwt.nwt.trials", "Measure": "cupy_nwt.nwt.trials", "Trial": "cupy_nwt.nwt.trials",
    "PAPER_TIME_SCALE": "cupy_nwt.nwt.paper",
    "DEFAULT_TOLERANCE": "cupy_nwt.nwt.fast", "FAST_FRACTION": "cupy_nwt.nwt.fast",
    "MIN_FAST_ITERATIONS": "cupy_nwt.nwt.fast", "FAST_BUDGET": "cupy_nwt.nwt.fast",
    "STEADY_FRACTION": "cupy_nwt.nwt.fast",
    "STRATEGIES": "cupy_nwt.nwt.tune", "tune_num_workers": "cupy_nwt.nwt.tune",
    "RESULT_FORMAT": "cupy_nwt.nwt.store", "TuneResult": "cupy_nwt.nwt.store", "lookup": "cupy_nwt.nwt.store",
    "LoaderMeasure": "cupy_nwt.nwt.measure", "steady_rates": "cupy_nwt.nwt.measure",
    "auto_num_workers": "cupy_nwt.nwt.pick",
    "TUNE_LOCK_SUFFIX": "cupy_nwt.nwt.auto",
    "summary_text": "cupy_nwt._reporting.explain",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    try:
        home = _HOMES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return __all__
