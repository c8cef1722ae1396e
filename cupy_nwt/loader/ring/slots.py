"""The ring's slots seen from the main process: which are free, and which epoch a filled one is for.

One ``SlotPool`` per ring owns both the free list and the generation counter. A slot is taken to
be filled (by a worker or the main process), handed out as a ``HostBatch``, and released once its
bytes are no longer needed. A new epoch bumps the generation, published in the ring's header:
workers skip tasks of an older one, and a result that comes back for one frees its slot instead of
being delivered. So an abandoned epoch costs no slot and never leaks a batch into the next.

The pool exists before its ring: the first batches of a loader are made before the layout is known
(they travel pickled), and the ring is attached once the first one has arrived.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ...errors import BatchTypeError, CupyNwtError, RunError
from .ring import Ring, SlotLayout
from .tree import Treedef

RETIRED = np.iinfo(np.int64).max  # no epoch will have this generation: workers skip all that is queued


@dataclass
class HostBatch:
    """A batch on the host: ``leaves`` are views into ring ``slot`` (or fresh arrays when slot is None).

    ``treedef`` and ``objects`` (the leaves that are not ring arrays) rebuild it with ``tree.join``;
    a None ``treedef`` means the ring layout's.
    """

    index: int
    slot: int | None
    rows: int
    leaves: list[np.ndarray]
    treedef: Treedef | None = None
    objects: list[Any] = field(default_factory=list)


class SlotPool:
    """The free slots of ``ring`` (taken oldest-released first) and the current generation.

    ``ring=None``: no slot yet (``attach`` gives the ring once the layout is known).
    """

    def __init__(self, ring: Ring | None) -> None:
        self.ring: Ring | None = None
        self.free: deque[int] = deque()
        self.generation = 0  # the current epoch's; only ``new_generation`` changes it
        self._views: dict[tuple[int, int], list[np.ndarray]] = {}  # (slot, rows) -> its field views, made once
        if ring is not None:
            self.attach(ring)

    def attach(self, ring: Ring) -> None:
        """Take ``ring``'s slots (all free) and publish the current generation in its header."""
        self.ring = ring
        self.free = deque(range(ring.slots))
        self._views = {}
        ring.generation = self.generation

    # -- generations

    def new_generation(self) -> int:
        """Start a new epoch: what is still queued or in flight for an older one will not be delivered."""
        self.generation += 1
        if self.ring is not None:
            self.ring.generation = self.generation
        return self.generation

    def retire(self) -> None:
        """No generation is current any more (the workers are stopping): queued tasks are skipped."""
        self._views = {}  # the views would keep the ring's mapping open past its close
        if self.ring is not None and not self.ring.closed:
            self.ring.generation = RETIRED

    def is_current(self, generation: int) -> bool:
        return generation == self.generation

    # -- slots

    def take(self) -> int | None:
        """A free slot to fill, or None when every slot is taken."""
        return self.free.popleft() if self.free else None

    def put_back(self, slot: int) -> None:
        """Undo a ``take`` whose slot was not filled after all: it is the next one taken."""
        self.free.appendleft(slot)

    def release(self, slot: int) -> None:
        """The batch in ``slot`` is no longer needed: the slot may be filled again."""
        self.free.append(slot)

    def accept(self, generation: int, slot: int) -> bool:
        """A filled slot came back: True when it is for the current generation (deliver it, then
        ``release``); a stale one is released here and must not be delivered."""
        if self.is_current(generation):
            return True
        self.release(slot)
        return False

    def batch(self, index: int, slot: int, rows: int, objects: list[Any] | None = None) -> HostBatch:
        """The batch that ``slot`` holds, as views of its first ``rows`` rows, with its other leaves.

        A slot's views are made once per row count and handed out again with each batch it holds
        (nobody changes the list or the views' flags: a caller gets copies, or read-only views of them).
        """
        ring = self.ring
        if ring is None:
            raise RunError("internal error: a slot was used before the ring was attached")
        views = self._views.get((slot, rows))
        if views is None:
            views = self._views[slot, rows] = ring.slot_views(slot, rows)
        return HostBatch(index, slot, rows, views, ring.layout.treedef, objects or [])

    def hold(self, index: int, leaves: Sequence[np.ndarray]) -> HostBatch:
        """Copy a batch made outside the ring into a free slot, as ``InlineSource(first=)`` takes it."""
        slot = self.take()
        if slot is None:
            raise RunError(f"internal error: no free ring slot to hold batch {index}")
        rows = len(leaves[0])
        try:
            hb = self.batch(index, slot, rows)
            for dst, src in zip(hb.leaves, leaves):
                np.copyto(dst, src)
        except BaseException:
            self.put_back(slot)
            raise
        return hb


