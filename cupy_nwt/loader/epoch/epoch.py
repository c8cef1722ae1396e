"""One epoch as the caller sees it: the iterator ``iter(loader)`` returns, the steps that run it, and
host batches turned into what it yields.

``Epoch`` is the only writer of its plan, its source's ledger and its counters: the turns handed
out (a failed batch counts too: its turn has passed) and the seconds the caller spent inside
``next()``. ``progress()`` gives them as a frozen record; resume and the figures read that, and the
counters reach stats and online tuning as events (``waited``, ``first_batch``, ``ended``).
The steps run on the runtime (``_runtime``): the shared workshop or one of their own, the ring once
the first batch fixes the layout, the prefetcher on the GPU.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ...errors import LoaderClosedError, LoaderError, TooManyBadSamplesError
from .._events import Listener
from .._reader_gate import park_if_exiting
from .._runtime import batch_maker
from ..checkpoint.ledger import EpochProgress, Ledger
from ..checkpoint.readers import entry, restore_plan, shared_reader
from ..checkpoint.resume import dealer, kind_of, ledger_for, make_plan, stream_cursor
from ..device.place import on_device, readonly
from ..ring.ring import Ring
from ..ring.slots import BatchSource, FailedBatch, unjoinable
from ..ring.tree import OutputTree, join, leaf_frameworks
from ..workers.maker import BatchMaker
from ..workers.serve import reader_state_or_error
from .bad_samples import BadSampleCount
from .sources import InlineSource, TimedOut, WorkerSource

if TYPE_CHECKING:
    from .._options import Options
    from .._runtime import Runtime, Workshop

T_co = TypeVar("T_co", covariant=True)


@dataclass(eq=False)
class EpochState:
    """An epoch's own bookkeeping, written here only (by the iterator and its steps). It outlives the
    iterator: a ``for`` loop left by ``break``, an exception or Ctrl-C drops its iterator, and
    ``state_dict()`` taken afterwards must still know where the caller stood."""

    kind: str
    epoch: int
    start: Mapping[str, Any] | None
    plan: Any = None
    ledger: Ledger | None = None
    sampler_state: Any = None
    finished: bool = False
    delivered: int = 0
    waited_s: float = 0.0
    readers: list[Any] | None = None  # each reader's entry as the epoch begins (``readers``)
    maker: BatchMaker | None = None  # the main process's, with num_workers=0: its state is read as of now
    previous: Mapping[str, Any] | None = None  # a user sampler's position its last iteration left (``resume``)

    def progress(self) -> EpochProgress:
        """Where this epoch stands, as a frozen record (what ``state_dict()`` saves is made from it)."""
        handed = tuple(self.ledger.handed[:self.delivered]) if self.ledger is not None else ()
        streams = self.ledger.workers(len(handed)) if self.ledger is not None else None
        maker = self.maker
        live = (lambda: reader_state_or_error(maker, opened=True)) if maker is not None else None
        return EpochProgress(self.kind, self.epoch, self.start, self.plan, handed, self.sampler_state, streams,
                             self.delivered, self.waited_s, self.finished, self.readers,
                             self.ledger.latest() if self.ledger is not None else {}, live, self.previous)


# what ends an iteration and says so itself: any other error that ends it is said again at the next call
_SAYS_IT_ENDED = (StopIteration, LoaderClosedError, TooManyBadSamplesError)


def _raise_alone(error: BaseException) -> NoReturn:
    """Raise ``error`` from a frame that lets go of it. The traceback holds every frame it passes: one that
    also held the error would be a cycle keeping the caller's frames, and a dropped iterator with its workers
    and slots, until the cyclic collector ran."""
    try:
        raise error
    finally:
        del error


class Epoch(Iterator[T_co]):
    """One epoch's batches. A batch that failed raises its ``WorkerError`` in its turn and the next
    ``next()`` goes on with the following batch, as PyTorch's iterator does; any other error ends it.

    Nothing runs until the first ``next()``: ``on_first`` (the loader's) then ``bind``s the options, epoch
    and loaded state, so an iterator that is made and dropped changes nothing.
    ``start`` is a loaded state this epoch resumes from; ``readers`` (``bind``'s), without one, each reader's
    entry as the epoch begins (``readers.carried``: persistent workers' from the epoch before); ``shared``: it
    runs on the runtime's shared workshop (persistent workers, or the GPU path), else on a workshop of its own. ``owner`` (the loader)
    is kept alive while the iterator is, as PyTorch's iterator keeps its loader: the loader's
    finalizer, which frees persistent workers and their ring, runs once the last of the two goes,
    and never under a running epoch. A dropped iterator ends its epoch first (``__del__``). Threads that
    share one iterator take its batches in turn, each batch once (torch's iterator is not safe so).
    """

    def __init__(self, options: Options, runtime: Runtime, epoch: int, start: Mapping[str, Any] | None,
                 shared: bool, owner: object = None, reported_len: int | None = None,
                 on_first: Callable[[Epoch[T_co]], None] | None = None) -> None:
        self._owner = owner
        self._options, self._runtime, self._shared, self._reported_len = options, runtime, shared, reported_len
        self._state = EpochState(kind_of(options), epoch, start)
        self._events, self._clock, self._pids = runtime.events, runtime.clock, runtime.worker_pids
        self._on_first = on_first
        self._steps: Generator[Any, None, None] | None = None
        self.early = False  # begun by a state_dict() before its first next()
        self._ended_by: str | None = None  # the error that ended the steps mid-epoch (a signal handler's, say)
        self._turn = threading.Lock()  # one next() at a time: several threads may share one iterator
        self._close_asked = [False]  # a close asked for while a next() was under way: done as that call returns
        # one end at a time: a loader's close (another thread's) and the reader dropping this iterator may meet
        self._ending = threading.RLock()
        self._pid = os.getpid()  # a forked child holds a copy, whose workers and ring are this process's

    def bind(self, options: Options, epoch: int, start: Mapping[str, Any] | None, shared: bool,
             readers: list[Any] | None = None, previous: Mapping[str, Any] | None = None) -> None:
        """Fix what this iterator runs: called by ``on_first`` as the first batch is asked for, so an
        ``iter()`` that takes no batch (Lightning's check that a loader is iterable) uses up no epoch.
        ``previous``: the position a user sampler's last iteration left, which a state saved before this
        epoch's first batch holds (``resume.previous_position``)."""
        if self._steps is not None:
            raise LoaderError("internal error: an epoch bound after its first batch was asked for")
        self._options, self._shared = options, shared
        self._state = EpochState(kind_of(options), epoch, start, readers=start["workers"] if start is not None else readers,
                                 previous=previous)
        if options.num_workers == 0:  # the main process's reader, restored before its first sample
            maker = self._state.maker = batch_maker(options)
            if options.sampling.style == "iterable":
                maker.begin_stream()
            restore = restore_plan(options, epoch, start["workers"] if start is not None else None)
            if 0 in restore:
                maker.restore(*restore[0])
                if options.sampling.style != "iterable":  # now, not at a first sample an empty rest never reads
                    maker.load_pending()
        steps = _steps(options, self._runtime, self._state, shared)  # holds the state, never this iterator
        if self._reported_len is not None:
            steps = _past_length(steps, self._reported_len, options)
        self._steps = steps
        _live.add(self)

    @property
    def delivered(self) -> int:
        """Turns taken so far (batches and failed batches)."""
        return self._state.delivered

    @property
    def waited_s(self) -> float:
        """The time the caller has spent inside ``next()``, that is, waiting for data."""
        return self._state.waited_s

    @property
    def state(self) -> EpochState:
        """This epoch's bookkeeping, which the loader keeps after the iterator is gone."""
        return self._state

    def progress(self) -> EpochProgress:
        """Where this epoch stands, as a frozen record (what ``state_dict()`` saves is made from it)."""
        return self._state.progress()

    def begin(self, early: bool = False) -> None:
        """Begin the epoch now if it has not begun: at the first ``next()``, or ``early``, for a ``state_dict()``
        asked for while this iterator is alive (torchdata's state right after ``iter()`` is this epoch's; the
        loader's next ``iter()`` then hands out this iterator again while it has delivered nothing)."""
        if self._steps is None:
            self.early = early
            on_first, self._on_first = self._on_first, None
            if on_first is not None:
                try:
                    on_first(self)
                except BaseException:
                    self._on_first = on_first  # refused (a closed loader, say): the next call asks again
                    raise
            if self._steps is None:
                self.bind(self._options, self._state.epoch, self._state.start, self._shared)

    def __next__(self) -> T_co:
        if self._pid != os.getpid():  # its batches would be taken from under the process that made it
            raise LoaderError(f"this iterator belongs to process {self._pid}, whose workers and ring it reads; a "
                              "forked process makes its own: iter(loader) there")
        asked, ending, turn, steps = self._close_asked, self._ending, self._turn, self._steps  # none holds self
        try:
            with self._runtime.gate, self._turn:  # a close from another thread waits for this call to leave
                self.begin()
                assert self._steps is not None
                steps = self._steps
                if asked[0]:  # closed while another thread's next() had the turn: this one ends the epoch
                    with self._ending:
                        asked[0] = False
                        steps.close()
                st = self._state
                t0 = self._clock()
                if self._ended_by:  # said once; after that it is over, as any iterator's end
                    ended_by, self._ended_by = self._ended_by, ""
                    raise LoaderError(f"this iteration ended with {ended_by} after {st.delivered} batches and "
                                      "cannot go on: iter(loader) starts the next epoch (loader.state_dict() taken now "
                                      "and loaded before it resumes the rest of this one)")
                try:
                    item = next(self._steps)
                except BaseException as exc:
                    waited = self._clock() - t0
                    st.waited_s += waited
                    self._events.waited(st.epoch, waited, False)
                    if not isinstance(exc, _SAYS_IT_ENDED):  # the steps are over: a later next() must not end quietly
                        self._ended_by = type(exc).__name__
                    raise
                waited = self._clock() - t0
                st.waited_s += waited
                if isinstance(item, TimedOut):  # no turn taken: the next call waits for the same batch
                    self._events.waited(st.epoch, waited, False)
                    failed: FailedBatch = item
                    del self, item, st  # the traceback holds this frame: it must not keep the epoch alive
                    _raise_alone(failed.take())
                st.delivered += 1
                self._events.waited(st.epoch, waited, True)
                if st.delivered == 1:
                    self._events.first_batch(self._pids())
                if isinstance(item, FailedBatch):
                    failed = item
                    del self, item, st
                    _raise_alone(failed.take())
                return item
        except LoaderClosedError:
            park_if_exiting()  # hung up by the close at exit: a daemon thread, frozen with the interpreter
            raise
        finally:
            if asked[0]:
                _end_asked(asked, ending, turn, steps)

    def __len__(self) -> int:
        return self._options.sampling.length(self._options.dataset)

    def close(self) -> None:
        """End this epoch now: its workers stop (unless persistent) and its slots are given back. From any
        thread, never waiting on a batch: where a ``next()`` is under way (another thread's, or this one's that a
        signal handler interrupted), the epoch ends as that call returns, and a later ``next()`` ends the
        iteration; an end already under way is waited for, not begun twice. In a process forked from the one
        that made it, nothing: the workers and the ring are still that one's."""
        if self._steps is None or self._pid != os.getpid():
            return
        with self._ending:
            self._close_asked[0] = True
            _end_asked(self._close_asked, self._ending, self._turn, self._steps)

    def __del__(self, getpid: Callable[[], int] = os.getpid) -> None:  # bound now: at teardown ``os`` may be gone
        steps = getattr(self, "_steps", None)  # absent when __init__ failed
        if steps is None or steps.gi_frame is None or self._pid != getpid():  # ended, or a forked child's copy
            return
        if self._ending.acquire(blocking=False):  # else another thread is ending it
            try:
                steps.close()  # before the owner goes, whose finalizer may then free the shared workshop
            finally:
                self._ending.release()


def _end_asked(asked: list[bool], ending: threading.RLock, turn: threading.Lock, steps: Generator[Any, None, None] | None
               ) -> None:
    """End an epoch's steps, asked for (``asked``), if no ``next()`` holds them (``turn``); else the one that does
    ends them as it returns: it reads ``asked`` under ``ending`` after letting go of its turn, so no close is missed.
    Given the epoch's parts, not the epoch: a failed batch's traceback holds ``next()``'s frame, never the epoch."""
    with ending:
        if asked[0] and steps is not None and turn.acquire(blocking=False):
            try:
                asked[0] = False
                steps.close()
            finally:
                turn.release()


_live: weakref.WeakSet[Epoch[Any]] = weakref.WeakSet()  # every epoch begun, until it is collected


def end_at_exit() -> None:
    """End every epoch still open at exit, as a ``break`` would, while the modules its clean-up reads are
    whole: left to the interpreter's teardown (an iterator kept mid-epoch by a script that then ends), the
    clean-up met names already cleared and printed a traceback. Run before the runtimes' close
    (``cupy_nwt._exit``); an epoch another thread is inside is left to that."""
    for epoch in list(_live):
        epoch.close()


def length_warning(dataset: Any, reported: int, fetched: int, workers: int) -> str:
    """PyTorch's warning for an iterable dataset that yields more than its ``__len__`` said, then ours."""
    text = (f"Length of IterableDataset {dataset} was reported to be {reported}(when accessing len(dataloader)), "
            f"but {fetched} samples have been fetched. ")
    if workers > 0:
        text += ("For multiprocessing data-loading, this could be caused by not properly configuring the "
                 "IterableDataset replica at each worker. Please see "
                 "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples. ")
    return text + ("cupy_nwt: warned once per epoch; each worker's replica should read only its share of the stream "
                   "(cupy_nwt.get_worker_info() says which), or __len__ should count what the loader yields.")


def _past_length(steps: Generator[Any, None, None], reported: int, options: Options) -> Generator[Any, None, None]:
    """The steps, warning once when they yield more than ``reported`` (the dataset's length when
    ``len(loader)`` was asked): PyTorch's rule, which counts the loader's items against ``len(dataset)``."""
    fetched = 0
    try:
        for item in steps:
            if not isinstance(item, FailedBatch):
                fetched += 1
                if fetched == reported + 1:
                    warnings.warn(length_warning(options.dataset, reported, fetched, options.num_workers),
                                  UserWarning, stacklevel=3)
            yield item
    finally:
        steps.close()


def _steps(options: Options, runtime: Runtime, state: EpochState, shared: bool) -> Generator[Any, None, None]:
    """The epoch's batches: its plan, the workshop it runs on, its source, the host path or the prefetcher."""
    plan, state.sampler_state = make_plan(options, state.epoch, state.start)
    state.plan = plan
    workshop: Workshop | None = None
    source: BatchSource | None = None
    graceful = False
    born = os.getpid()  # a forked child's copy of this generator, collected there, leaves the workers alone
    try:
        prefetcher = runtime.prefetcher  # the one this epoch's options were followed with (``Runtime.follow``)
        workshop = runtime.workshop if shared else None
        fresh_workshop = workshop is None
        if workshop is None and (options.num_workers > 0 or prefetcher is not None):
            workshop = runtime.new_workshop(options, state.epoch, shared)
        spec = workshop.spec if workshop is not None else None
        state.ledger = ledger_for(options, plan)
        bad = BadSampleCount(state.epoch, options.max_bad_samples, runtime.events) if options.on_bad_sample == "skip" else None
        if workshop is not None and workshop.workers is not None:
            _restore_workers(options, state, workshop, fresh_workshop)
            source = WorkerSource(workshop.workers, plan, options.in_order, options.timeout, spec=spec,
                                  events=runtime.events, stall_s=options.stall_warning_s, clock=runtime.clock,
                                  ledger=state.ledger, cursor=stream_cursor(state.start) or 0,
                                  shared=shared_reader(options), deal=dealer(plan), bad=bad)
        else:
            maker = state.maker if state.maker is not None else batch_maker(options)
            if state.readers is None:  # the main process's dataset as the epoch begins
                state.readers = [entry(0, reader_state_or_error(maker, opened=True))]
            source = InlineSource(maker, plan, None, workshop.slots if workshop is not None else None,
                                  spec=spec, events=runtime.events, ledger=state.ledger, begun=state.maker is not None,
                                  bad=bad)
        if prefetcher is not None:
            yield from on_device(prefetcher.batches(source), options.device_id, runtime.ops)
        else:
            yield from host_batches(source, options.zero_copy, runtime.events, runtime.clock, options.joined_output)
        graceful = state.finished = True
        if workshop is not None and workshop.workers is not None:
            runtime.events.ended(workshop.workers.pids())
    except GeneratorExit:
        graceful = True  # a break or a dropped iterator: persistent workers may stay
        raise
    finally:
        if source is not None and os.getpid() == born:
            source.close()
        if workshop is not None and workshop.workers is not None and not (graceful and options.persistent_workers) \
                and os.getpid() == born:
            runtime.drop(workshop)


def _restore_workers(options: Options, state: EpochState, workshop: Workshop, fresh_workshop: bool) -> None:
    """Before the epoch's first task: each new worker gets its reader's entry (a loaded state's, or one carried
    from the epoch before); workers that lived through it already hold theirs, and get only the epoch (a
    stream's ``set_epoch``). Threads sharing one map-style dataset: it is restored here, before any reads."""
    assert workshop.workers is not None
    plan = restore_plan(options, state.epoch, state.readers if fresh_workshop or state.start is not None else None)
    if shared_reader(options):
        if 0 in plan:
            maker = batch_maker(options)
            maker.restore(*plan.pop(0))
            maker.load_pending()
        if not plan:
            return
    if plan:
        workshop.workers.restore(plan)


def host_batches(source: BatchSource, zero_copy: bool, events: Listener | None = None, clock: Callable[[], float] | None = None,
                 output: str = "auto") -> Iterator[Any]:
    """The source's host batches as the caller gets them on the CPU: copies out of the ring, or
    (``zero_copy``) read-only views whose slot is held until the next batch is asked for. Each copy's
    seconds are a ``copied`` event. Array leaves come back in the framework their samples came in, or
    as ``output`` says (``ring.frameworks``); with ``zero_copy`` a torch tensor is over the slot itself
    (writable, as torch tensors are; valid, like the views, until the next batch is asked for).

    A failed batch is yielded as its ``FailedBatch``, for the iterator to raise in its turn.
    """
    as_output = OutputTree(output)
    held = None
    try:
        while True:
            if held is not None:
                source.release(held)
                held = None
            lost: list[FailedBatch] = []
            try:
                hb = source.next(True)
            except FailedBatch as failed:
                lost.append(failed.with_traceback(None))  # without its traceback: its frames hold the source
            if lost:  # yielded out of the handler (Python 3.10 keeps a suspended handler's traceback), held by none
                yield lost.pop()
                continue
            if hb is None:
                return
            treedef = hb.treedef if hb.treedef is not None else _layout_treedef(source.ring())
            if output != "auto":
                treedef = as_output(treedef)
            if hb.slot is None:  # made outside the ring: the caller's already
                leaves = _views(hb.leaves, treedef) if zero_copy else hb.leaves
            elif zero_copy:
                leaves = _views(hb.leaves, treedef)
                held = hb
            else:
                t0 = clock() if clock is not None else 0.0
                leaves = [a.copy() for a in hb.leaves]
                if events is not None and clock is not None:
                    events.copied(clock() - t0)
                source.release(hb)
            try:
                batch = join(treedef, leaves, hb.objects)
            except Exception as exc:  # noqa: BLE001 - this batch's failure, raised in its turn; the epoch goes on
                batch = unjoinable(exc, hb.index, source.number(hb.index))  # yielded out of the handler, as ``lost`` above
            yield batch
    finally:
        if held is not None:
            source.release(held)


def _views(leaves: list[Any], treedef: Any) -> list[Any]:
    """Read-only views of a batch's arrays; writable where a torch tensor will be made over them."""
    return [a if fw == "torch" else readonly(a) for a, fw in zip(leaves, leaf_frameworks(treedef))]


def _layout_treedef(ring: Ring | None) -> Any:
    if ring is None:
        raise LoaderError("internal error: a ring batch before the layout was known")
    return ring.layout.treedef
