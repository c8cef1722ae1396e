"""The rest of an epoch after a stop: which samples are left, and how a rank's share of them is batched.

Pure functions of a few integers, so the main process, every rank and the exhaustive tests compute
the same thing. The base is the loader's own epoch order ``O`` (``order.epoch_order``). A
*session* is one run of (part of) an epoch with one world size ``W``: its remainder is ``O`` from
position ``base`` on, less the ``excluded`` positions already consumed, and rank r's shard of it
follows DistributedSampler's rule (``ranks.shard``: padded by wrapping around the remainder's
start, or its tail cut with ``drop_last``). A fresh epoch is the session ``base=0, excluded=()``,
whose shards are exactly ``BatchSampler.plan``'s.

Rank r's j-th sample is position ``j * W + r`` of the (padded) remainder, so when every rank has
delivered its first k batches the consumed positions are a prefix of the remainder: a new session
over another world size starts after it. Ranks that delivered different batches (or batches out of
order) leave a few holes, carried as ``excluded``. Pad samples are repeats of the remainder's
start: a consumed pad consumes nothing new, and a new session never re-delivers a consumed sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import OutOfRangeError
from ...ranks import shard
from .order import PlanTask, batch_seed, num_batches

_RESUMED_TAG = 0x726573  # transform seeds of a re-sharded session, kept apart from an uninterrupted run's
_CHUNK = 4096  # batch indexes turned into Python ints at once


@dataclass(frozen=True)
class Session:
    """One world size's pass over what is left of epoch ``epoch``'s order of ``n`` samples."""

    n: int
    batch_size: int
    shuffle: bool
    seed: int
    epoch: int
    drop_last: bool
    world_size: int
    base: int = 0
    excluded: tuple[int, ...] = field(default=())

    @property
    def fresh(self) -> bool:
        """Whether this is an uninterrupted epoch's own session (its transform seeds are the usual ones)."""
        return self.base == 0 and not self.excluded

    def positions(self) -> np.ndarray:
        """The positions of ``O`` that make up the remainder, in order."""
        pos = np.arange(self.base, self.n, dtype=np.int64)
        if self.excluded:
            pos = pos[~np.isin(pos, np.asarray(self.excluded, dtype=np.int64))]
        return pos

    def shard_positions(self, rank: int) -> np.ndarray:
        """The positions of ``O`` rank ``rank`` visits this session, in order (pads included)."""
        pos = self.positions()
        return shard(pos, rank, self.world_size, self.drop_last) if len(pos) else pos

    def batches(self, rank: int) -> int:
        return num_batches(len(self.shard_positions(rank)), self.batch_size, self.drop_last)

    def transform_seed(self, b: int, rank: int) -> int:
        """Batch b of rank ``rank``: the uninterrupted run's seed in a fresh session; else one keyed by the session."""
        g = b * self.world_size + rank
        if self.fresh:
            return batch_seed(self.seed, self.epoch, g)
        return int(np.random.SeedSequence([self.seed, self.epoch, g, _RESUMED_TAG, self.base,
                                           len(self.excluded)]).generate_state(1)[0])

    def consumed(self, delivered: Mapping[int, Iterable[int]]) -> np.ndarray:
        """A mask over ``O``'s positions: consumed before this session or by the batches ``delivered[rank]``."""
        mask = np.zeros(self.n, dtype=bool)
        mask[: self.base] = True
        if self.excluded:
            mask[np.asarray(self.excluded, dtype=np.int64)] = True
        B = self.batch_size
        for rank, batches in delivered.items():
            pos = self.shard_positions(rank)
            rows = (np.fromiter(batches, dtype=np.int64)[:, None] * B + np.arange(B, dtype=np.int64)).ravel()
            mask[pos[rows[rows < len(pos)]]] = True  # every delivered batch's positions at once (the last may be short)
        return mask

    def after(self, delivered: Mapping[int, Iterable[int]], world_size: int) -> Session:
        """The session over ``world_size`` ranks that takes what is left once ``delivered`` is consumed."""
        mask = self.consumed(delivered)
        free = np.flatnonzero(~mask)
        base = int(free[0]) if len(free) else self.n
        holes = np.flatnonzero(mask[base:]) + base
        return Session(self.n, self.batch_size, self.shuffle, self.seed, self.epoch, self.drop_last, world_size,
                       base, tuple(int(i) for i in holes))


