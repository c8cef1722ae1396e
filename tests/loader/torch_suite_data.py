"""What the torch-suite parity tests share: datasets written as a user's, and small readers of a batch."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch.utils.data as tud
from parity_backends import is_torch

import cupy_nwt


def worker_info():
    """Whichever loader runs us: its worker info (None in the main process)."""
    return cupy_nwt.get_worker_info() or tud.get_worker_info()


def known_difference(request: pytest.FixtureRequest, backend, why: str) -> None:
    """Torch's answer is pinned; cupy_nwt differs for the reason given (docs/pytorch.md lists it). Strict:
    the day cupy_nwt answers as torch does, the test fails until the mark goes."""
    if not is_torch(backend):
        request.applymarker(pytest.mark.xfail(strict=True, reason=why))


def as_list(x):
    """A batch field as plain Python numbers."""
    return np.asarray(x).tolist()


def items(loader) -> list[int]:
    """Every sample of every batch, in delivery order."""
    return [int(v) for batch in loader for v in np.asarray(batch).reshape(-1)]


class Counting(tud.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return i


class CountingStream(tud.IterableDataset):
    """0 .. n-1, the whole stream in every reader (it does not shard itself)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(range(self.n))


class SlowAt(tud.Dataset):
    """0 .. n-1, with sample ``at`` taking ``seconds`` and the others none."""

    def __init__(self, n: int, at: int = 0, seconds: float = 0.5) -> None:
        self.n, self.at, self.seconds = n, at, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i == self.at:
            time.sleep(self.seconds)
        return i
