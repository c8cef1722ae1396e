"""Which sample indices go into which batch, for one epoch.

Everything here is a pure function of ``(n, batch_size, shuffle, seed, epoch)``: the main process and
any worker compute the same order without talking to each other, an epoch can be replayed exactly,
and a later sharding step (rank, world_size) slots in between ``epoch_order`` and the batching without
changing either.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

_TRANSFORM_TAG = 0x6E7774  # keeps transform seeds apart from the shuffle stream of the same seed


def fresh_seed() -> int:
    """A new random base seed, for loaders built with ``seed=None``."""
    return int(np.random.SeedSequence().entropy % (1 << 63))


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """All ``n`` indices (int64) in the order epoch ``epoch`` visits them."""
    if shuffle:
        return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64, copy=False)
    return np.arange(n, dtype=np.int64)


def batch_seed(seed: int, epoch: int, batch_index: int) -> int:
    """The 32-bit seed handed to a batch transform: fixed by (seed, epoch, batch), not by the worker."""
    state = np.random.SeedSequence([seed, epoch, batch_index, _TRANSFORM_TAG]).generate_state(1)
    return int(state[0])


def num_batches(count: int, batch_size: int, drop_last: bool) -> int:
    return count // batch_size if drop_last else -(-count // batch_size)


@dataclass(frozen=True)
class BatchSampler:
    """Cuts an epoch's index order into batches of ``batch_size`` (the last one short unless dropped)."""

    n: int
    batch_size: int
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.n, (int, np.integer)) or self.n < 0:
            raise ValueError(f"the dataset length must be a non-negative integer, got {self.n!r}")
        if not isinstance(self.batch_size, (int, np.integer)) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed}")

    def __len__(self) -> int:
        return num_batches(self.n, self.batch_size, self.drop_last)

    @property
    def max_rows(self) -> int:
        """Rows of the largest batch this sampler can produce (the ring's slot capacity)."""
        return min(self.batch_size, self.n)

    def plan(self, epoch: int) -> "EpochPlan":
        return EpochPlan(epoch_order(self.n, shuffle=self.shuffle, seed=self.seed, epoch=epoch), self.batch_size, len(self))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """One epoch's order plus its batching; ``indices(b)`` is a view, never a Python list."""

    order: np.ndarray
    batch_size: int
    batches: int

    def __len__(self) -> int:
        return self.batches

    def indices(self, b: int) -> np.ndarray:
        if not 0 <= b < self.batches:
            raise IndexError(f"batch {b} is outside this epoch's {self.batches} batches")
        return self.order[b * self.batch_size : (b + 1) * self.batch_size]

    def __iter__(self):
        return (self.indices(b) for b in range(self.batches))
