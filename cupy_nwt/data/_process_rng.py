"""The random stream of a per-sample transform: one per process, made once even when threads ask together.

Forked workers inheriting one generator would all draw the same numbers, so each process makes its
own; thread workers share their process's stream (a NumPy generator serialises its draws), which is
made under a lock so that two threads asking first at once do not each make the seed's stream and
draw the same first numbers.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from .._checks import check_int

_MAKING = threading.Lock()  # held while a ProcessRng makes its generator


def _new_making_lock() -> None:
    global _MAKING
    _MAKING = threading.Lock()  # a forked child's copy may be held by a thread the fork left behind


os.register_at_fork(after_in_child=_new_making_lock)


class ProcessRng:
    """A generator per process: forked workers inheriting one generator would all draw the same numbers.

    In the process that created it, the stream is ``default_rng(seed)``; any other process (a
    worker) gets ``default_rng([seed, pid])``, so workers differ from each other and from the parent.
    """

    def __init__(self, seed: int | None) -> None:
        self.seed = check_int("seed", seed, ge=0, optional=True)
        self._origin = os.getpid()
        self._pid: int | None = None
        self._rng: np.random.Generator | None = None

    def get(self) -> np.random.Generator:
        pid = os.getpid()
        rng = self._rng
        if rng is not None and self._pid == pid:
            return rng
        with _MAKING:  # thread workers asking first at once would each make the seed's stream and draw alike
            if self._rng is None or self._pid != pid:
                if self.seed is None:
                    self._rng = np.random.default_rng()
                elif pid == self._origin:
                    self._rng = np.random.default_rng(self.seed)
                else:
                    self._rng = np.random.default_rng([self.seed, pid])
                self._pid = pid
            return self._rng

    def __getstate__(self) -> dict[str, Any]:
        return {"seed": self.seed, "_origin": self._origin, "_pid": None, "_rng": None}
