"""Which sample indices go into which batch, for one epoch: the plans a batch source works through.

The loader's own plan (``EpochPlan``) is a pure function of ``(n, batch_size, shuffle, seed, epoch)``:
the main process and any worker compute the same order without talking to each other, an epoch can
be replayed exactly, and every rank of a distributed job computes the same epoch order and takes
its own shard of it (``ranks.shard``: DistributedSampler semantics) before batching. A user's
``sampler`` or ``batch_sampler`` is read lazily instead (``SamplerPlan``), and an iterable-style
dataset has no indices at all (``StreamPlan``: each task asks a worker for its stream's next batch).

Every plan yields tasks ``(b, indices or None, transform seed)``; the seed is fixed by
``(seed, epoch, b * world_size + rank)``, never by the worker that makes the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..._checks import check_int
from ...errors import LoaderError, OutOfRangeError
from ...ranks import samples_per_rank, shard

_TRANSFORM_TAG = 0x6E7774  # keeps transform seeds apart from the shuffle stream of the same seed


def fresh_seed() -> int:
    """A new random base seed, for loaders built with ``seed=None``."""
    entropy = np.random.SeedSequence().entropy  # a fresh SeedSequence draws one int from the OS
    assert isinstance(entropy, int)
    return entropy % (1 << 63)


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
    """Cuts this rank's share of an epoch's index order into batches of ``batch_size``.

    With ``world_size > 1`` every rank computes the same epoch order (shuffled from ``[seed, epoch]``,
    or ``arange`` without shuffle: the order is sharded either way) and keeps every world_size-th
    index from position ``rank``. Without ``drop_last`` the order is first padded by wrapping
    around to its start, so every rank gets ``ceil(n / world_size)`` samples and the few padded ones
    are real samples that another rank also sees this epoch (counted twice in, say, a metric);
    ``drop_last`` instead leaves out the ``n % world_size`` tail of the order, then drops each
    rank's short last batch. Every rank therefore has the same number of batches.
    """

    n: int
    batch_size: int
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False
    rank: int = 0
    world_size: int = 1
    epoch: int = 0  # the epoch that iterating it lists (``loader.batch_sampler`` reads the loader's next)

    def __post_init__(self) -> None:
        check_int("epoch", self.epoch, ge=0)
        check_int("the dataset length", self.n, ge=0)
        check_int("batch_size", self.batch_size, ge=1)
        check_int("seed", self.seed, ge=0)
        world_size = check_int("world_size", self.world_size, ge=1)
        check_int(f"rank (of world_size {world_size})", self.rank, ge=0, le=world_size - 1)

    @property
    def samples(self) -> int:
        """Samples this rank visits per epoch (padding included)."""
        return samples_per_rank(self.n, self.world_size, self.drop_last)

    @property
    def padding(self) -> int:
        """Samples per epoch, over all ranks, that are repeats added to even out the shards."""
        return self.samples * self.world_size - self.n if not self.drop_last and self.n else 0

    def __len__(self) -> int:
        return num_batches(self.samples, self.batch_size, self.drop_last)

    @property
    def max_rows(self) -> int:
        """Rows of the largest batch this sampler can produce (the ring's slot capacity)."""
        return min(self.batch_size, self.samples)

    def plan(self, epoch: int) -> "EpochPlan":
        order = epoch_order(self.n, shuffle=self.shuffle, seed=self.seed, epoch=epoch)
        if self.world_size > 1:
            order = shard(order, self.rank, self.world_size, self.drop_last)
        return EpochPlan(order, self.batch_size, len(self), self.seed, epoch, self.rank, self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        """``epoch``'s batches as lists of indices, as torch's ``BatchSampler`` yields them."""
        plan = self.plan(self.epoch)
        return (plan.indices(b).tolist() for b in range(len(plan)))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OrderSampler:
    """The loader's own order one index at a time (``loader.sampler``), where torch has its
    ``SequentialSampler`` or ``RandomSampler``: ``len(loader.sampler)`` counts the samples this rank
    visits in an epoch, as a training loop dividing a summed loss by it expects. ``set_epoch`` chooses
    the loader's next epoch, where a trainer calls ``DistributedSampler.set_epoch`` (Lightning calls it
    on ``loader.sampler`` before each epoch)."""

    batches: BatchSampler
    epoch_setter: Callable[[int], None] | None = field(default=None, compare=False, repr=False)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the loader's next iteration runs (its shuffle order and transform seeds)."""
        if self.epoch_setter is None:
            raise LoaderError("this sampler is a copy of a loader's order and belongs to no loader: "
                                  "call set_epoch on the loader")
        self.epoch_setter(epoch)

    def __len__(self) -> int:
        return self.batches.samples

    def __iter__(self) -> Iterator[int]:
        return iter(self.batches.plan(self.batches.epoch).order.tolist())

    @property
    def samples(self) -> int:
        return self.batches.samples

    @property
    def padding(self) -> int:
        return self.batches.padding


@dataclass(frozen=True)
class SamplerBatches:
    """A user's ``sampler`` cut into batches (``loader.batch_sampler``), as torch wraps one in its ``BatchSampler``."""

    sampler: Any
    batch_size: int
    drop_last: bool

    def __iter__(self) -> Iterator[list[Any]]:
        return grouped(self.sampler, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        return num_batches(len(self.sampler), self.batch_size, self.drop_last)


class _GlobalBatchSeeds:
    """The batch transform's seed for batch ``b`` of a plan: keyed by the global batch
    ``b * world_size + rank``, so ranks augment differently and a single process's batch b is keyed by b.
    Shared by every kind of plan; the fields are each plan's own. ``seeded=False`` (no batch transform to
    take it) gives every task the seed 0: deriving one costs more than handing over a small batch."""

    seed: int
    epoch: int
    rank: int
    world_size: int
    seeded: bool

    def task_seed(self, b: int) -> int:
        """Task ``b``'s seed as its task carries it: ``transform_seed``, or 0 where no transform takes it."""
        return self.transform_seed(b) if self.seeded else 0

    def transform_seed(self, b: int) -> int:
        return batch_seed(self.seed, self.epoch, b * self.world_size + self.rank)

    def number(self, task: int) -> int:
        """The epoch's batch that task ``task`` makes, as errors and warnings name it (a resumed rest's tasks
        count from 0, its batches from where the epoch stopped)."""
        return task


@dataclass(frozen=True, eq=False)
class EpochPlan(_GlobalBatchSeeds):
    """One epoch's order (this rank's shard) plus its batching; ``indices(b)`` is a view, never a list."""

    order: np.ndarray
    batch_size: int
    batches: int
    seed: int = 0
    epoch: int = 0
    rank: int = 0
    world_size: int = 1
    seeded: bool = True

    def __len__(self) -> int:
        return self.batches

    def indices(self, b: int) -> np.ndarray:
        if not 0 <= b < self.batches:
            raise OutOfRangeError(f"batch {b} is outside this epoch's {self.batches} batches")
        return self.order[b * self.batch_size : (b + 1) * self.batch_size]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self.indices(b) for b in range(self.batches))

    stream = False

    def tasks(self) -> Iterator[PlanTask]:
        for b in range(self.batches):
            yield b, self.indices(b), self.task_seed(b)


# (batch index, its samples' keys or None, transform seed). Keys are an int64 array (the loader's own
# order, and a batch sampler's integer arrays: the fast path, read as Python ints) or the sampler's own
# objects, unchanged (ints, NumPy ints, tuples, lists, strings: whatever ``__getitem__`` takes).
PlanTask = tuple[int, np.ndarray | Sequence[Any] | None, int]


@dataclass(frozen=True, eq=False)
class SamplerPlan(_GlobalBatchSeeds):
    """One epoch of a user's ``batch_sampler`` (or ``sampler`` cut into batches), read as it is consumed.

    Each batch's keys reach ``__getitem__`` (or ``__getitems__``) as the sampler made them, as PyTorch
    passes them: a list or tuple stays itself, an integer array stays an array, anything else iterable
    becomes the list of its items. With batching off each task holds one key (a list of one).
    """

    batches: Iterable[Sequence[Any]]
    seed: int = 0
    epoch: int = 0
    rank: int = 0
    world_size: int = 1
    seeded: bool = True

    stream = False

    def tasks(self) -> Iterator[PlanTask]:
        for b, keys in enumerate(self.batches):
            yield b, as_keys(keys), self.task_seed(b)


def as_keys(keys: Any) -> np.ndarray | Sequence[Any]:
    """A batch sampler's batch as a task carries it (see ``SamplerPlan``)."""
    if type(keys) is list or type(keys) is tuple:
        return keys
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iu" and keys.ndim == 1:
        return keys
    return list(keys)


@dataclass(frozen=True, eq=False)
class StreamPlan(_GlobalBatchSeeds):
    """One epoch of an iterable-style dataset: task b asks for a stream's next batch, until all are exhausted."""

    seed: int = 0
    epoch: int = 0
    rank: int = 0
    world_size: int = 1
    seeded: bool = True

    stream = True

    def tasks(self) -> Iterator[PlanTask]:
        b = 0
        while True:
            yield b, None, self.task_seed(b)
            b += 1


Plan = EpochPlan | SamplerPlan | StreamPlan


def grouped(indices: Iterable[Any], batch_size: int | None, drop_last: bool) -> Iterator[list[Any]]:
    """A sampler's indices cut into lists of ``batch_size`` (of one index each when not batching)."""
    if batch_size is None:
        for i in indices:
            yield [i]
        return
    batch: list[Any] = []
    for i in indices:
        batch.append(i)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch and not drop_last:
        yield batch
