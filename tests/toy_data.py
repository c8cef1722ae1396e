"""Tiny map-style datasets shared by the loader tests (module level, so every start method pickles them)."""

from __future__ import annotations

import numpy as np

import cupy_nwt


class Squares:
    """Sample i: a 4x4x3 uint8 image filled with ``i % modulo``, and the label i.

    Tests that plant a garbage byte pick a ``modulo`` below it so real data can never look like it.
    """

    def __init__(self, n: int, modulo: int = 256) -> None:
        self.n = n
        self.modulo = modulo

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.full((4, 4, 3), i % self.modulo, np.uint8), i


class Indices:
    """Sample i: ``np.int64(i)``, so a run's samples say exactly which were delivered."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.int64:
        return np.int64(i)


class ShardedIndices(cupy_nwt.IterableDataset):
    """0 .. n-1 streamed, each worker reading its share by ``get_worker_info()`` as torch's documentation shows."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = cupy_nwt.get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(np.arange(w, self.n, k, dtype=np.int64))
