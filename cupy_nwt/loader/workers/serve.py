"""The one serve loop every worker kind runs, behind a small channel protocol.

A worker serves messages in the order they come: a ring to write into, a stream's saved position
(``Restore``), a batch to make (``Task``), ``Stop``. It answers each task once (see ``messages``),
preceded by the reader's own state (``StreamState``) for a stream's task, or a map-style dataset's that keeps
one (``state_dict``/``load_state_dict``). What differs between kinds stays in their channel:
how a message arrives (a pipe watched together with the parent's sentinel, a queue), how a ring
message becomes a ring (attach by name, or the object itself), and what an answer that cannot
travel becomes. Workers never touch CUDA: nothing here imports CuPy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..ring.ring import Ring
from ..ring.tree import split
from .maker import AllBad, BatchMaker, InSlot, StreamEnd
from .messages import (
    NO_SLOT,
    BadSamples,
    ErrorReport,
    Exhausted,
    FromWorker,
    InitFailed,
    Ok,
    Raised,
    Restore,
    Skipped,
    Stop,
    StreamState,
    Task,
    Whole,
)


class Channel(Protocol):
    """A worker's two ends, as its kind provides them."""

    def receive(self) -> Any:
        """The next message (``Task``, ``Restore``, ``Stop`` or a ring message); None: the parent is gone."""
        ...

    def send(self, answer: FromWorker) -> None: ...

    def open_ring(self, msg: Any) -> Ring:
        """The ring a ring message names."""
        ...

    def close_ring(self, ring: Ring) -> None:
        """Done with ``ring`` (a newer one came, or the loop ends)."""
        ...


def serve_loop(channel: Channel, maker: BatchMaker, worker_id: int, worker_init_fn: Callable | None) -> None:
    """Run ``worker_init_fn``, then serve messages until ``Stop`` or the parent is gone."""
    ring: Ring | None = None
    views: dict[tuple[int, int], list[Any]] = {}  # (slot, rows) -> the ring's field views, made once per ring
    stream_generation: int | None = None
    try:
        if worker_init_fn is not None:
            try:
                worker_init_fn(worker_id)
            except Exception as exc:  # noqa: BLE001 - reported to the main process
                channel.send(InitFailed(ErrorReport.from_exception(exc, None)))
                return
        while True:
            msg = channel.receive()
            if msg is None or isinstance(msg, Stop):
                return
            if isinstance(msg, Restore):
                maker.restore(msg.state, msg.skip, msg.epoch, msg.pipe_seed)
                continue
            if not isinstance(msg, Task):
                if ring is not None:
                    channel.close_ring(ring)
                    ring = None
                ring, views = channel.open_ring(msg), {}
                continue
            if msg.indices is None and msg.generation != stream_generation:
                maker.begin_stream()  # a new epoch of this worker's replica of an iterable dataset
                stream_generation = msg.generation
            answer = serve(maker, ring, msg, views)
            if (msg.indices is None or maker.keeps_state) and not isinstance(answer, Skipped):
                channel.send(StreamState(msg.generation, msg.batch_index, reader_state_or_error(maker)))
            if maker.bad and not isinstance(answer, (BadSamples, Skipped)):  # samples left out of this batch
                channel.send(BadSamples(msg.generation, msg.batch_index, msg.slot, tuple(maker.bad)))
            channel.send(answer)
    finally:
        if ring is not None:
            channel.close_ring(ring)


def reader_state_or_error(maker: BatchMaker, opened: bool = False) -> Any:
    """The reader's own state (``BatchMaker.reader_state``; ``opened``: its stream opened first), or the error
    it raised as an :class:`ErrorReport`.

    A failing ``state_dict()`` must not cost the batch it follows, nor the worker: iteration goes
    on, and the loader's own ``state_dict()`` raises the error, since only saving needs the state.
    """
    try:
        return maker.opened_state() if opened else maker.reader_state()
    except Exception as exc:  # noqa: BLE001 - the dataset's error, reported when a state is saved
        return ErrorReport.from_exception(exc, None, keep_object=False)


def serve(maker: BatchMaker, ring: Ring | None, task: Task,
          views: dict[tuple[int, int], list[Any]] | None = None) -> FromWorker:
    """Make the task's batch, into its slot when it has one, unless its generation is no longer current.

    ``views`` keeps the slots' field views from one task to the next (they are the same every time).
    """
    if ring is not None and ring.generation != task.generation:
        return Skipped(task.generation, task.batch_index, task.slot)
    in_ring = ring is not None and task.slot != NO_SLOT
    cache = views if views is not None else {}

    def slot_views(rows: int) -> list[Any]:
        assert ring is not None
        got = cache.get((task.slot, rows))
        if got is None:
            got = cache[task.slot, rows] = ring.slot_views(task.slot, rows)
        return got

    try:
        made = maker.produce(task.indices, task.transform_seed, ring.layout if ring is not None else None,
                             slot_views if in_ring else None)
    except StreamEnd:
        return Exhausted(task.generation, task.batch_index, task.slot)
    except AllBad:
        return BadSamples(task.generation, task.batch_index, task.slot, tuple(maker.bad), dropped=True)
    except Exception as exc:  # noqa: BLE001 - reported to the main process
        report = ErrorReport.from_exception(exc, maker.failed_index(exc))
        return Raised(task.generation, task.batch_index, task.slot, report)
    if isinstance(made, InSlot):
        return Ok(task.generation, task.batch_index, task.slot, made.rows, made.objects or None, maker.times)
    return Whole(task.generation, task.batch_index, task.slot, made.rows, split(made.batch), maker.times)