@dataclass(frozen=True)
class RingSpec:
    """How a workshop's ring is made, by the epoch's source: data its owner fixes up front.

    ``max_rows`` is the largest batch the sampler can give (every slot holds one); ``batched`` says
    whether a field's leading axis is the batch's rows; ``slots(slot_bytes)`` is how many slots a ring of
    that slot size gets (the workers' prefetch, or online tuning's budget); ``known`` is the layout an
    earlier workshop's first batch showed (None: the next first batch shows it).
    """

    max_rows: int
    batched: bool
    slots: Callable[[int], int]
    known: SlotLayout | None = None

    def layout_of(self, hb: HostBatch) -> SlotLayout:
        """The layout of the first batch made, which every later batch that fits it shares."""
        if hb.treedef is None:
            raise RunError("internal error: a batch from a slot cannot show the layout")
        return SlotLayout.from_parts(hb.treedef, hb.leaves, self.max_rows, hb.rows if self.batched else None)


class FailedBatch(Exception):
    """A batch could not be made: ``take()`` gives why; the epoch goes on after it (PyTorch's contract).

    What a pool answers for a batch whose making raised, what a source raises in that batch's turn, and
    what the host path and the prefetcher hand on, in order with the batches around it.
    """

    def __init__(self, error: CupyNwtError, batch_index: int = -1) -> None:
        try:
            text = str(error)
        except Exception:  # noqa: BLE001 - a rebuilt user exception whose own __str__ fails: it is still raised
            text = type(error).__qualname__
        super().__init__(text)
        self._error: CupyNwtError | None = error
        self.batch_index = batch_index

    def take(self) -> CupyNwtError:
        """The error, for the iterator to raise, given once and not kept: raised, its traceback holds the
        caller's frames and so the iterator, whose generators still hold this batch until the next ``next()``;
        kept, that is a cycle, and a dropped iterator's workers would run on until the collector ran."""
        error, self._error = self._error, None
        if error is None:
            raise RunError("internal error: a failed batch's error was taken twice")
        return error


def unjoinable(exc: Exception, batch_index: int, number: int) -> FailedBatch:
    """A batch made whole that cannot be given in the framework it is joined as (a datetime64 field as a
    torch tensor): a ``TypeError`` for that batch alone, in its turn, as torch's collate raises it in its
    worker; the epoch goes on. ``number``: the epoch's batch, as the message names it."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    error = BatchTypeError(f"batch {number} could not be made into the arrays the loader gives: {text}; "
                           "output='numpy' or a collate_fn of your own gives it as it is")
    return FailedBatch(error, batch_index)


@runtime_checkable
class BatchSource(Protocol):
    """One epoch's host batches, each handed out once and released once (``FailedBatch`` raised in its turn)."""

    def next(self, block: bool) -> HostBatch | None:
        """The next batch; None when the epoch is over, or (``block=False``) when none is ready yet."""
        ...

    def release(self, hb: HostBatch) -> None:
        """``hb``'s ring slot may be filled again (nothing to do for a batch outside the ring)."""
        ...

    def close(self) -> None:
        """Give back what the source still holds; the epoch is over or abandoned."""
        ...

    def ring(self) -> Ring | None:
        """The ring the source's slots are in (None until the first batch has shown the layout)."""
        ...

    def number(self, task: int) -> int:
        """The epoch's batch that task ``task`` (a batch's ``index``) is, as errors and warnings name it."""
        ...
