"""The random stream of a per-sample transform: one per worker, from the transform's seed and the worker's.

Forked workers inheriting one generator would all draw the same numbers, so each worker makes its
own, from the transform's ``seed`` and the worker's seed (``get_worker_info().seed``, which the
loader's seed and the epoch fix): a seeded run draws the same crops again, whatever the process ids,
as a seeded torch run does. Thread workers of one process each have their own worker seed, so each
its own stream; a stream is made under a lock, so two threads asking first at once never make one
each and draw alike.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from .._checks import check_int
from .._fork_safe_lock import ForkSafeLock
from .._worker_info import get_worker_info

_MAKING = ForkSafeLock()  # held while a ProcessRng makes a stream


def _worker(info: Any) -> tuple[int, int] | None:
    """(id, seed) of the worker asking: cupy_nwt's ``info``, else torch's when torch is loaded; None outside one."""
    if info is None and "torch" in sys.modules:
        info = sys.modules["torch"].utils.data.get_worker_info()
    return None if info is None else (int(info.id), int(info.seed))


class ProcessRng:
    """The stream of one transform: ``default_rng(seed)`` outside workers (the process that made it),
    ``default_rng([seed, worker seed])`` in each worker, fresh entropy for ``seed=None``.

    Args:
        seed: the transform's seed (None: fresh entropy in every process and worker).
    """

    _last: tuple[int, Any, np.random.Generator] | None = None  # (pid, worker info, its stream) of the last draw

    def __init__(self, seed: int | None) -> None:
        self.seed = check_int("seed", seed, ge=0, optional=True)
        self._origin = os.getpid()
        self._streams: dict[tuple[int, int | None], tuple[int | None, np.random.Generator]] = {}

    def get(self) -> np.random.Generator:
        """This worker's stream (made on its first draw; a worker of a later epoch has another seed)."""
        # asked per sample: the last asker's stream is found by its process and cupy_nwt worker info alone (torch
        # sets a worker's info once, before the worker reads its dataset; the main process has none)
        pid, info = os.getpid(), get_worker_info()
        last = self._last
        if last is not None and last[0] == pid and last[1] is info:
            return last[2]
        rng = self._stream(pid, _worker(info))
        self._last = (pid, info, rng)
        return rng

    def _stream(self, pid: int, worker: tuple[int, int] | None) -> np.random.Generator:
        """The stream of worker ``(id, seed)`` (None: no worker) in process ``pid``, made under the lock once."""
        key, wseed = (pid, None if worker is None else worker[0]), None if worker is None else worker[1]
        held = self._streams.get(key)
        if held is not None and held[0] == wseed:
            return held[1]
        with _MAKING:
            held = self._streams.get(key)
            if held is None or held[0] != wseed:
                if self.seed is None:
                    rng = np.random.default_rng()
                elif wseed is not None:
                    rng = np.random.default_rng([self.seed, wseed])
                elif pid == self._origin:
                    rng = np.random.default_rng(self.seed)
                else:  # a process of the user's own: differ from the parent at least
                    rng = np.random.default_rng([self.seed, pid])
                held = self._streams[key] = (wseed, rng)
            return held[1]

    def __getstate__(self) -> dict[str, Any]:
        return {"seed": self.seed, "_origin": self._origin, "_streams": {}}
