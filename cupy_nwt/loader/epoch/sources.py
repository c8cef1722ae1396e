"""Where an epoch's host batches come from: the main process (``num_workers=0``) or the workers.

Both meet the ``BatchSource`` contract that the loader's host path and the device prefetcher drive:
``next`` hands out the next batch (or None when the epoch is over, or when nothing is ready and
``block`` is False), ``release`` gives its ring slot back once its bytes are no longer needed, and
``close`` returns whatever the source still holds. A batch that could not be made raises
``FailedBatch`` in its turn; the source stays usable, and the next call goes on with the next batch.
A wait past ``timeout`` raises ``TimedOut``: no turn is taken, and the next call waits for that batch
again (as torch's iterator does after its timeout error). Both work through a plan's tasks
(``plan.order``) and, when the ring does not exist yet, make it from the first batch made
(``workers.pool.fit_ring``, as the workshop's ``RingSpec`` says).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice

from ...errors import LoaderError, LoaderTimeoutError
from .._events import Events, Listener, Stall
from ..checkpoint.ledger import Ledger
from ..plan.order import Plan, PlanTask
from ..ring.ring import Ring
from ..ring.slots import BatchSource, FailedBatch, HostBatch, RingSpec, SlotPool
from ..ring.tree import split
from ..workers.maker import AllBad, BatchMaker, InSlot, StreamEnd, make_worker_error
from ..workers.messages import ErrorReport
from ..workers.pool import Bad, Ended, Noted, Result, Workers, fit_ring
from ..workers.serve import reader_state_or_error
from .bad_samples import BadSampleCount


class TimedOut(FailedBatch):
    """No batch came within ``timeout``: the caller gets ``error``, and no turn is taken (the batch is
    still the next one, so neither the epoch's progress nor a saved state moves past it)."""


def inline_error(exc: Exception, maker: BatchMaker, batch_index: int) -> LoaderError:
    """A batch made in the main process failed: the same error a worker would report, chained directly."""
    report = ErrorReport.from_exception(exc, maker.failed_index(exc), keep_object=False)
    err = make_worker_error(report, worker_id=None, pid=os.getpid(), batch_index=batch_index, original=type(exc))
    err.__cause__ = exc
    return err


class InlineSource(BatchSource):
    """``num_workers=0``: batches made in the main process, into the ring when there is one.

    ``slots`` is the ring's pool; alone (no pool given), the source makes its own over ``ring``.
    A batch made before the ring exists (or that does not fit it) is handed out as it is; with
    ``spec``, the ring is made into ``slots`` from the layout it knows, else from the first batch.
    """

    def __init__(self, maker: BatchMaker, plan: Plan, ring: Ring | None, slots: SlotPool | None = None, *,
                 first: HostBatch | None = None, spec: RingSpec | None = None, events: Listener | None = None,
                 ledger: Ledger | None = None, begun: bool = False, bad: BadSampleCount | None = None) -> None:
        self.maker, self.plan, self.events, self.bad = maker, plan, events, bad
        self.slots = slots if slots is not None or ring is None else SlotPool(ring)
        self.first = first
        self.spec = spec
        if spec is not None and spec.known is not None and self.slots is not None and self.slots.ring is None:
            fit_ring(spec, spec.known, None, self.slots, events)
        self.tasks: Iterator[PlanTask] = plan.tasks()
        self.pending: PlanTask | None = None
        self.done = False
        self.ledger = ledger  # what was handed out, for the epoch's progress
        if plan.stream and not begun:  # (``begun``: the epoch began the maker's stream already)
            maker.begin_stream()

    def ring(self) -> Ring | None:
        return self.slots.ring if self.slots is not None else None

    @property
    def free(self) -> deque[int]:
        """The ring's free slots (none without a ring)."""
        return self.slots.free if self.slots is not None else deque()

    def next(self, block: bool) -> HostBatch | None:
        if self.first is not None:
            held, self.first = self.first, None
            next(self.tasks, None)  # its task is done
            return held
        while True:
            if self.pending is None and not self.done:
                self.pending = next(self.tasks, None)
            if self.pending is None:
                self.done = True
                return None
            ring = self.slots.ring if self.slots is not None else None
            slot = None
            if ring is not None:
                assert self.slots is not None
                slot = self.slots.take()
                if slot is None:
                    if block:
                        raise LoaderError("internal error: no free ring slot for the main process to fill")
                    return None
            task, self.pending = self.pending, None
            try:
                hb = self._make(task, ring, slot)
            except AllBad:  # every sample left out: no batch, on to the next task
                if slot is not None and self.slots is not None:
                    self.slots.put_back(slot)
                self._left_out(task[0])
                continue
            except BaseException as exc:
                if slot is not None and self.slots is not None:
                    self.slots.put_back(slot)
                if isinstance(exc, FailedBatch):
                    self._hand(task[0])
                raise
            if hb is not None:
                self._hand(hb.index)
            if (hb is None or hb.slot is None) and slot is not None and self.slots is not None:
                self.slots.put_back(slot)
            return hb

    def _left_out(self, b: int) -> None:
        if self.bad is not None and self.maker.bad:
            self.bad.add(self.plan.number(b), self.maker.bad)

    def number(self, task: int) -> int:
        return self.plan.number(task)

    def _hand(self, b: int) -> None:
        if self.ledger is not None:
            if self.plan.stream or self.maker.keeps_state:
                self.ledger.note(b, 0, reader_state_or_error(self.maker))
            self.ledger.hand(b)

    def _make(self, task: PlanTask, ring: Ring | None, slot: int | None) -> HostBatch | None:
        b, indices, seed = task
        views = (lambda rows: ring.slot_views(slot, rows)) if ring is not None and slot is not None else None
        try:
            made = self.maker.produce(indices, seed, ring.layout if ring is not None else None, views)
        except StreamEnd:
            self.done = True
            return None
        except AllBad:
            raise
        except Exception as exc:  # noqa: BLE001 - rewrapped with the batch and sample index
            raise FailedBatch(inline_error(exc, self.maker, self.plan.number(b)), b) from None
        if self.maker.bad:
            self._left_out(b)
        if self.events is not None:
            self.events.made(self.maker.times)
        if isinstance(made, InSlot):
            assert self.slots is not None and slot is not None
            return self.slots.batch(b, slot, made.rows, made.objects)
        treedef, arrays, objects = split(made.batch)
        hb = HostBatch(b, None, made.rows, arrays, treedef, objects)
        if ring is None and self.spec is not None and self.slots is not None:
            fit_ring(self.spec, self.spec.layout_of(hb), None, self.slots, self.events)
        return hb

    def release(self, hb: HostBatch) -> None:
        if hb.slot is not None and self.slots is not None:
            self.slots.release(hb.slot)

    def close(self) -> None:
        first, self.first = self.first, None
        if first is not None:
            self.release(first)


class WorkerSource(BatchSource):
    """``num_workers>0``: keeps every worker busy, and hands batches out in order (or as they come).

    Map-style batch b goes to active worker b % active (a resumed rest's, to the worker its batch had in
    the uninterrupted epoch: ``deal``), and a stream's tasks go to the workers round-robin, as PyTorch
    deals them (so which worker makes batch b is fixed); a worker whose stream ran out gets no more, and
    the epoch ends when every worker's has.

    Each ``next()`` is an ``asked`` event first (online tuning samples the workers there). One that
    has waited ``stall_s`` seconds is a ``stalled`` event, once, naming the batch it waits for and the
    worker it went to (recorded at submit), and goes on waiting. ``blocked_s`` sums the time
    ``next()`` spent blocked for a batch not yet made (each stretch a ``blocked`` event): the workers
    falling behind, as opposed to the loader handling a ready batch (or the caller's process waiting
    for a CPU while it does).
    """

    def __init__(self, workers: Workers, plan: Plan, in_order: bool, timeout: float | None,
                 *, spec: RingSpec | None = None, events: Events | None = None, stall_s: float | None = None,
                 clock: Callable[[], float] = time.perf_counter, ledger: Ledger | None = None,
                 cursor: int = 0, shared: bool = False, deal: Callable[[int], int] | None = None,
                 bad: BadSampleCount | None = None) -> None:
        self.workers, self.slots, self.plan, self.epoch = workers, workers.slots, plan, plan.epoch
        self.stream = plan.stream
        self.events, self.clock = events, clock
        self.in_order, self.timeout, self.spec = in_order, timeout, spec
        if spec is not None and spec.known is not None and self.slots.ring is None:
            fit_ring(spec, spec.known, workers, self.slots, events)
        self.asking = events is not None and events.hears_asked
        self.stall_s: float | None = stall_s if events is not None else None
        self.owner: dict[int, int | None] = {}  # batch index -> the worker its task went to
        self.slots.new_generation()
        workers.number = plan.number
        self.tasks: Iterator[PlanTask] = plan.tasks()
        self.pending: PlanTask | None = None
        self.ready: dict[int, HostBatch | FailedBatch] = {}
        self.skipped: set[int] = set()
        self.alive = [True] * workers.size  # per worker: may its stream have batches left
        self.cursor = cursor  # a stream's next task goes to the first alive worker from here, cyclically
        self.submitted = 0
        self.resolved = 0  # tasks answered: delivered, failed, or without a batch
        self.next_deliver = 0
        self.planned_all = False
        self.ledger = ledger  # what was handed out, for the epoch's progress
        self.shared = shared  # the workers read one dataset object: its states are one reader's (0)
        self.deal = deal  # task -> the epoch's batch, whose worker (batch % workers) makes it: a resumed rest's
        self.blocked_s = 0.0
        self.bad = bad
        self.bad_waiting: dict[int, Bad] = {}  # in order: a batch's left-out samples, counted in its turn

    def _submit(self) -> None:
        """Hand out tasks while the workers take them. Called several times a batch, mostly with every slot taken:
        that refusal (``Dispatch.submit``'s first) is read here, without a call, once the next task is known."""
        slots, stream = self.slots, self.stream
        while not self.planned_all:
            if self.pending is None:
                self.pending = next(self.tasks, None)
            turn = self._stream_turn() if stream else None
            if self.pending is None or (stream and not turn):
                self.planned_all, self.pending = True, None
                return
            if not slots.free and slots.ring is not None:
                return
            b, indices, seed = self.pending
            if turn is not None:
                for worker in turn:
                    if self.workers.submit(b, indices, seed, worker):
                        break
                else:
                    return
                self.cursor = worker + 1
            elif not self.workers.submit(b, indices, seed, None if self.deal is None else self._worker_for(b),
                                         spill=not self.in_order):
                return
            self.owner[b] = self.workers.last_worker
            self.pending = None
            self.submitted += 1

    def _worker_for(self, b: int) -> int:
        """The worker of map-style task ``b`` when there is a ``deal``: the one its batch has in the uninterrupted epoch."""
        assert self.deal is not None
        return self.deal(b) % max(1, min(self.workers.active, self.workers.size))

    def _stream_turn(self) -> list[int]:
        """The workers whose streams may take the next task, in turn from the cursor: the first only in
        order; out of order the others after it too, so a slow stream holds back only its own tasks."""
        n = len(self.alive)
        alive = (w % n for w in range(self.cursor, self.cursor + n) if self.alive[w % n])
        return list(alive) if not self.in_order else list(islice(alive, 1))

    def _pick(self) -> int | None:
        if not self.in_order:
            return min(self.ready) if self.ready else None
        while self.next_deliver in self.skipped:
            self.skipped.discard(self.next_deliver)
            self._count_bad(self.next_deliver)
            self.next_deliver += 1
        return self.next_deliver if self.next_deliver in self.ready else None

    def _count_bad(self, b: int) -> None:
        """Batch ``b``'s turn: its left-out samples are announced and counted (raises past the limit)."""
        item = self.bad_waiting.pop(b, None)
        if item is not None and self.bad is not None:
            self.bad.add(self.plan.number(b), item.samples)

    def _absorb(self, items: list[Result]) -> None:
        too_many: Exception | None = None
        for item in items:
            if type(item) is HostBatch and item.slot is not None:  # a batch in its slot: nearly every item
                self.ready[item.index] = item
                continue
            if isinstance(item, Bad):
                if item.dropped:  # no batch comes for it (and none is handed: a saved state still has it to come)
                    self.resolved += 1
                    self.owner.pop(item.batch_index, None)
                    if self.in_order:
                        self.skipped.add(item.batch_index)
                if self.in_order:
                    self.bad_waiting[item.batch_index] = item
                elif self.bad is not None:
                    try:
                        self.bad.add(self.plan.number(item.batch_index), item.samples)
                    except Exception as exc:  # noqa: BLE001 - raised once every result here is taken in
                        too_many = too_many or exc
                continue
            if isinstance(item, Noted):
                if self.ledger is not None:
                    self.ledger.note(item.batch_index, 0 if self.shared else item.worker_id, item.state)
                continue
            if isinstance(item, Ended):
                if self.ledger is not None:
                    self.ledger.end(item.batch_index)
                self.resolved += 1
                self.skipped.add(item.batch_index)
                self.alive[item.worker_id] = False
                continue
            if isinstance(item, HostBatch) and item.slot is None and self.slots.ring is None and self.spec is not None:
                fit_ring(self.spec, self.spec.layout_of(item), self.workers, self.slots, self.events)
            self.ready[item.index if isinstance(item, HostBatch) else item.batch_index] = item
        if too_many is not None:
            raise too_many

    def ring(self) -> Ring | None:
        return self.slots.ring

    def number(self, task: int) -> int:
        return self.plan.number(task)

    def poll(self) -> None:
        """Take in the results that have arrived, without waiting."""
        self._absorb(self.workers.collect(0))

    def idle_workers(self) -> int:
        """Active workers that have answered all their tasks, while the epoch has more to give (else 0)."""
        return 0 if self.planned_all else self.workers.idle_workers()

    def _stall(self, waited: float) -> None:
        assert self.events is not None
        b = self._pick_waited()
        w = self.owner.get(b) if b is not None else None
        where = (self.workers.worker_label(w) + " has" if w is not None else
                 "no worker has yet (every ring slot or worker is taken)" if b is not None else "the workers make")
        where += f" ({self.workers.stuck_hint()})"
        self.events.stalled(Stall(self.epoch, self.plan.number(b) if b is not None else None, w, where, waited))

    def _pick_waited(self) -> int | None:
        """The batch a blocked in-order ``next()`` waits for (None out of order: any will do)."""
        return self.next_deliver if self.in_order else None

    def _wait(self, deadline: float | None, started: float, stalled: bool) -> float | None:
        """How long the next collect may block: until the deadline, or the stall threshold first."""
        limit = None if deadline is None else max(0.0, deadline - time.monotonic())
        if self.stall_s is not None and not stalled:
            until = max(0.0, started + self.stall_s - time.monotonic())
            limit = until if limit is None else min(limit, until)
        return limit

    def next(self, block: bool) -> HostBatch | None:
        if self.asking:
            assert self.events is not None
            self.events.asked(self.epoch, self)
        deadline: float | None = None
        started: float | None = None  # the clock starts when it first has to wait: a ready batch reads none
        stalled = False
        while True:
            if (block and not stalled and self.stall_s is not None and started is not None
                    and time.monotonic() - started >= self.stall_s):
                stalled = True
                self._stall(time.monotonic() - started)
            self._submit()
            b = self.next_deliver if self.in_order and not self.skipped else self._pick()  # the usual case inline
            if b is not None and b in self.ready:
                item = self.ready.pop(b)
                self.owner.pop(b, None)
                if self.bad_waiting:
                    try:
                        self._count_bad(b)
                    except BaseException:
                        if isinstance(item, HostBatch):
                            self.release(item)
                        raise
                self.resolved += 1
                self.next_deliver += self.in_order
                if self.ledger is not None:
                    self.ledger.hand(b)
                if isinstance(item, FailedBatch):
                    raise item
                return item
            if self.planned_all and self.resolved >= self.submitted:
                return None
            if not block:
                items = self.workers.collect(0)
                self._absorb(items)
                if not items:
                    return None
                continue
            now = time.monotonic()
            started = now if started is None else started
            if not self.timeout:
                self._blocking_collect(self._wait(None, started, stalled))
                continue
            deadline = deadline if deadline is not None else now + self.timeout
            if now >= deadline:
                want = f"batch {self.plan.number(self.next_deliver)}" if self.in_order else "any batch"
                raise TimedOut(LoaderTimeoutError(
                    f"DataLoader timed out after {self.timeout:g} seconds. cupy_nwt: "
                    f"no batch from the workers within timeout={self.timeout} s (waiting for {want} of "
                    f"epoch {self.epoch}; a later next() waits again): {self.workers.stuck_hint()}"
                ))
            self._blocking_collect(self._wait(deadline, started, stalled))

    def _blocking_collect(self, limit: float | None) -> None:
        t0 = self.clock()
        try:
            self._absorb(self.workers.collect(limit))
        finally:
            blocked = self.clock() - t0
            self.blocked_s += blocked
            if self.events is not None:
                self.events.blocked(blocked)

    def release(self, hb: HostBatch) -> None:
        """Give the batch's slot back and hand it the next task at once, as torch puts the next index as it
        returns a batch: the workers stay ``prefetch_factor`` ahead while the caller computes, not one short
        until the next ``next()`` (JAX's tutorial, whose jitted step runs beside the workers, lost a third)."""
        if hb.slot is not None:
            self.slots.release(hb.slot)
            self._submit()

    def close(self) -> None:
        """Return the slots of finished but undelivered batches; queued tasks are dropped by generation."""
        for item in self.ready.values():
            if isinstance(item, HostBatch) and item.slot is not None:
                self.slots.release(item.slot)
        self.ready.clear()
        self.workers.number = int  # persistent workers outlive the epoch: its plan (its order) is let go

