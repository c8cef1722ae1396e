"""How a loader picks its samples: PyTorch's rules for ``batch_size``, ``shuffle``, ``sampler``,
``batch_sampler`` and ``drop_last``, the epoch plans they give, and ``len(loader)``.

Checked once at construction, with PyTorch's error types; lengths are computed when asked, from the
dataset or sampler as they are then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._checks import check_int
from ...data.contract import dataset_style, map_length
from ...errors import ArgumentError, ArgumentTypeError
from .order import BatchSampler


@dataclass(frozen=True)
class Sampling:
    """The resolved sampling arguments of one loader (``batch_size=None``: batching is off)."""

    style: str  # "map" or "iterable" (``data.contract.dataset_style``)
    batch_size: int | None
    shuffle: bool
    drop_last: bool
    sampler: Any
    batch_sampler: Any
    seed: int
    rank: int = 0
    world_size: int = 1

    @classmethod
    def resolve(cls, dataset: Any, batch_size: Any, shuffle: Any, sampler: Any, batch_sampler: Any,
                drop_last: Any, seed: int, rank: int = 0, world_size: int = 1) -> Sampling:
        """PyTorch's rules, in the order it checks: a ValueError for what it refuses, a TypeError for a sampler
        or batch_sampler that is not iterable."""
        style = dataset_style(dataset)
        if style == "iterable":
            if shuffle not in (False, None):
                raise ArgumentError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ArgumentError(f"DataLoader with IterableDataset: expected unspecified sampler option, but got sampler={sampler}")
            if batch_sampler is not None:
                raise ArgumentError("DataLoader with IterableDataset: expected unspecified batch_sampler option, but got "
                                 f"batch_sampler={batch_sampler}")
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ArgumentError("sampler option is mutually exclusive with shuffle")
        for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
            if value is not None and not hasattr(value, "__iter__"):
                raise ArgumentTypeError(f"{name} must be iterable (of indices, or of lists of indices for batch_sampler), "
                                f"got {type(value).__name__}")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ArgumentError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None:
            if drop_last:
                raise ArgumentError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        else:
            batch_size = check_int("batch_size", batch_size, ge=1)
            if not isinstance(drop_last, (bool, np.bool_)):  # torch's BatchSampler refuses drop_last=1 in these words
                raise ArgumentTypeError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        return cls(style, batch_size, shuffle, bool(drop_last), sampler, batch_sampler, seed, rank, world_size)

    @property
    def batched(self) -> bool:
        """Whether samples are collated into batches (``batch_size`` or a ``batch_sampler``)."""
        return self.batch_size is not None or self.batch_sampler is not None

    @property
    def own(self) -> bool:
        """Whether the loader's own ``BatchSampler`` picks the indices (map-style, no user sampler)."""
        return self.style == "map" and self.sampler is None and self.batch_sampler is None

    def batch_sampler_for(self, dataset: Any, epoch: int = 0) -> BatchSampler:
        """The loader's own sampler over the dataset as it is now (its length read now), listing ``epoch``."""
        return BatchSampler(map_length(dataset, "the loader's own sampler"), self.batch_size or 1, self.shuffle, self.seed,
                            self.drop_last and self.batched, self.rank, self.world_size, epoch)

    def length(self, dataset: Any) -> int:
        """``len(loader)``, as PyTorch computes it; TypeError when the dataset or sampler has no length."""
        if self.style == "iterable":
            n = len(dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        if self.sampler is not None:
            n = len(self.sampler)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        return len(self.batch_sampler_for(dataset))

    def max_rows(self, dataset: Any) -> int:
        """Rows a ring slot should hold (0 when unknown in advance: the first batch's then)."""
        if not self.batched or self.batch_size is None:
            return 0
        if self.own:
            return self.batch_sampler_for(dataset).max_rows
        return self.batch_size
