"""``DataLoader``: batches from a map-style or iterable-style dataset, made by worker processes,
delivered in order.

The path of a batch: the sampler picks its indices (or, for an iterable-style dataset, a worker
reads its stream's next samples); a worker fetches the samples and collates them straight into a
slot of one shared-memory ring; the main process hands batches out in order (or as they come, with
``in_order=False``); on the GPU a prefetcher copies batch n+1 on a side stream while batch n is in
use (see ``device.prefetch``).

With workers, every batch is made in a worker, the first included: the ring's slot layout (shapes and
dtypes) is learned from the first batch a worker sends, which travels pickled, its large arrays through an
anonymous file (so do the few made before the ring exists; ``workers.pipes``), and is delivered, not thrown
away. A later batch that does not fit the layout travels pickled too; samples of one batch that disagree
with each other are an error naming the sample.

Lifetime of what you get:

* ``device="cuda"``: CuPy arrays, freshly allocated per batch; yours to keep (DLPack works).
* ``device="cpu"``: NumPy arrays, copied out of the ring by default, so they are yours to keep.
  ``zero_copy=True`` hands out views of the ring slot instead (NumPy's read-only, torch's writable): no
  copy, but a view is valid only until the next batch is requested (or the iteration ends).
* Samples holding torch tensors (JAX arrays) give batches of torch tensors (JAX arrays), on either device,
  made over those same arrays without a copy (``torch.from_numpy``, DLPack on the GPU); a program that has
  imported torch gets tensors from the default collate for NumPy samples and numbers too, as torch's
  DataLoader gives; ``output=`` asks for one framework whatever the samples hold (``ring.frameworks``).

Several ranks: each rank takes its shard of every epoch (the class's "Distributed"), talking to none at construction.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._checks import check_int
from ..data.contract import followed_epoch
from ..errors import ArgumentError, LoaderError
from ._options import Options, changed, following_group, resolve
from ._runtime import LoaderParts, Runtime
from ._settings_view import SettingsView
from ._stats import STALL_WARNING_S, LoaderStats
from .checkpoint.readers import carried
from .checkpoint.resume import check_state, fresh, previous_position, state_of
from .epoch.epoch import Epoch, EpochState
from .plan.order import OrderSampler, SamplerBatches
from .ring.ring import SlotLayout
from .tuning.policy import Decision
from .workers.torch_workers import is_iter_datapipe, torch_shared_seed

if TYPE_CHECKING:
    from ..picks.pick import AutoWorkers

__all__ = ["DataLoader"]

T_co = TypeVar("T_co", covariant=True)


class DataLoader(SettingsView, Generic[T_co]):
    """Batches of a map-style (``__getitem__``) or iterable-style (``__iter__``) dataset.

    The arguments up to ``generator`` are PyTorch's, in its order and with its defaults, rules and
    error types, but one rule relaxed (``prefetch_factor`` and ``persistent_workers=True`` are accepted
    with ``num_workers=0``, where they do nothing: a sweep over worker counts needs no special case for 0;
    PyTorch raises ``ValueError``): ``batch_size=None`` turns batching off; ``sampler`` (any iterable of indices) and
    ``batch_sampler`` (any iterable of index lists) replace the loader's own order; ``generator`` (an
    int, a NumPy or a torch Generator) seeds the shuffle; ``timeout=0`` waits without limit;
    ``multiprocessing_context`` is a start method's name or a context. Beyond PyTorch: ``device``
    ("cuda", "cuda:N", "cpu" or "auto") picks where batches land; ``batch_transform(batch, seed)``
    runs in the worker after collation with a seed fixed by (seed, epoch, global batch index), so
    results do not depend on the worker count; ``seed`` makes shuffling and transforms reproducible
    (``set_epoch`` or the automatic epoch counter picks the epoch); ``pin_memory=True`` page-locks
    the ring ("staging" forces the pinned staging copy); ``zero_copy`` (CPU only) hands out views,
    see the module docstring. ``worker_type="thread"`` makes batches in threads of this process instead
    of worker processes: no pickling or inter-process copy, the same batches, order, seeds and errors;
    best when the per-sample work releases the GIL (see ``workers.thread`` for what differs). ``None``: process
    workers, or with ``num_workers="auto"`` the type a saved pick records. ``num_workers="auto"``
    takes the saved pick for this machine and work (``tune_num_workers(...).save_pick()``, ``cupy-nwt
    tune``, or an earlier loader's). On a miss it tunes online (as ``autotune=True``) from half its CPU
    budget (``tuning.policy.starting_workers``), says so once on ``cupy_nwt.tuner``, and once the tuner
    has settled saves that count, so the next ``"auto"`` loader reuses it; it searches nothing here
    (with ``autotune=False`` given, it runs that starting count untuned and saves nothing).
    ``num_workers=AutoWorkers(step=...)`` keys the pick by the training step the loader feeds;
    ``stats().num_workers_why`` says what was picked and why.

    An iterable-style dataset is read by every worker from its own copy (``get_worker_info()`` says
    which share to read); batches are taken from the workers round-robin, and the epoch ends when
    every worker's stream is exhausted. Its batches depend on how the dataset shards itself, so
    unlike map-style ones they are not independent of the worker count.

    Distributed: ``rank`` and ``world_size`` (both or neither; neither means an initialised
    ``torch.distributed`` group, else the launcher's variables, see ``ranks.rank_layout``) make the loader's own sampler serve one rank's shard,
    DistributedSampler-style: with ``drop_last=False`` the epoch's order is padded by wrapping
    around to its start so every rank gets ``ceil(n / world_size)`` samples; with ``drop_last=True``
    the ``n % world_size`` tail of the order is left out instead, and each rank's short last batch
    is dropped (``plan.order.BatchSampler``). A user's ``sampler`` or ``batch_sampler`` is used as given (shard it yourself), and
    an iterable-style dataset reads ``rank`` and ``world_size`` from ``get_worker_info()``.
    ``seed=None`` with several ranks is 0 on every rank, as DistributedSampler's default (no rank asks
    another, so a loader made on one rank alone does not wait). On the GPU the device is ``local_rank % device_count`` unless
    ``device="cuda:N"``; ``device_id`` says which.

    ``autotune=True`` (map-style; ``num_workers`` >= 1 or "auto" is where it starts) retunes the active
    workers and the ring slots in use while the caller iterates, within ``cpu_budget`` workers
    (default: usable CPUs less one) and ``memory_budget`` ring bytes (default: a share of available
    memory, within the cgroup's limit), without changing the batches; see ``tuning.online``. A policy object with
    ``decide`` may stand in for ``True``.

    ``stall_warning_s`` (None: off): a ``next()`` waiting this long for the workers logs a warning on
    ``cupy_nwt.loader`` naming the batch and the worker that has it; ``stats()`` gives the per-stage
    figures (``cupy_nwt.loader._stats``).

    ``autotune=Autotune(policy, interval_steps=, min_interval_s=)`` is ``autotune``'s long form (how
    often the policy is asked). ``parts=LoaderParts(ops=, reader=, clock=, listeners=)`` replaces the
    loader's collaborators: the CUDA operations (and GPUs) of the prefetcher, the reader of a worker's
    memory, the clock of the figures, and more listeners on its events (``_events``); tests hand it
    fakes this way, a program may listen to the pipeline.

    ``timeout`` bounds each wait for the next batch from the workers (the first waits include worker
    start-up, which is slower with forkserver/spawn). Each iterator has its own workers and gets the
    whole epoch, except with persistent workers or on the GPU, where starting a new iteration ends
    the previous one (a GPU one also when ``device``, ``pin_memory`` or ``output`` was set since). Use
    ``close()`` or a ``with`` block to stop persistent workers; a loader that is garbage-collected cleans
    up too.

    Args:
        dataset: map-style (``__getitem__``/``__getitems__``) or iterable-style (``__iter__``).
        batch_size: samples per batch; None turns batching off (each sample is a batch).
        shuffle: a fresh order each epoch, from ``seed`` and the epoch.
        sampler: any iterable of indices, replacing the loader's own order.
        batch_sampler: any iterable of index lists, replacing batching too.
        num_workers: workers making batches (0: the main process), or "auto" for the saved pick (else online tuning).
        collate_fn: turns a list of samples into a batch (default: ``default_collate``, into the ring).
        pin_memory: page-lock the ring for fast copies to the GPU; "staging" forces a pinned staging copy.
        drop_last: leave out a last batch shorter than ``batch_size``.
        timeout: seconds each wait for a batch from the workers may take (0: no limit).
        worker_init_fn: called with the worker id in each worker before its first batch.
        multiprocessing_context: the workers' start method ("fork", "forkserver", "spawn") or context; None: forkserver
            where this process uses CUDA or threads a forked child cannot survive, else fork (``workers.start``).
        generator: an int, a NumPy or a torch Generator: the seed drawn from it (instead of ``seed``).
        prefetch_factor: batches in flight per worker (default 2).
        persistent_workers: keep the workers (and the ring) from one epoch to the next.
        pin_memory_device: torch's, accepted and ignored, with torch's warning.
        in_order: deliver batches in the sampler's order (False: as they are made).
        seed: seeds the shuffle and the transforms: the same seed, the same batches at any worker count.
        device: where batches land: "cuda", "cuda:N", "cpu" or "auto" (the GPU when there is one).
        output: the batches' framework: "auto" (the samples'), "numpy", "torch", "cupy" or "jax".
        batch_transform: ``(batch, seed) -> batch`` run in the worker after collation.
        zero_copy: on the CPU, hand out views of the ring instead of copies (valid until the next batch).
        rank: this rank's shard of each epoch (with ``world_size``; default: the launcher's).
        world_size: the number of ranks sharing each epoch.
        worker_type: "process" or "thread"; None: processes, or the saved pick's type with "auto".
        autotune: retune the active workers while iterating (True, a policy, or ``Autotune``); False also
            keeps ``num_workers="auto"`` from tuning on a miss (default None: off, except for "auto").
        cpu_budget: workers ``autotune`` may use at most (default: usable CPUs less one).
        memory_budget: ring bytes ``autotune`` may use at most.
        stall_warning_s: log a warning when one ``next()`` waits this long (None: never).
        on_bad_sample: "skip" leaves a sample that fails to read or decode out of its batch, logged and
            counted in ``stats()`` (map-style datasets); "raise" (the default) fails its batch.
        max_bad_samples: with "skip", more bad samples than this in one epoch stop it with
            ``TooManyBadSamplesError`` (None: no limit).
        snapshot_every_n_steps: torchdata's, accepted, checked and read back; it has nothing to do here, as every
            batch already brings its worker's dataset state.
        parts: the loader's collaborators (CUDA operations, memory reader, clock, listeners), for tests.
    """

    _options: Options

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None, sampler: Any = None,
                 batch_sampler: Any = None, num_workers: int | str | AutoWorkers = 0, collate_fn: Callable | None = None,
                 pin_memory: bool | str = False, drop_last: bool = False, timeout: float | None = 0,
                 worker_init_fn: Callable | None = None, multiprocessing_context: Any = None, generator: Any = None,
                 *, prefetch_factor: int | None = None, persistent_workers: bool = False, pin_memory_device: str = "",
                 in_order: bool = True, seed: int | None = None, device: str = "auto", output: str = "auto",
                 batch_transform: Callable | None = None, zero_copy: bool = False,
                 rank: int | None = None, world_size: int | None = None, worker_type: str | None = None,
                 autotune: Any = None, cpu_budget: int | None = None, memory_budget: int | None = None,
                 stall_warning_s: float | None = STALL_WARNING_S, on_bad_sample: str = "raise",
                 max_bad_samples: int | None = None, snapshot_every_n_steps: int | None = 1,
                 parts: LoaderParts | None = None) -> None:
        if parts is not None and not isinstance(parts, LoaderParts):
            raise ArgumentError(f"parts must be a LoaderParts, got {type(parts).__name__}")
        options = resolve(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, drop_last,
            timeout, worker_init_fn, multiprocessing_context, generator, prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers, in_order=in_order, seed=seed, device=device,
            batch_transform=batch_transform, zero_copy=zero_copy, rank=rank,
            world_size=world_size, worker_type=worker_type, autotune=autotune, cpu_budget=cpu_budget,
            memory_budget=memory_budget, stall_warning_s=stall_warning_s, pin_memory_device=pin_memory_device,
            output=output, on_bad_sample=on_bad_sample, max_bad_samples=max_bad_samples,
            snapshot_every_n_steps=snapshot_every_n_steps,
            gpus=parts.ops if parts is not None else None)
        object.__setattr__(self, "_options", options)
        self._epoch = 0
        self._resume: dict[str, Any] | None = None  # a loaded state, for the next iteration
        self._reported_len: int | None = None  # an iterable dataset's len() when len(loader) was asked
        self._told: int | None = None  # a stream's own epoch as the last iteration left it (``followed_epoch``)
        self._initialized = True
        self._start(parts)

    def _start(self, parts: LoaderParts | None) -> None:
        """What this process holds for the loader: the runtime (workers, rings) and the live iterations."""
        self._pid = os.getpid()
        self._runtime = Runtime.of(self._options, parts)
        self._finalizer = weakref.finalize(self, self._runtime.close)
        self._finalizer.atexit = False  # at exit the loaders close after the script's own exit functions (``_exit``)
        self._active: weakref.ref | None = None  # the shared workshop's epoch (a new one ends it)
        self._last: EpochState | None = None  # the newest epoch's bookkeeping: what state_dict() describes
        self._newest: weakref.ref | None = None  # the newest iterator, which a state_dict() begins if it has not
        self._iterators: weakref.WeakSet[Epoch[T_co]] = weakref.WeakSet()  # every live one, for close() to end

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process (``torch.multiprocessing.spawn``, Lightning's ``ddp_spawn``) or for
        ``copy.deepcopy``: the settings, the epoch and a loaded state not yet begun. Workers, rings and
        iterations stay this process's: the copy starts its own (a ``state_dict()`` carries an iteration)."""
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_pid", "_runtime", "_finalizer", "_active", "_last", "_newest", "_iterators")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start(None)

    @property
    def sampler(self) -> Any:
        """The user's ``sampler``, else the loader's own order one index at a time (an ``OrderSampler``,
        listing the next epoch; its ``len`` is this rank's samples per epoch, its ``set_epoch`` the loader's);
        None for a stream."""
        self._follow_process_group()
        s = self._options.sampling
        if s.sampler is not None or s.style == "iterable":
            return s.sampler
        return OrderSampler(s.batch_sampler_for(self.dataset, self._epoch), self.set_epoch)

    @property
    def batch_sampler(self) -> Any:
        """The user's ``batch_sampler``; else, when batching, the user's ``sampler`` cut into batches or the
        loader's own ``BatchSampler`` (listing the next epoch); None for a stream or ``batch_size=None``."""
        self._follow_process_group()
        s = self._options.sampling
        if s.batch_sampler is not None:
            return s.batch_sampler
        if s.batch_size is None or s.style == "iterable":
            return None
        if s.sampler is not None:
            return SamplerBatches(s.sampler, s.batch_size, s.drop_last)
        return s.batch_sampler_for(self.dataset, self._epoch)

    @property
    def start_method(self) -> str:
        """How the workers start: the given context's method, else the default (see the module docstring);
        "thread" for thread workers."""
        return self._options.start_method

    # -- the public surface

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will run (advances by one per iteration that asked for a batch)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next iteration (its shuffle order and transform seeds).

        Args:
            epoch: the epoch number, as ``DistributedSampler.set_epoch`` takes it.
        """
        self._epoch = check_int("epoch", epoch, ge=0)

    @property
    def pin_path(self) -> str:
        """'registered' (the ring itself is page-locked), 'staging' (pinned bounce buffer) or 'none'.

        Before the first batch, or after ``device`` or ``pin_memory`` was set, this is the path the next iteration
        will try; a refused registration turns 'registered' into 'staging' when the ring is made.
        """
        return self._runtime.pin_path(self._options)

    @property
    def layout(self) -> SlotLayout | None:
        """The slot layout (fields, shapes, dtypes) once the first batch has been made with a ring."""
        return self._runtime.layout

    @property
    def decisions(self) -> tuple[Decision, ...]:
        """Online tuning's decisions so far, the start first (empty without ``autotune`` or a ``num_workers="auto"``
        that found no saved pick)."""
        return self._runtime.decisions

    def slots_in_use(self) -> int:
        """Ring slots holding a batch not yet given back, over every live iteration: the batches made ahead,
        plus a ``zero_copy`` view held; 0 when no iteration is live (anything else is a leak), except that
        persistent workers left mid-epoch (a ``break``) hold the slots of the batches they were making until
        the next epoch takes their answers in."""
        return self._runtime.slots_in_use()

    def worker_pids(self) -> list[int]:
        """PIDs of the live worker processes, of every live iteration and persistent ones between epochs (empty
        with num_workers=0, thread workers, or between epochs without persistent workers)."""
        return self._runtime.worker_pids()

    def stats(self) -> LoaderStats:
        """Where the time went since the previous call (or since the loader was made): the caller's wait,
        the workers' busy fraction, seconds fetching, collating, transforming and copying, the live
        workers and prefetch depth, online tuning's decisions, stalls, and each worker's private memory.
        It may be polled from a monitoring thread while the loop runs: each stall and skipped sample is listed
        by exactly one call. What each figure means, and the warnings: ``cupy_nwt.loader._stats``."""
        progress = self._last.progress() if self._last is not None else None
        if progress is None:
            return self._runtime.stats(self._options)
        return self._runtime.stats(self._options, progress.epoch, progress.delivered)

    def __len__(self) -> int:
        self._follow_process_group()
        length = self._options.sampling.length(self.dataset)
        if self._options.sampling.style == "iterable":  # later iterations warn past it, as PyTorch's do
            self._reported_len = len(self.dataset)
        return length

    def __iter__(self) -> Iterator[T_co]:
        if not self._finalizer.alive:
            raise LoaderError("this DataLoader is closed")
        if self._pid != os.getpid():  # forked (a server's workers): the parent's machinery stays the parent's
            self._finalizer.detach()
            self._start(None)
        newest = self._newest() if self._newest is not None else None
        if newest is not None and newest.early and newest.delivered == 0 and self._resume is None:
            return newest  # begun by a state_dict() and not yet used: that state describes this epoch
        options = self._options
        it: Epoch[T_co] = Epoch(options, self._runtime, self._epoch, None, self._shares_stage(options), self,
                                self._reported_len, on_first=self._begin)
        self._newest = weakref.ref(it)
        self._iterators.add(it)
        return it

    def _shares_stage(self, options: Options) -> bool:
        return (options.persistent_workers and options.num_workers > 0) or options.device == "cuda"

    def _begin(self, it: Epoch[T_co]) -> None:
        """An iterator's first ``next()`` takes the epoch counter and a loaded state, and ends the shared workshop's
        previous epoch (refused while another thread is inside it). An ``iter()`` that takes no batch changes nothing."""
        if not self._finalizer.alive:
            raise LoaderError("this DataLoader is closed")
        self._follow_process_group()
        options = self._options
        shared = self._shares_stage(options)
        if shared:
            self._runtime.gate.refuse_if_others_inside()
        if shared or not self._runtime.serves(options):  # an epoch on the GPU path ends before its prefetcher goes
            self._close_active()
        self._runtime.follow(options)
        start, self._resume = self._resume, None
        stream = options.sampling.style == "iterable"
        epoch = followed_epoch(options.dataset, self._epoch, self._told) if stream else self._epoch
        start = start if start is not None and start["epoch"] == epoch else None
        if options.seed_drawn and start is None and is_iter_datapipe(options.dataset):
            drawn = torch_shared_seed()  # torch's loader draws a pipe's shared seed so, at each iter()
            if drawn is not None:
                options = replace(changed(options, "seed", drawn), seed_drawn=True)
                object.__setattr__(self, "_options", options)
        readers = None
        if start is None and options.persistent_workers and options.num_workers > 0:  # the workers go on as they are
            readers = carried(options, self._last.progress() if self._last is not None else None)
        previous = previous_position(self._last.progress()) if start is None and self._last is not None else None
        it.bind(options, epoch, start, shared, readers, previous)
        self._told = epoch  # what the dataset will read back, unless the caller sets another
        self._epoch = epoch + 1
        self._last = it.state
        self._runtime.events.began(epoch)
        if shared:
            self._active = weakref.ref(it)

    def _follow_process_group(self) -> None:
        """Take the layout of a ``torch.distributed`` group made since (``_options.following_group``)."""
        object.__setattr__(self, "_options", following_group(self._options))

    def state_dict(self) -> dict[str, Any]:
        """Where the newest iteration stands, counting only batches delivered to the caller, and each reader's
        own dataset (and stream iterator) ``state_dict()`` as of then; small and JSON-ready but for what those
        return (pickled, at most 64 MiB together, else ``StateError``). Between epochs (or before the first),
        the start of the epoch ``iter()`` runs next. What it holds, and the elastic rules:
        ``cupy_nwt.loader.checkpoint.resume``."""
        newest = self._newest() if self._newest is not None else None
        if newest is not None:
            newest.begin(early=True)
        pending = self._resume
        if pending is not None and pending["epoch"] == self._epoch:  # loaded, not begun yet
            return dict(pending)
        progress = self._last.progress() if self._last is not None else None
        if progress is None or progress.finished or self._epoch != progress.epoch + 1:
            # its epoch ran to its end, or set_epoch chose another: the next starts from the readers as they are
            return fresh(self._options, self._epoch, carried(self._options, progress), previous_position(progress))
        return state_of(self._options, progress)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next ``iter()`` yields exactly the rest of the saved epoch, the
        one after it the following epoch (a ``set_epoch`` to another epoch before that drops it). Each worker's
        (with ``num_workers=0``, the main process's) dataset and stream iterator get their saved
        ``state_dict()`` back before their first sample; persistent workers are restarted for it. Another
        ``num_workers``, ``prefetch_factor`` or ``persistent_workers`` gives the same rest of a map-style epoch
        (its dataset states, which cannot be merged, are then dropped with a warning); another ``world_size``
        re-shards it (load any old rank's state when the ranks delivered alike, else ``merge_states`` of all of
        them). A user's sampler resumes on the same ranks only, a stream with the same workers and ranks too.
        Anything but a loader's state, an empty dict included, is refused with a ``StateError`` and the loader is
        left as it was. What a state holds: ``cupy_nwt.loader.checkpoint.resume``."""
        self._follow_process_group()  # a state is checked against the ranks it will run on
        options = self._options
        seed = state.get("seed") if isinstance(state, dict) else None
        if (options.seed_drawn or options.generator_given) and type(seed) is int and seed >= 0:
            # drawn here (from torch, or the given generator, whose state torchdata restores), saved there
            options = replace(changed(options, "seed", seed), seed_drawn=options.seed_drawn)
        self._resume = check_state(options, state)
        object.__setattr__(self, "_options", options)
        self._epoch = int(self._resume["epoch"])
        self._last = None  # the loaded state, not the previous iteration, is where the loader stands
        self._close_active()
        workshop = self._runtime.workshop
        if workshop is not None and workshop.workers is not None:  # persistent workers hold other states: start anew
            self._runtime.drop(workshop)

    def close(self) -> None:
        """End the current iterations (those the caller still holds too, so no view keeps a ring mapped), stop the
        workers, unlink the rings. Idempotent; from any thread (``ReaderGate.close``: a waiting one is hung up)."""
        self._runtime.gate.close(self._close_now)

    def _close_now(self) -> None:
        try:
            self._close_active()
            for it in list(self._iterators):
                it.close()
        finally:  # the workers and rings go whatever an iteration's end raised
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

    def _close_active(self) -> None:
        it = self._active() if self._active is not None else None
        self._active = None
        if it is not None:
            it.close()
