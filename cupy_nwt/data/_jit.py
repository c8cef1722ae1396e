"""Numba's ``njit(nogil=True)``, its compiled code kept on disk where Numba can find a folder for it.

With ``cache=True`` Numba looks, as the function is decorated, for a folder to keep compiled code in:
``NUMBA_CACHE_DIR`` when set, else the ``__pycache__`` beside the source, else the user's cache folder
(``~/.cache/numba``). An install the user cannot write (a root-owned virtual environment, a container's
read-only image) run with a HOME that cannot be written either leaves none, and Numba raises at import,
which stopped every pipeline here before its first sample. There the kernel is compiled in each process
instead (seconds, once per process; forked workers share the parent's) and that is logged once: set
``NUMBA_CACHE_DIR`` to a writable folder to keep the compiled code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from numba import njit

_log = logging.getLogger(__name__)
_told: list[str] = []


def nogil_kernel(func: Callable[..., Any]) -> Any:
    """``func`` compiled by Numba without the GIL, cached on disk where Numba can keep a cache.

    Args:
        func: The Python function to compile.
    """
    try:
        return njit(nogil=True, cache=True)(func)
    except RuntimeError as exc:
        if "cannot cache" not in str(exc):
            raise
        if not _told:
            _told.append(str(exc))
            _log.info("Numba has no folder to cache compiled kernels in (%s): they are compiled in each process; "
                      "set NUMBA_CACHE_DIR to a writable folder to keep them", exc)
        return njit(nogil=True)(func)
