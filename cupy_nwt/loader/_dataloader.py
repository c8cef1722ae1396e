"""``DataLoader``: batches from a map-style or iterable-style dataset, made by worker processes,
delivered in order.

The path of a batch: the sampler picks its indices (or, for an iterable-style dataset, a worker
reads its stream's next samples); a worker fetches the samples and collates them straight into a
slot of one shared-memory ring; the main process hands batches out in order (or as they come, with
``in_order=False``); on the GPU a prefetcher copies batch n+1 on a side stream while batch n is in
use (see ``_prefetch``).

With workers, every batch is made in a worker, the first included: the ring's slot layout (shapes
and dtypes) is learned from the first batch a worker sends, which travels pickled (so do the few
made before the ring exists); the batch is delivered, not thrown away. A later batch that does not
fit the layout travels pickled too; samples of one batch that disagree with each other are an error
naming the sample.

Lifetime of what you get:

* ``device="cuda"``: CuPy arrays, freshly allocated per batch; yours to keep (DLPack works).
* ``device="cpu"``: NumPy arrays, copied out of the ring by default, so they are yours to keep.
  ``zero_copy=True`` hands out read-only views into the ring slot instead: no copy, but a view is
  only valid until the next batch is requested (or the iteration ends) — copy what you keep.

Several ranks (torchrun, SLURM, MPI): each rank builds its own loader; ``rank`` and ``world_size``
come from the launcher's variables unless given, each rank takes its shard of every epoch (see
``_sampler.BatchSampler`` for the padding), and on the GPU uses device ``local_rank % device_count``
unless ``device="cuda:N"`` names one. ``num_workers="auto"`` tunes once per node within the rank's
share of the CPUs (see ``nwt.pick.auto_num_workers``).

Worker start method (``multiprocessing_context=None``): ``forkserver`` when CUDA is in use in this
process (the loader targets the GPU, or CuPy is imported and a GPU is usable), because a forked child
of a CUDA process must not touch CUDA and page-locked memory is not inherited across fork; ``fork``
otherwise, which starts fastest and shares the dataset copy-on-write. With forkserver or spawn the
dataset and the callables are pickled to each worker, so they must be defined at module level.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .._checks import check_int
from ..ranks import agree, rank_layout
from .device.place import on_device, resolve_device
from .epoch.epoch import EpochIterator, host_batches
from .workers.maker import BatchMaker
from .tuning.online import make_online
from ._options import resolve_context, resolve_timeout, seed_from, warn_if_too_many_workers
from .device.prefetch import DevicePrefetcher
from .epoch.resume import Track, attach, check_state, kind_of, make_plan, state_of
from .ring.ring import SlotLayout
from .epoch.sampler import fresh_seed
from .epoch.sampling import Sampling
from ._setup import learn_layout, new_stage
from .ring.slots import HostBatch
from .epoch.sources import BatchSource, InlineSource, WorkerSource
from ._runtime import Resources, Stage
from ._stats import STALL_WARNING_S, LoaderStats, Recorder, check_stall
from .workers.thread import WORKER_TYPES, check_worker_type
from .workers.process import (
    LoaderError,
    LoaderTimeoutError,
    WorkerDiedError,
    WorkerError,
    default_start_method,
    get_worker_info,
)

__all__ = ["DataLoader", "HostBatch", "LoaderError", "LoaderTimeoutError", "WorkerDiedError", "WorkerError",
           "get_worker_info"]

_FIXED = frozenset({"batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"})
_log = logging.getLogger(__name__)
T_co = TypeVar("T_co", covariant=True)

_InlineSource = InlineSource  # the name tests/test_prefetch.py builds its eager-reuse source on
_resolve_device = resolve_device  # and the name tests/test_scaleout.py checks the device choice through


class DataLoader(Generic[T_co]):
    """Batches of a map-style (``__getitem__``) or iterable-style (``__iter__``) dataset.

    The arguments up to ``generator`` are PyTorch's, in its order and with its defaults, rules and
    error types: ``batch_size=None`` turns batching off; ``sampler`` (any iterable of indices) and
    ``batch_sampler`` (any iterable of index lists) replace the loader's own order; ``generator`` (an
    int or a NumPy Generator) seeds the shuffle; ``timeout=0`` waits without limit;
    ``multiprocessing_context`` is a start method's name or a context. Beyond PyTorch: ``device``
    ("cuda", "cuda:N", "cpu" or "auto") picks where batches land; ``batch_transform(batch, seed)``
    runs in the worker after collation with a seed fixed by (seed, epoch, global batch index), so
    results do not depend on the worker count; ``seed`` makes shuffling and transforms reproducible
    (``set_epoch`` or the automatic epoch counter picks the epoch); ``pin_memory=True`` page-locks
    the ring ("staging" forces the pinned staging copy); ``zero_copy`` (CPU only) hands out views,
    see the module docstring. ``worker_type="thread"`` makes batches in threads of this process instead
    of worker processes: no pickling or inter-process copy, the same batches, order, seeds and errors;
    best when the per-sample work releases the GIL (see ``_threads`` for what differs). ``None``: process
    workers, or with ``num_workers="auto"`` the type a saved pick records.

    An iterable-style dataset is read by every worker from its own copy (``get_worker_info()`` says
    which share to read); batches are taken from the workers round-robin, and the epoch ends when
    every worker's stream is exhausted. Its batches depend on how the dataset shards itself, so
    unlike map-style ones they are not independent of the worker count.

    Distributed: ``rank`` and ``world_size`` (both or neither; neither means the launcher's variables,
    see ``ranks.rank_layout``) make the loader's own sampler serve one rank's shard,
    DistributedSampler-style: with ``drop_last=False`` the epoch's order is padded by wrapping
    around to its start so every rank gets ``ceil(n / world_size)`` samples; with ``drop_last=True``
    the ``n % world_size`` tail of the order is left out instead, and each rank's short last batch
    is dropped. A user's ``sampler`` or ``batch_sampler`` is used as given (shard it yourself), and
    an iterable-style dataset reads ``rank`` and ``world_size`` from ``get_worker_info()``.
    ``seed=None`` with several ranks uses rank 0's fresh seed when ``torch.distributed`` or mpi4py can
    broadcast it, else 0. On the GPU the device is ``local_rank % device_count`` unless
    ``device="cuda:N"``; ``device_id`` says which.

    ``autotune=True`` (map-style, ``num_workers`` >= 1 or "auto", the start) retunes the active
    workers and the ring slots in use while the caller iterates, within ``cpu_budget`` workers
    (default: usable CPUs less one) and ``memory_budget`` ring bytes (default: a share of available
    RAM and of /dev/shm), without changing the batches; see ``_online``. A policy object with
    ``decide`` may stand in for ``True``.

    ``stall_warning_s`` (None: off): a ``next()`` waiting this long for the workers logs a warning on
    ``cupy_nwt.loader`` naming the batch and the worker that has it; ``stats()`` gives the per-stage
    figures (``cupy_nwt.loader._stats``).

    ``timeout`` bounds each wait for the next batch from the workers (the first waits include worker
    start-up, which is slower with forkserver/spawn). Each iterator has its own workers and gets the
    whole epoch, except with persistent workers or on the GPU, where starting a new iteration ends
    the previous one. Use ``close()`` or a ``with`` block to stop persistent workers; a loader that
    is garbage-collected cleans up too.
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None, sampler: Any = None,
                 batch_sampler: Any = None, num_workers: int | str = 0, collate_fn: Callable | None = None,
                 pin_memory: bool | str = False, drop_last: bool = False, timeout: float | None = 0,
                 worker_init_fn: Callable | None = None, multiprocessing_context: Any = None, generator: Any = None,
                 *, prefetch_factor: int | None = None, persistent_workers: bool = False, in_order: bool = True,
                 seed: int | None = None, device: str = "auto", start_method: str | None = None,
                 batch_transform: Callable | None = None, zero_copy: bool = False,
                 rank: int | None = None, world_size: int | None = None, worker_type: str | None = None,
                 autotune: Any = False, cpu_budget: int | None = None, memory_budget: int | None = None,
                 stall_warning_s: float | None = STALL_WARNING_S) -> None:
        seed = seed_from(seed, generator)
        if worker_type is not None:
            worker_type = check_worker_type(worker_type)
        prefetch_factor = check_int("prefetch_factor", 2 if prefetch_factor is None else prefetch_factor, ge=1)
        if pin_memory not in (True, False, "staging"):
            raise ValueError(f"pin_memory must be True, False or 'staging', got {pin_memory!r}")
        rank = check_int("rank", rank, optional=True)
        world_size = check_int("world_size", world_size, optional=True)
        timeout = resolve_timeout(timeout)
        self.stall_warning_s = check_stall(stall_warning_s)
        for name, fn in (("collate_fn", collate_fn), ("worker_init_fn", worker_init_fn), ("batch_transform", batch_transform)):
            if fn is not None and not callable(fn):
                raise ValueError(f"{name} must be callable or None, got {type(fn).__name__}")
        if num_workers != "auto":
            num_workers = check_int("num_workers", num_workers, ge=0, also="'auto'")
        context = resolve_context(multiprocessing_context, start_method,
                                  num_workers if isinstance(num_workers, int) else 1)
        if worker_type == "thread" and context is not None:
            raise ValueError("multiprocessing_context and start_method apply to process workers, not worker_type='thread'")

        self.rank_layout = rank_layout(rank, world_size)
        self.device, self.device_id = resolve_device(device, self.rank_layout)
        self.dataset = dataset
        self.seed = self._agreed_seed() if seed is None else seed
        self._sampling = Sampling.resolve(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last, self.seed,
                                          self.rank_layout.rank, self.rank_layout.world_size)
        self._online = make_online(autotune, cpu_budget, memory_budget, num_workers=num_workers,
                                   iterable=self._sampling.kind == "iterable")
        if isinstance(num_workers, int):
            warn_if_too_many_workers(num_workers)
        else:
            num_workers, worker_type = self._auto_workers(prefetch_factor, pin_memory, batch_transform, worker_type)
        if self._online is not None:
            num_workers = self._online.start(num_workers, prefetch_factor)
        self._decisions = self._online.decisions if self._online is not None else []  # online tuning's changes
        self.num_workers = int(num_workers)
        self.worker_type = worker_type or "process"
        self.prefetch_factor = int(prefetch_factor)
        self.pin_memory = pin_memory
        self.collate_fn = collate_fn
        self.batch_transform = batch_transform
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = bool(persistent_workers)
        self.timeout = timeout
        self.in_order = bool(in_order)
        self.zero_copy = bool(zero_copy)
        self._context = context
        self._mp_context_arg = multiprocessing_context
        self._stats = Recorder()  # the figures ``stats()`` reports; the stages add to its clock
        self._res = Resources(DevicePrefetcher(pin_memory, clock=self._stats.clock) if self.device == "cuda" else None)
        self._finalizer = weakref.finalize(self, self._res.close)
        self._epoch = 0
        self._active: weakref.ref | None = None
        self._latest: weakref.ref | None = None  # the newest iterator: what state and figures describe
        self._layout: SlotLayout | None = None
        self._track: Track | None = None  # the newest iteration's progress (``state_dict``)
        self._resume: dict[str, Any] | None = None  # a loaded state, for the next iteration
        self._initialized = True

    def _auto_workers(self, prefetch_factor: int, pin_memory: bool | str, batch_transform: Callable | None,
                      worker_type: str | None) -> tuple[int, str]:
        if not self._sampling.own or self._sampling.batch_size is None:
            raise ValueError("num_workers='auto' tunes on a map-style dataset batched by the loader itself "
                             "(no sampler, batch_sampler or batch_size=None); give a number")
        from ..nwt.pick import auto_pick  # noqa: PLC0415 - below the loader; never the tuner itself

        return auto_pick(
            self.dataset, batch_size=self._sampling.batch_size, prefetch_factor=prefetch_factor,
            pin_memory=pin_memory, device=self.device if self.device_id is None else f"cuda:{self.device_id}",
            batch_transform=batch_transform, layout=self.rank_layout, worker_type=worker_type,
            search_types=WORKER_TYPES if self._online is not None else ("process",))

    def _agreed_seed(self) -> int:
        """A fresh seed, the same on every rank: rank 0's through the program's communicator, else 0."""
        if not self.rank_layout.is_distributed:
            return fresh_seed()
        seed, via = agree(fresh_seed(), self.rank_layout)
        if via is None:
            _log.info("seed=None on %d ranks with no torch.distributed or mpi4py to agree on a fresh one: "
                      "using seed 0 on every rank, as DistributedSampler does", self.rank_layout.world_size)
            return 0
        return int(seed)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIXED and getattr(self, "_initialized", False):
            raise ValueError(f"{name} attribute should not be set after {type(self).__name__} is initialized")
        super().__setattr__(name, value)

    # -- the public surface

    @property
    def rank(self) -> int:
        return self.rank_layout.rank

    @property
    def world_size(self) -> int:
        return self.rank_layout.world_size

    @property
    def batch_size(self) -> int | None:
        return self._sampling.batch_size

    @property
    def drop_last(self) -> bool:
        return self._sampling.drop_last

    @property
    def sampler(self) -> Any:
        """The user's ``sampler``, else the loader's own ``BatchSampler`` (map-style; None for a stream)."""
        if self._sampling.sampler is not None or self._sampling.kind == "iterable":
            return self._sampling.sampler
        return self._sampling.batch_sampler_for(self.dataset)

    @property
    def batch_sampler(self) -> Any:
        """The user's ``batch_sampler``, else the loader's own ``BatchSampler`` when it batches a map-style dataset."""
        if self._sampling.batch_sampler is not None:
            return self._sampling.batch_sampler
        return self.sampler if self._sampling.own and self._sampling.batched else None

    @property
    def multiprocessing_context(self) -> Any:
        return self._mp_context_arg

    @multiprocessing_context.setter
    def multiprocessing_context(self, value: Any) -> None:
        self._context = resolve_context(value, None, self.num_workers)
        self._mp_context_arg = value

    @property
    def start_method(self) -> str:
        """How the workers start: the given context's method, else the default (see the module docstring);
        "thread" for thread workers."""
        if self.worker_type == "thread":
            return "thread"
        return self._context.get_start_method() if self._context is not None else default_start_method(self.device)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will run (advances by one per iteration started)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next iteration (its shuffle order and transform seeds)."""
        self._epoch = check_int("epoch", epoch, ge=0)

    @property
    def pin_path(self) -> str:
        """'registered' (the ring itself is page-locked), 'staging' (pinned bounce buffer) or 'none'.

        Before the first batch this is the path the loader will try; a refused registration turns
        'registered' into 'staging' when the ring is made.
        """
        return self._res.prefetcher.pin_path if self._res.prefetcher is not None else "none"

    @property
    def layout(self) -> SlotLayout | None:
        """The slot layout (fields, shapes, dtypes) once the first batch has been made with a ring."""
        return self._layout

    def worker_pids(self) -> list[int]:
        """PIDs of the live worker processes, of every live iteration (empty with num_workers=0, thread
        workers, or between epochs)."""
        return [pid for stage in self._res.stages() if stage.workers is not None for pid in stage.workers.pids()]

    def stats(self) -> LoaderStats:
        """Where the time went since the previous call (or since the loader was made): the caller's wait,
        the workers' busy fraction, seconds fetching, collating, transforming and copying, the live
        workers and prefetch depth, online tuning's decisions, stalls, and each worker's private memory.
        What each figure means, and the warnings: ``cupy_nwt.loader._stats``."""
        return self._stats.stats(self)

    def __len__(self) -> int:
        return self._sampling.length(self.dataset)

    def __iter__(self) -> Iterator[T_co]:
        if not self._finalizer.alive:
            raise LoaderError("this DataLoader is closed")
        shared = (self.persistent_workers and self.num_workers > 0) or self._res.prefetcher is not None
        if shared:
            self._close_active()
        start, self._resume = self._resume, None
        track = Track(kind_of(self), self._epoch, start if start is not None and start["epoch"] == self._epoch else None)
        it: EpochIterator[T_co] = EpochIterator(self._run_epoch(track, shared), self)
        self._epoch += 1
        self._latest, self._track = weakref.ref(it), track
        if self._online is not None:
            self._online.follow(it, self._epoch - 1)
        if shared:
            self._active = weakref.ref(it)
        return it

    def state_dict(self) -> dict[str, Any]:
        """Where the newest iteration stands, counting only batches delivered to the caller; small and
        JSON-ready. Between epochs (or before the first), the start of the epoch ``iter()`` runs next.
        What it holds, and the elastic rules: ``cupy_nwt.loader.epoch.resume``."""
        return state_of(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next ``iter()`` yields exactly the rest of the saved epoch, the
        one after it the following epoch (a ``set_epoch`` to another epoch before that drops it). Another ``num_workers``, ``prefetch_factor`` or
        ``persistent_workers`` gives the same rest; another ``world_size`` re-shards it (map-style; load
        any old rank's state when the ranks delivered alike, else ``merge_states`` of all of them)."""
        self._resume = check_state(self, state)
        self._epoch = int(self._resume["epoch"])

    def close(self) -> None:
        """End the current iterations, stop the workers, unlink the rings. Idempotent."""
        self._close_active()
        self._finalizer()

    def __enter__(self) -> DataLoader[T_co]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.device if self.device_id is None else f"cuda:{self.device_id}"
        ranks = f", rank={self.rank}/{self.world_size}" if self.rank_layout.is_distributed else ""
        return (f"DataLoader({type(self.dataset).__name__}, batch_size={self.batch_size}, num_workers={self.num_workers}, "
                f"device={where!r}{ranks}, worker_type={self.worker_type!r}, start_method={self.start_method!r}, pin_path={self.pin_path!r})")

    # -- one epoch

    def _close_active(self) -> None:
        gen = self._active() if self._active is not None else None
        self._active = None
        if gen is not None:
            gen.close()

    def _maker(self) -> BatchMaker:
        s = self._sampling
        return BatchMaker(self.dataset, self.collate_fn, self.batch_transform, batched=s.batched,
                          batch_size=s.batch_size, drop_last=s.drop_last)

    def _run_epoch(self, track: Track, shared: bool) -> Iterator[Any]:
        res, epoch = self._res, track.epoch
        plan = make_plan(self, track)
        stage: Stage | None = None
        source: BatchSource | None = None
        graceful = False
        try:
            stage = res.stage if shared else None
            if stage is None and (self.num_workers > 0 or res.prefetcher is not None):
                stage = new_stage(self, epoch, shared)
            learn = (lambda hb: learn_layout(self, stage, hb)) if stage is not None else None
            if stage is not None and stage.workers is not None:
                source = WorkerSource(stage.workers, plan, self.in_order, self.timeout, learn=learn,
                                      tick=self._online.tick if self._online is not None else None,
                                      stall_s=self.stall_warning_s, on_stall=self._stats.stall,
                                      clock=self._stats.clock)
            else:
                source = InlineSource(self._maker(), plan, self._layout, None,
                                      stage.slots if stage is not None else None, learn=learn, clock=self._stats.clock)
            attach(track, source, self)
            if res.prefetcher is not None:
                yield from on_device(res.prefetcher.batches(source), self.device_id)
            else:
                yield from host_batches(source, self.zero_copy, lambda: self._layout, self._stats.clock)
            graceful = track.finished = True
            if stage is not None and stage.workers is not None:
                self._stats.epoch_end(stage.workers.pids())
        except GeneratorExit:
            graceful = True  # a break or a dropped iterator: persistent workers may stay
            raise
        finally:
            if source is not None:
                source.close()
            if stage is not None and stage.workers is not None and not (graceful and self.persistent_workers):
                res.drop(stage)
