"""What a loader holds across epochs and must free: its workshops (workers and rings), the slot layout,
the GPU prefetcher, online tuning and the figures. ``Runtime`` is their one owner and writer, and
the target of the loader's finalizer (it holds no reference to the loader, so a dropped loader is
collected and cleaned up).

A ``Workshop`` bundles the slot pool (and its ring, once the layout is known), the workers that
fill it and how its ring is made (``RingSpec``: the epoch's source makes it, from the first batch or
from the layout an earlier workshop showed). A loader's shared workshop lives across epochs
(persistent workers, or the main process's ring on the GPU path); every other iteration with workers
has a workshop of its own, so several iterators of one loader can be live at once. The layout
outlives a workshop: the runtime reads it from its workshops' rings and hands it to the next one.

The collaborators (the CUDA operations, the reader of a worker's memory, the clock, more event
listeners) come in through the constructor: ``LoaderParts`` carries them from a ``DataLoader``'s
``parts=``, which is also how tests hand it fakes.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import util as _mp_util  # noqa: F401 - its exit function registered before ours, so run after it
from typing import TYPE_CHECKING

from ._events import Events, Listener
from ._reader_gate import ReaderGate
from ._stats import MEMORY_WARN_BYTES, LoaderStats, MemoryReader, Recorder, copy_kind, read_uss, settle_baselines
from .device.prefetch import DevicePrefetcher, PrefetchOps, planned_pin_path
from .ring.ring import Ring, SlotLayout
from .ring.slots import RingSpec, SlotPool
from .tuning.online import OnlineTuner
from .tuning.policy import Decision
from .workers.maker import BatchMaker
from .workers.pool import Workers
from .workers.start import prestart_forkserver
from .workers.torch_workers import is_iter_datapipe

if TYPE_CHECKING:
    from ._options import Options


@dataclass(frozen=True)
class LoaderParts:
    """A loader's collaborators, each replaceable: ``ops`` the CUDA operations of the prefetcher (and the
    GPUs it may use; None: ``cupy_nwt.cuda``'s), ``reader`` a worker process's private memory by pid,
    ``clock`` the seconds the figures count, ``listeners`` more listeners on the loader's events,
    ``memory_warn_bytes`` the copy-on-read warning's threshold (``_stats``)."""

    ops: PrefetchOps | None = None
    reader: MemoryReader = read_uss
    clock: Callable[[], float] = time.perf_counter
    listeners: tuple[Listener, ...] = ()
    memory_warn_bytes: int = MEMORY_WARN_BYTES


def batch_maker(options: Options) -> BatchMaker:
    """What makes this loader's batches (in a worker, or in the main process), built from its options (which
    are data and build nothing)."""
    s = options.sampling
    pipe = (s.rank, s.world_size) if is_iter_datapipe(options.dataset) else None
    return BatchMaker(options.dataset, options.collate_fn, options.batch_transform, batched=s.batched,
                      batch_size=s.batch_size, drop_last=s.drop_last, pipe=pipe,
                      skip_bad=options.on_bad_sample == "skip", ranks=(s.rank, s.world_size))


def ring_spec(options: Options, known: SlotLayout | None) -> RingSpec:
    """How this loader's rings are made: slots for the largest batch, as many as the workers' prefetch (or
    online tuning's budget) can fill, in the layout already ``known`` if any."""
    s = options.sampling
    if options.tuning is not None:
        slots = options.tuning.ring_slots
    else:
        n = max(2, options.num_workers * options.prefetch_factor) if options.num_workers > 0 else 2
        slots = lambda slot_bytes: n  # noqa: E731 - the count does not depend on the slot's size
    return RingSpec(s.max_rows(options.dataset), s.batched, slots, known)


@dataclass(frozen=True, eq=False)
class Workshop:
    """What an epoch runs on: the slot pool (its ring attached once the layout is known), the workers, and how
    its ring is made (``spec``: the epoch's source makes it from the first batch, unless the layout was known).

    ``workers`` is None for ``num_workers=0`` (whose only workshop is the GPU path's ring).
    """

    slots: SlotPool
    workers: Workers | None
    spec: RingSpec

    @property
    def ring(self) -> Ring | None:
        return self.slots.ring


def prefetch_for(options: Options) -> tuple[bool | str, str] | None:
    """What a prefetcher serves: its pinning and the framework it hands batches out in; None off the GPU."""
    return (options.pin_memory, options.joined_output) if options.device == "cuda" else None


