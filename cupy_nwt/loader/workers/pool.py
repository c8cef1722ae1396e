"""What every worker kind shares, seen from the main process: which worker gets the next task, how an
answer becomes a result, and the surface the epoch's source and the runtime drive (``Workers``).

Each kind (``process``, ``thread``) subclasses ``Dispatch`` with how it starts a worker, hands it a
message and collects answers; ``kinds`` registers them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any, Protocol

import numpy as np

from ...errors import LoaderClosedError
from .._events import Listener, StageTimes
from .._reader_gate import HangUp
from ..ring.ring import Ring, SlotLayout
from ..ring.slots import FailedBatch, HostBatch, RingSpec, SlotPool
from .maker import make_worker_error
from .messages import (
    NO_SLOT,
    BadSample,
    BadSamples,
    Exhausted,
    FromWorker,
    InitFailed,
    Ok,
    Raised,
    StreamState,
    Whole,
)

SHUTDOWN_GRACE_S = 1.0
# The longest the main thread waits for workers in one system call. A signal the kernel hands to another
# thread (numpy's BLAS threads, say) runs its Python handler only once the main thread runs Python again:
# a wait with no end would keep a SIGTERM or a Ctrl-C waiting with it.
SIGNAL_SLICE_S = 0.1


def wait_slices(timeout: float | None) -> Iterator[float]:
    """The waits, each at most ``SIGNAL_SLICE_S``, that together last ``timeout`` s (None: without end).

    There is always one, of 0 s when ``timeout`` is 0 or less; the caller stops early once it has what it waits for.
    """
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    while True:
        left = SIGNAL_SLICE_S if deadline is None else min(SIGNAL_SLICE_S, max(0.0, deadline - time.monotonic()))
        yield left
        if deadline is not None and time.monotonic() >= deadline:
            return


@dataclass(frozen=True)
class Ended:
    """Worker ``worker_id``'s stream ran out: task ``batch_index`` has no batch, and no later task of it will."""

    batch_index: int
    worker_id: int


@dataclass(frozen=True)
class Noted:
    """Worker ``worker_id``'s dataset state right after it made stream task ``batch_index``."""

    batch_index: int
    worker_id: int
    state: Any


@dataclass(frozen=True)
class Bad:
    """Samples of batch ``batch_index`` left out because they failed to read or decode; ``dropped``: all
    of them, so that batch does not come."""

    batch_index: int
    worker_id: int
    samples: tuple[BadSample, ...]
    dropped: bool


Result = HostBatch | FailedBatch | Ended | Noted | Bad


@dataclass(frozen=True)
class WorkerKind:
    """One kind of worker, as the registry (``kinds``) knows it.

    ``start`` makes a pool (keywords: maker, num_workers, prefetch_factor, seed, worker_init_fn,
    context, device, epoch, rank, world_size, events, hung_up); ``processes``: its workers are processes of
    their own (a shared ring, pids, private memory); ``start_method(context, device)`` names how
    they start.
    """

    name: str
    start: Callable[..., Workers]
    processes: bool
    start_method: Callable[[BaseContext | None, str], str]