@dataclass(frozen=True, eq=False)
class SessionPlan:
    """One rank's plan for what is left of a session: its batches ``todo`` (session batch indexes), in order.

    Tasks are numbered 0.. for the batch source; ``todo[i]`` says which session batch task i is, and
    its transform seed is that batch's, so a same-settings resume repeats the uninterrupted run bitwise.
    ``seeded=False`` (no batch transform to take the seed) gives every task the seed 0 instead: a seed
    costs more to derive than the loader's whole hand-over of a small batch.
    """

    session: Session
    rank: int
    order: np.ndarray | InOrder  # the rank's shard, as dataset indices
    todo: np.ndarray | InOrder
    seeded: bool = True

    stream = False

    @classmethod
    def make(cls, session: Session, rank: int, done: Iterable[int] = (), *, seeded: bool = True) -> SessionPlan:
        order = _epoch_order(session)
        if not (session.fresh and session.world_size == 1):  # else the shard is the whole order, as it is
            order = order[session.shard_positions(rank)]
        batches = num_batches(len(order), session.batch_size, session.drop_last)
        todo: np.ndarray | InOrder = InOrder(batches)
        taken = np.fromiter(done, dtype=np.int64)
        if len(taken):  # a mask, not np.setdiff1d: that sorts, seconds for an epoch of millions of batches
            keep = np.ones(batches, dtype=bool)
            keep[taken[(taken >= 0) & (taken < batches)]] = False
            todo = np.flatnonzero(keep)
        return cls(session, rank, order, todo, seeded)

    def done_before(self) -> set[int]:
        """The session's batches delivered before this plan began (those it does not list)."""
        if isinstance(self.todo, InOrder):
            return set()
        return set(range(self.session.batches(self.rank))) - set(self.todo.tolist())

    @property
    def epoch(self) -> int:
        return self.session.epoch

    def __len__(self) -> int:
        return len(self.todo)

    def number(self, task: int) -> int:
        """The session batch that task ``task`` makes (errors and warnings name it)."""
        return int(self.todo[task])

    def tasks(self) -> Iterator[PlanTask]:
        B, order, seed_of = self.session.batch_size, self.order, self.session.transform_seed
        i = 0
        for start in range(0, len(self.todo), _CHUNK):  # as Python ints a chunk at a time: the first batch waits for no more
            for b in self.todo[start : start + _CHUNK].tolist():
                yield i, order[b * B : (b + 1) * B], seed_of(b, self.rank) if self.seeded else 0
                i += 1


def _epoch_order(session: Session) -> np.ndarray | InOrder:
    from .order import epoch_order  # noqa: PLC0415 - one import site keeps the tests' patching simple

    if not session.shuffle:
        return InOrder(session.n)
    return epoch_order(session.n, shuffle=True, seed=session.seed, epoch=session.epoch)


class InOrder:
    """The order ``0 .. n-1`` of an epoch without shuffling, as ``np.arange(n)`` reads, made only where read: a
    batch's slice, or the positions a shard takes. The whole array would cost 8 bytes a sample up front in
    every epoch (1.6 GB for 200 million samples), where torch's ``SequentialSampler`` costs nothing."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: int | slice | np.ndarray) -> Any:
        if isinstance(key, (int, np.integer)):
            if not -self.n <= key < self.n:
                raise OutOfRangeError(f"position {key} outside an order of {self.n}")
            return int(key) % self.n
        if isinstance(key, slice):
            return np.arange(*key.indices(self.n), dtype=np.int64)
        positions = np.asarray(key, dtype=np.int64)
        if positions.size and not (-self.n <= positions.min() and positions.max() < self.n):
            raise OutOfRangeError(f"positions outside an order of {self.n}")
        return np.where(positions < 0, positions + self.n, positions)


def split_done(done: Iterable[int]) -> tuple[int, list[int]]:
    """Delivered batch indexes as (the prefix 0..k-1 they cover, the few beyond it, sorted)."""
    got = sorted(set(done))
    k = 0
    while k < len(got) and got[k] == k:
        k += 1
    return k, got[k:]


def join_done(prefix: int, extra: Sequence[int]) -> list[int]:
    return [*range(prefix), *extra]
