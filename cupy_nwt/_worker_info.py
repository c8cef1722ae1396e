"""What ``get_worker_info()`` tells a worker, and each worker's seed.

Below both the loader, which sets it, and the data sources that read it (``streaming``), so neither
imports the other.

A process worker holds its ``WorkerInfo`` in a module global (one worker per process); a thread
worker in a thread-local, so the main thread of the main process still sees None.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker (``None`` in the main process).

    As PyTorch's: ``id`` (0 .. ``num_workers`` - 1), ``seed`` (this worker's: a base seed + ``id``;
    Python's ``random``, NumPy's global generator and, when torch is imported, torch's are seeded
    from it, and ``torch.utils.data.get_worker_info()`` answers too, see ``torch_workers``) and ``dataset``
    (this worker's copy). Beyond it, ``rank`` and ``world_size`` of the loader, so an iterable-style
    dataset can take its share of the data as ``rank * num_workers + id`` of ``world_size *
    num_workers`` readers.

    Thread workers (``worker_type="thread"``) get the same ``seed`` a process worker would, but the
    global generators are the whole process's, so they are left alone: draw from
    ``np.random.default_rng(seed)`` instead. ``dataset`` is then the one object all threads share.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any
    rank: int = 0
    world_size: int = 1


class _ThreadInfo(threading.local):
    """A thread's worker info and reading ranks, None by default: read per sample (``ProcessRng``), so a thread
    that has none finds the default, where ``getattr(local, name, None)`` raises and catches an AttributeError."""

    info: WorkerInfo | None = None  # a worker thread's: the main thread has none
    ranks: tuple[int, int] | None = None  # a loader's reading its stream in this thread without workers


_process_info: WorkerInfo | None = None  # a worker process's
_thread_info = _ThreadInfo()


def get_worker_info() -> WorkerInfo | None:
    """This worker's id, the number of workers, its seed, its dataset copy, rank and world size; ``None`` outside.

    Per thread: a thread worker sees its own, the main thread of the main process sees None.
    """
    info = _thread_info.info
    return info if info is not None else _process_info


def enter_process(info: WorkerInfo) -> None:
    """This process is the worker ``info`` describes (called once, in the worker process)."""
    global _process_info
    _process_info = info


def enter_thread(info: WorkerInfo) -> None:
    """The calling thread is the worker ``info`` describes."""
    _thread_info.info = info


@contextmanager
def main_reader(rank: int, world_size: int) -> Iterator[None]:
    """While a loader without workers reads its stream in this thread: the loader's rank and world size,
    which ``current_reader`` takes (``get_worker_info()`` stays None in the main process, as in PyTorch),
    so each rank's stream reads its own share there too."""
    previous = _thread_info.ranks
    _thread_info.ranks = (rank, world_size)
    try:
        yield
    finally:
        _thread_info.ranks = previous


def main_reader_ranks() -> tuple[int, int] | None:
    """The (rank, world size) of the loader reading a stream in this thread without workers; None otherwise."""
    return _thread_info.ranks


def worker_seed(seed: int, worker_id: int, epoch: int = 0) -> int:
    """A worker's seed, as PyTorch's: a base seed + the worker id, so the workers of one start never share one.

    The base (62 bits) is fixed by the loader's seed and the epoch the workers started in, so each
    epoch's workers draw differently (persistent workers keep their first epoch's, as in PyTorch).
    """
    a, b = np.random.SeedSequence([seed, 0x776B72, epoch]).generate_state(2, np.uint64)
    return int((int(a) ^ (int(b) << 7)) & ((1 << 62) - 1)) + worker_id
