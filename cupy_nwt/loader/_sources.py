"""Where an epoch's host batches come from: the main process (``num_workers=0``) or the workers.

Both meet the ``BatchSource`` contract that the loader's host path and the device prefetcher drive:
``next`` hands out the next batch (or None when the epoch is over, or when nothing is ready and
``block`` is False), ``release`` gives its ring slot back once its bytes are no longer needed, and
``close`` returns whatever the source still holds. A batch the main process already made (the
first one, which fixed the layout) comes in as ``first`` and is handed out like any other.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Protocol, runtime_checkable

import numpy as np

from ._messages import ErrorReport
from ._ring import Ring, SlotLayout
from ._sampler import EpochPlan
from ._slots import HostBatch, SlotPool
from ._workers import BatchMaker, Failed, LoaderError, LoaderTimeoutError, WorkerPool, make_worker_error


@runtime_checkable
class BatchSource(Protocol):
    """One epoch's host batches, each handed out once and released once."""

    def next(self, block: bool) -> HostBatch | None:
        """The next batch; None when the epoch is over, or (``block=False``) when none is ready yet."""
        ...

    def release(self, hb: HostBatch) -> None:
        """``hb``'s ring slot may be filled again (nothing to do for a batch outside the ring)."""
        ...

    def close(self) -> None:
        """Give back what the source still holds; the epoch is over or abandoned."""
        ...


def inline_error(exc: Exception, maker: BatchMaker, batch_index: int) -> LoaderError:
    """A batch made in the main process failed: the same error a worker would report, chained directly."""
    report = ErrorReport.from_exception(exc, maker.failed_index(exc), keep_object=False)
    err = make_worker_error(report, worker_id=None, pid=os.getpid(), batch_index=batch_index)
    err.__cause__ = exc
    return err


class InlineSource(BatchSource):
    """``num_workers=0``: batches made in the main process, into the ring when there is one.

    ``slots`` is the ring's pool; alone (no pool given), the source makes its own over ``ring``.
    """

    def __init__(self, maker: BatchMaker, plan: EpochPlan, layout: SlotLayout, ring: Ring | None,
                 slots: SlotPool | None = None, *, first: HostBatch | None = None) -> None:
        self.maker, self.plan, self.layout = maker, plan, layout
        self.slots = slots if slots is not None or ring is None else SlotPool(ring)
        self.first = first
        self.b = 0

    @property
    def free(self) -> deque[int]:
        """The ring's free slots (none without a ring)."""
        return self.slots.free if self.slots is not None else deque()

    def next(self, block: bool) -> HostBatch | None:
        b = self.b
        if b >= len(self.plan):
            return None
        if self.first is not None and self.first.index == b:
            hb, self.first = self.first, None
            self.b += 1
            return hb
        indices = self.plan.indices(b)
        rows = len(indices)
        if self.slots is None:
            leaves = self._make(b, indices)
            self.b += 1
            return HostBatch(b, None, rows, leaves)
        slot = self.slots.take()
        if slot is None:
            if block:
                raise LoaderError("internal error: no free ring slot for the main process to fill")
            return None
        try:
            hb = self.slots.batch(b, slot, rows)
            try:
                self.maker.fill(indices, self.plan.transform_seed(b), self.layout, hb.leaves, b)
            except Exception as exc:  # noqa: BLE001 - rewrapped with the batch and sample index
                raise inline_error(exc, self.maker, b) from exc
        except BaseException:
            self.slots.give_back(slot)
            raise
        self.b += 1
        return hb

    def _make(self, b: int, indices: np.ndarray) -> list[np.ndarray]:
        try:
            return self.maker.make_checked(indices, self.plan.transform_seed(b), self.layout, b)
        except Exception as exc:  # noqa: BLE001
            raise inline_error(exc, self.maker, b) from exc

    def release(self, hb: HostBatch) -> None:
        if hb.slot is not None and self.slots is not None:
            self.slots.release(hb.slot)

    def close(self) -> None:
        first, self.first = self.first, None
        if first is not None:
            self.release(first)


class WorkerSource(BatchSource):
    """``num_workers>0``: keeps every worker busy, and hands batches out in order (or as they come)."""

    def __init__(self, workers: WorkerPool, plan: EpochPlan, in_order: bool, timeout: float | None,
                 *, first: HostBatch | None = None) -> None:
        if workers.slots is None:
            raise LoaderError("internal error: the workers have no ring to fill")
        self.workers, self.slots, self.plan, self.epoch = workers, workers.slots, plan, plan.epoch
        self.in_order, self.timeout = in_order, timeout
        self.slots.new_generation()
        self.ready: dict[int, HostBatch | Failed] = {}
        self.next_submit = 0
        self.next_deliver = 0
        self.delivered = 0
        if first is not None:
            self.ready[first.index] = first
            self.next_submit = first.index + 1

    def _submit(self) -> None:
        n = len(self.plan)
        while self.next_submit < n:
            b = self.next_submit
            if not self.workers.submit(b, self.plan.indices(b), self.plan.transform_seed(b)):
                return
            self.next_submit += 1

    def _pick(self) -> int | None:
        if self.in_order:
            return self.next_deliver if self.next_deliver in self.ready else None
        return min(self.ready) if self.ready else None

    def _absorb(self, items: list[HostBatch | Failed]) -> None:
        for item in items:
            self.ready[item.index if isinstance(item, HostBatch) else item.batch_index] = item

    def next(self, block: bool) -> HostBatch | None:
        deadline = None
        while True:
            self._submit()
            b = self._pick()
            if b is not None:
                item = self.ready.pop(b)
                if isinstance(item, Failed):
                    raise item.error
                self.delivered += 1
                self.next_deliver += self.in_order
                return item
            if self.delivered >= len(self.plan):
                return None
            if not block:
                items = self.workers.collect(0)
                self._absorb(items)
                if not items:
                    return None
                continue
            if self.timeout is None:
                self._absorb(self.workers.collect(None))
                continue
            now = time.monotonic()
            deadline = deadline if deadline is not None else now + self.timeout
            if now >= deadline:
                want = f"batch {self.next_deliver}" if self.in_order else "any batch"
                raise LoaderTimeoutError(
                    f"no batch from the workers within timeout={self.timeout} s (waiting for {want} of "
                    f"epoch {self.epoch}); the dataset may be too slow or blocked"
                )
            self._absorb(self.workers.collect(deadline - now))

    def release(self, hb: HostBatch) -> None:
        if hb.slot is not None:
            self.slots.release(hb.slot)

    def close(self) -> None:
        """Return the slots of finished but undelivered batches; queued tasks are dropped by generation."""
        for item in self.ready.values():
            if isinstance(item, HostBatch):
                self.release(item)
        self.ready.clear()
