"""Tiny map-style datasets shared by the loader tests (module level, so every start method pickles them)."""

from __future__ import annotations

import numpy as np


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