_open: weakref.WeakSet[Runtime] = weakref.WeakSet()  # every runtime made, until it is collected


def close_at_exit() -> None:
    """Close every loader at exit before multiprocessing's exit function terminates its daemon processes: a
    thread still reading a loader is then hung up (and parks), instead of seeing its workers killed. The
    loader's finalizer would run too late where something made a ``weakref.finalize`` before
    ``multiprocessing.util`` was imported (seen on Python 3.10)."""
    for runtime in list(_open):
        runtime.close()


class Runtime:
    """The machinery of one loader. ``tuning`` fixes the tuner; the prefetcher follows the options each iteration
    starts with (``follow``: ``device``, ``pin_memory`` and ``output`` may be set after construction); each
    workshop reads the options it is given."""

    def __init__(self, options: Options, *, ops: PrefetchOps | None = None, reader: MemoryReader = read_uss,
                 clock: Callable[[], float] = time.perf_counter, listeners: tuple[Listener, ...] = (),
                 memory_warn_bytes: int = MEMORY_WARN_BYTES) -> None:
        self.ops, self.clock = ops, clock
        forked = options.worker_kind.processes and options.start_method == "fork"
        self.recorder = Recorder(reader, clock, memory_warn_bytes, forked)
        self.tuner = OnlineTuner(options.tuning, clock) if options.tuning is not None else None
        self.events = Events((self.recorder, *((self.tuner,) if self.tuner is not None else ()), *listeners))
        self.gate = ReaderGate()  # the threads inside ``next()``; a close waits for them (``close``)
        _open.add(self)
        self.workshop: Workshop | None = None  # the shared one
        self.loose: list[Workshop] = []  # one per live iteration that has its own workers
        self._layout: SlotLayout | None = None
        self.prefetcher: DevicePrefetcher | None = None
        self._serving: tuple[bool | str, str] | None = None  # what the prefetcher was made for (``prefetch_for``)
        self.follow(options)
        if options.num_workers > 0 and options.worker_kind.processes:  # the server starts while the caller goes on
            prestart_forkserver(options.context, options.start_method,
                                [options.dataset, options.collate_fn, options.batch_transform,
                                 options.worker_init_fn])

    @classmethod
    def of(cls, options: Options, parts: LoaderParts | None) -> Runtime:
        parts = parts if parts is not None else LoaderParts()
        return cls(options, ops=parts.ops, reader=parts.reader, clock=parts.clock, listeners=parts.listeners,
                   memory_warn_bytes=parts.memory_warn_bytes)

    # -- what a loader reports

    @property
    def decisions(self) -> tuple[Decision, ...]:
        return tuple(self.tuner.decisions) if self.tuner is not None else ()

    def pin_path(self, options: Options) -> str:
        """The prefetcher's path; after ``device`` or ``pin_memory`` was set, the one the next iteration will try."""
        if self.serves(options):
            return self.prefetcher.pin_path if self.prefetcher is not None else "none"
        return planned_pin_path(options.pin_memory) if options.device == "cuda" else "none"

    # -- the device path

    def serves(self, options: Options) -> bool:
        """Whether the prefetcher (or its absence) is what ``options`` ask for."""
        return prefetch_for(options) == self._serving

    def follow(self, options: Options) -> None:
        """Make, replace or drop the prefetcher as an iteration starts, when ``options`` ask for another. The caller
        has ended any iteration the old one served. The old one is closed first, undoing its registration of the
        shared workshop's ring; the new one registers that ring at its first batch from it, as any ring, with the
        loader's device current. Off the GPU, a shared workshop without workers (the GPU path's own ring) goes too."""
        want = prefetch_for(options)
        if want == self._serving:
            return
        old, self.prefetcher, self._serving = self.prefetcher, None, want
        try:
            if old is not None:
                old.close()
        finally:
            if want is not None:
                self.prefetcher = DevicePrefetcher(want[0], self.ops, self.events, self.clock, want[1])
            elif self.workshop is not None and self.workshop.workers is None:
                self.drop(self.workshop)

    def workshops(self) -> list[Workshop]:
        return ([self.workshop] if self.workshop is not None else []) + self.loose

    def slots_in_use(self) -> int:
        """Ring slots taken and not yet given back, over every live workshop."""
        return sum(s.ring.slots - len(s.slots.free) for s in self.workshops() if s.ring is not None)

    def worker_pids(self) -> list[int]:
        return [pid for workshop in self.workshops() if workshop.workers is not None for pid in workshop.workers.pids()]

    def live_setting(self, options: Options) -> tuple[int, int]:
        """The workers given tasks now and the batches that may be in flight (ring slots in use at most)."""
        workshop = next((s for s in reversed(self.workshops()) if s.workers is not None), None)
        if workshop is not None and workshop.workers is not None and not workshop.workers.closed:
            pool = workshop.workers
            ring = pool.slots.ring
            slots = ring.slots if ring is not None else pool.size * pool.prefetch_factor
            return pool.active, min(slots, pool.slot_cap) if pool.slot_cap is not None else slots
        if self.tuner is not None:
            return self.tuner.setting.workers, self.tuner.setting.slots
        if options.num_workers == 0:
            return 0, 1 if options.device == "cuda" else 0
        return options.num_workers, max(2, options.num_workers * options.prefetch_factor)

    def stats(self, options: Options, epoch: int | None = None, epoch_batches: int | None = None) -> LoaderStats:
        workers, depth = self.live_setting(options)
        processes = options.worker_kind.processes or options.num_workers == 0
        return self.recorder.stats(
            decisions=self.decisions, workers=workers, depth=depth,
            copy=copy_kind(options.device, options.pin_memory, options.num_workers, options.zero_copy),
            worker_type=options.worker_type, pids=self.worker_pids() if processes else None,
            epoch=epoch, epoch_batches=epoch_batches, num_workers_why=options.num_workers_why,
            worker_seconds=self.tuner.worker_seconds() if self.tuner is not None else None)

    # -- workshops

    def new_workshop(self, options: Options, epoch: int, shared: bool) -> Workshop:
        """Start the workers (if any); the epoch's source makes their ring (``Workshop.spec``)."""
        workers: Workers | None = None
        if options.num_workers > 0:
            settle_baselines()  # no thread of ours beside a fork
            workers = options.worker_kind.start(
                maker=batch_maker(options), num_workers=self.tuner.workers if self.tuner is not None else options.num_workers,
                prefetch_factor=options.prefetch_factor, seed=options.seed, worker_init_fn=options.worker_init_fn,
                context=options.context, device=options.device, epoch=epoch, rank=options.rank,
                world_size=options.world_size, events=self.events, hung_up=self.gate.hung_up)
            if self.tuner is not None:
                self.tuner.configure(workers)
        workshop = Workshop(workers.slots if workers is not None else SlotPool(None), workers,
                            ring_spec(options, self.layout))
        if shared:
            self.workshop = workshop
        else:
            self.loose.append(workshop)
        return workshop

    @property
    def layout(self) -> SlotLayout | None:
        """The slot layout, once a first batch has shown it (in any workshop's ring); later workshops start with it."""
        if self._layout is None:
            self._layout = next((w.ring.layout for w in self.workshops() if w.ring is not None), None)
        return self._layout

    def drop(self, workshop: Workshop) -> None:
        """Stop ``workshop``'s workers, then release its ring. Idempotent."""
        if self._layout is None and workshop.ring is not None:
            self._layout = workshop.ring.layout
        if workshop is self.workshop:
            self.workshop = None
            prefetcher = self.prefetcher
        elif workshop in self.loose:
            self.loose.remove(workshop)
            prefetcher = None
        else:
            return
        self._discard(workshop.workers, workshop.ring, prefetcher)

    @staticmethod
    def _discard(workers: Workers | None, ring: Ring | None, prefetcher: DevicePrefetcher | None) -> None:
        """Stop the workers, then unregister and unmap the ring they wrote into, whatever fails."""
        try:
            if workers is not None:
                workers.shutdown()
        finally:
            try:
                if prefetcher is not None:
                    prefetcher.detach()
            finally:
                if ring is not None:
                    ring.close()

    def close(self) -> None:
        """Free everything (the loader's finalizer). Idempotent. A thread waiting in ``next()`` is hung up and
        let go first (``ReaderGate.close``)."""
        self.gate.close(self._free)

    def _free(self) -> None:
        try:
            for workshop in self.workshops():
                self.drop(workshop)
        finally:
            if self.prefetcher is not None:
                self.prefetcher.close()