class Workers(Protocol):
    """What the epoch's source, online tuning and the runtime drive: a pool of any worker kind."""

    slots: SlotPool
    slot_cap: int | None
    active: int
    prefetch_factor: int
    last_worker: int | None
    number: Callable[[int], int]  # the epoch's batch of a task, as a failed batch's error names it

    @property
    def size(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def new_ring(self, layout: SlotLayout, slots: int) -> Ring:
        """A ring in memory these workers can write into (made once the layout is known)."""
        ...

    def attach(self, ring: Ring) -> None: ...

    def pids(self) -> list[int]: ...

    def submit(self, batch_index: int, indices: np.ndarray | Sequence[Any] | None, tseed: int, worker: int | None = None,
               *, spill: bool = False) -> bool: ...

    def collect(self, timeout: float | None) -> list[Result]: ...

    def idle_workers(self) -> int: ...

    def set_active(self, n: int) -> None: ...

    def worker_label(self, worker_id: int) -> str: ...

    def stuck_hint(self) -> str: ...

    def restore(self, per_worker: dict[int, tuple[Any, int, int | None, int | None]]) -> None: ...

    def shutdown(self) -> None: ...


def fit_ring(spec: RingSpec, layout: SlotLayout, workers: Workers | None, slots: SlotPool,
             events: Listener | None) -> Ring:
    """Make the ring for ``layout`` (``spec`` sizes it) and give it to ``workers``, or without workers to ``slots``.

    The epoch's source calls this, as it starts when the layout is known, else when the first batch arrives.
    The ``ring_made`` event tells online tuning the slot size (its memory budget is counted in slots of it).
    """
    ring = workers.new_ring(layout, spec.slots(layout.slot_bytes)) if workers is not None else \
        Ring(layout, spec.slots(layout.slot_bytes), shared=False)
    try:
        if workers is not None:
            workers.attach(ring)
        else:
            slots.attach(ring)
    except BaseException:
        if slots.ring is not ring:
            ring.close()
        raise
    if events is not None:
        events.ring_made(layout.slot_bytes, workers)
    return ring


class Dispatch:
    """Which worker gets the next task, shared by the process and the thread pool.

    Only the first ``active`` workers get tasks (online tuning parks the others, alive and idle);
    ``slot_cap`` bounds the ring slots taken at once (None: the whole ring); before the ring exists
    a worker takes one task at a time, without a slot. Subclasses keep ``_workers`` (each with
    ``id`` and ``outstanding``), ``slots`` and ``prefetch_factor``.
    """

    slots: SlotPool
    prefetch_factor: int
    hung_up: HangUp  # set when another thread closes the loader: a wait for answers stops (``_slices``)
    _workers: list[Any]
    _closed = False
    active = 0
    slot_cap: int | None = None
    events: Listener | None = None  # hears ``made`` for each answer that carries a batch's stage seconds
    last_worker: int | None = None  # the worker ``_choose`` picked last: who has a task (stall warnings)
    number: Callable[[int], int] = int  # the epoch's batch of a task: its source sets the plan's (``Plan.number``)

    def _slices(self, timeout: float | None) -> Iterator[float]:
        """``wait_slices(timeout)``, ended by ``LoaderClosedError`` once ``hung_up`` is set: a thread that waits
        for answers lets go of the pipes and queues within a slice, and the closing thread then stops the workers
        alone (the two must never read one pipe at once)."""
        for left in wait_slices(timeout):
            if self.hung_up.is_set():
                self.hung_up.answered.set()
                raise LoaderClosedError("this DataLoader was closed (by another thread or a signal handler) while this "
                                        "thread waited for a batch")
            yield left

    def worker_label(self, worker_id: int) -> str:
        """How a stall warning and a failed batch name a worker."""
        return f"loader worker {worker_id}"

    def stuck_hint(self) -> str:
        """The likely cause of a worker that does not answer, for a timeout or a stall."""
        return "the dataset is slow or blocked in __getitem__/__iter__"

    def _made(self, msg: FromWorker) -> None:
        if self.events is not None and isinstance(msg, (Ok, Whole)) and msg.times is not None:
            self.events.made(msg.times)

    def _answer(self, w: Any, pid: int, msg: FromWorker) -> Result | None:
        """A worker's answer to a task, the same for processes and threads: a batch to deliver, a
        failure to raise in turn, an ended stream, a reader's state, samples left out, or nothing (stale)."""
        if type(msg) is Ok:  # a batch in its slot: nearly every answer
            return self._in_slot(w, msg.generation, msg.batch_index, msg.slot, msg.rows, msg.objects, msg.times)
        if isinstance(msg, InitFailed):
            raise make_worker_error(msg.report, worker_id=w.id, pid=pid, batch_index=None, stage=msg.stage,
                                    where=self.worker_label(w.id))
        if isinstance(msg, StreamState):
            return Noted(msg.batch_index, w.id, msg.state) if self.slots.is_current(msg.generation) else None
        if isinstance(msg, BadSamples):
            if msg.dropped:  # the task's answer: no batch
                w.outstanding -= 1
                if msg.slot != NO_SLOT:
                    self.slots.release(msg.slot)
            current = self.slots.is_current(msg.generation)
            return Bad(msg.batch_index, w.id, msg.bad, msg.dropped) if current else None
        w.outstanding -= 1
        self._made(msg)
        slots = self.slots
        if isinstance(msg, Ok):
            if not slots.accept(msg.generation, msg.slot):
                return None  # made for an abandoned epoch: its slot is free again
            return slots.batch(msg.batch_index, msg.slot, msg.rows, msg.objects)
        if msg.slot != NO_SLOT:
            slots.release(msg.slot)
        if not slots.is_current(msg.generation):
            return None
        if isinstance(msg, Whole):
            treedef, arrays, objects = msg.parts
            return HostBatch(msg.batch_index, None, msg.rows, arrays, treedef, objects)
        if isinstance(msg, Exhausted):
            return Ended(msg.batch_index, w.id)
        if isinstance(msg, Raised):
            error = make_worker_error(msg.report, worker_id=w.id, pid=pid, batch_index=self.number(msg.batch_index),
                                      where=self.worker_label(w.id))
            return FailedBatch(error, msg.batch_index)
        return None

    def _in_slot(self, w: Any, generation: int, batch_index: int, slot: int, rows: int, objects: list | None,
                 times: StageTimes | None) -> HostBatch | None:
        """An ``Ok``'s fields (a process worker's arrive as a plain tuple): the batch, or None if stale."""
        w.outstanding -= 1
        if times is not None and self.events is not None:
            self.events.made(times)
        if generation != self.slots.generation:
            self.slots.release(slot)
            return None  # made for an abandoned epoch: its slot is free again
        return self.slots.batch(batch_index, slot, rows, objects)

    @property
    def size(self) -> int:
        return len(self._workers)

    def idle_workers(self) -> int:
        """Active workers with no task out."""
        return sum(w.outstanding == 0 for w in self._workers[:self.active])

    def submit(self, batch_index: int, indices: np.ndarray | Sequence[Any] | None, tseed: int, worker: int | None = None,
               *, spill: bool = False) -> bool:
        """Queue a batch on ``worker`` (or its own, see ``_choose``); False when no slot or capacity is free.

        ``spill`` (``in_order=False``) lets the batch go to the next active worker with room when its own
        has none, as torch deals batches out of order: a worker stuck on a slow sample holds back only
        the tasks it already has. Before the ring exists a worker takes one task at a time, without a slot.
        """
        if not self._workers or self._closed or (self.slots.ring is not None and not self.slots.free):
            return False
        w = self._choose(worker, batch_index, spill)
        if w is None:
            return False
        slot = self.slots.take() if self.slots.ring is not None else NO_SLOT
        assert slot is not None  # checked free by _choose
        try:
            self._deliver(w, self.slots.generation, batch_index, slot, indices, tseed)
        except BaseException:
            if slot != NO_SLOT:
                self.slots.put_back(slot)
            raise
        w.outstanding += 1
        return True

    def _deliver(self, w: Any, generation: int, batch_index: int, slot: int, indices: Any, tseed: int) -> None:
        """Hand a ``Task`` of these fields to worker ``w`` (a pipe for a process, a queue for a thread); its
        fields, not the object, so a pool that sends a plain tuple builds nothing else per batch."""
        raise NotImplementedError

    def _choose(self, worker: int | None, batch_index: int, spill: bool = False) -> Any:
        """The worker to take batch ``batch_index`` (``worker`` if given, else active worker
        ``batch_index % active``, as torch deals batches), or None when it has no capacity or no slot is free.

        The batch waits for its worker even when another is idle: which worker makes a batch is then
        fixed, so what ``__getitem__`` draws from its worker's seeded generator (``torch.rand``, a
        torchvision random transform) repeats from run to run, as under torch. With ``spill`` the next
        active workers after it are tried in turn."""
        ring, cap = self.slots.ring, self.slot_cap
        if ring is not None and (not self.slots.free or (cap is not None and ring.slots - len(self.slots.free) >= cap)):
            return None
        workers = self._workers
        started = len(workers)  # a pool may count workers it has not started yet (``size``): they take nothing
        n = min(self.active, self.size)
        first = batch_index % n if worker is None else worker
        per_worker = max(self.prefetch_factor, -(-cap // n)) if cap is not None else self.prefetch_factor
        limit = per_worker if ring is not None else 1
        w = workers[first] if first < started else None
        if w is None or w.outstanding >= limit:
            others = (workers[i] for k in range(1, n if spill else 1) if (i := (first + k) % n) < started)
            w = next((o for o in others if o.outstanding < limit), None)
            if w is None:
                return None
        self.last_worker = w.id
        return w

