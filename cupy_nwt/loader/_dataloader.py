"""``DataLoader``: batches from a map-style dataset, made by worker processes, delivered in order.

The path of a batch: the sampler picks its indices; a worker fetches the samples and collates them
straight into a slot of one shared-memory ring; the main process hands batches out in sampler order
(or as they come, with ``in_order=False``); on the GPU a prefetcher copies batch n+1 on a side
stream while batch n is in use (see ``prefetch``).

The first batch of the first epoch is made in the main process while the workers start: its shapes
and dtypes fix the ring's slot layout, and it is delivered as batch 0, so no work is thrown away.

Lifetime of what you get:

* ``device="cuda"``: CuPy arrays, freshly allocated per batch; yours to keep (DLPack works).
* ``device="cpu"``: NumPy arrays, copied out of the ring by default, so they are yours to keep.
  ``zero_copy=True`` hands out read-only views into the ring slot instead: no copy, but a view is
  only valid until the next batch is requested (or the iteration ends) — copy what you keep.

Several ranks (torchrun, SLURM, MPI): each rank builds its own loader; ``rank`` and ``world_size``
come from the launcher's variables unless given, each rank takes its shard of every epoch (see
``sampler.BatchSampler`` for the padding), and on the GPU uses device ``local_rank % device_count``
unless ``device="cuda:N"`` names one. ``num_workers="auto"`` tunes once per node within the rank's
share of the CPUs (see ``nwt.pick.auto_num_workers``).

Worker start method (``start_method=None``): ``forkserver`` when CUDA is in use in this process
(the loader targets the GPU, or CuPy is imported and a GPU is usable), because a forked child of a
CUDA process must not touch CUDA and page-locked memory is not inherited across fork; ``fork``
otherwise, which starts fastest and shares the dataset copy-on-write. With forkserver or spawn the
dataset and the callables are pickled to each worker, so they must be defined at module level.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import re
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np

from .. import cuda
from .._checks import check_int, check_number
from ..ranks import RankLayout, agree, device_for_rank, rank_layout
from ._collate import flatten, unflatten
from ._prefetch import DevicePrefetcher
from ._ring import Ring, SlotLayout
from ._sampler import BatchSampler, EpochPlan, fresh_seed
from ._slots import HostBatch, SlotPool
from ._sources import BatchSource, InlineSource, WorkerSource, inline_error
from ._stage import Resources, Stage
from ._workers import (
    BatchMaker,
    LoaderError,
    LoaderTimeoutError,
    WorkerDiedError,
    WorkerError,
    WorkerPool,
    default_start_method,
    get_worker_info,
)

__all__ = ["DataLoader", "HostBatch", "LoaderError", "LoaderTimeoutError", "WorkerDiedError", "WorkerError",
           "get_worker_info"]

_DEVICES = ("auto", "cuda", "cpu", "cuda:N")
_log = logging.getLogger(__name__)


_InlineSource = InlineSource  # the name tests/test_prefetch.py builds its eager-reuse source on


class DataLoader:
    """Batches of a map-style dataset (``len`` + ``__getitem__``, optionally ``__getitems__``).

    Same meaning as PyTorch's DataLoader where they overlap. Beyond it: ``device`` ("cuda", "cuda:N",
    "cpu" or "auto") picks where batches land; ``batch_transform(batch, seed)`` runs in the worker after
    collation with a seed fixed by (seed, epoch, global batch index), so results do not depend on the
    worker count; ``seed`` makes shuffling and transforms reproducible (``set_epoch`` or the automatic
    epoch counter picks the epoch); ``pin_memory=True`` page-locks the ring ("staging" forces the pinned
    staging copy); ``zero_copy`` (CPU only) hands out views, see the module docstring.

    Distributed: ``rank`` and ``world_size`` (both or neither; neither means the launcher's variables,
    see ``distributed.rank_layout``) make this loader serve one rank's shard, DistributedSampler-style:
    with ``drop_last=False`` the epoch's order is padded by wrapping around to its start so every rank
    gets ``ceil(n / world_size)`` samples (the padded ones are real samples another rank also gets this
    epoch); with ``drop_last=True`` the ``n % world_size`` tail of the order is left out instead, and
    each rank's short last batch is dropped. ``seed=None`` with several ranks uses rank 0's fresh seed
    when ``torch.distributed`` or mpi4py can broadcast it, else 0, so that all ranks shuffle alike. On
    the GPU the device is ``local_rank % device_count`` unless ``device="cuda:N"``; ``device_id``
    says which, and every CUDA call of the loader runs on it.

    ``timeout`` bounds each wait for the next batch from the workers (the first waits include worker
    start-up, which is slower with forkserver/spawn). One iteration is active at a time: starting a
    new one ends the previous. Use ``close()`` or a
    ``with`` block to stop persistent workers; a loader that is garbage-collected cleans up too.
    """

    def __init__(self, dataset: Any, batch_size: int = 128, shuffle: bool = False, seed: int | None = None,
                 drop_last: bool = False, num_workers: int | str = 0, prefetch_factor: int = 2,
                 pin_memory: bool | str = False, device: str = "auto", collate_fn: Callable | None = None,
                 persistent_workers: bool = False, timeout: float | None = None, in_order: bool = True,
                 worker_init_fn: Callable | None = None, start_method: str | None = None,
                 batch_transform: Callable | None = None, *, zero_copy: bool = False,
                 rank: int | None = None, world_size: int | None = None) -> None:
        try:
            n = len(dataset)
        except TypeError:
            raise ValueError(f"the dataset must have a length (map-style), got {type(dataset).__name__}") from None
        if not (hasattr(dataset, "__getitem__") or hasattr(dataset, "__getitems__")):
            raise ValueError(f"the dataset must support indexing, {type(dataset).__name__} does not")
        seed = check_int("seed", seed, ge=0, optional=True)
        prefetch_factor = check_int("prefetch_factor", prefetch_factor, ge=1)
        if pin_memory not in (True, False, "staging"):
            raise ValueError(f"pin_memory must be True, False or 'staging', got {pin_memory!r}")
        rank = check_int("rank", rank, optional=True)
        world_size = check_int("world_size", world_size, optional=True)
        timeout = check_number("timeout", timeout, gt=0, optional=True, unit="seconds")
        for name, fn in (("collate_fn", collate_fn), ("worker_init_fn", worker_init_fn), ("batch_transform", batch_transform)):
            if fn is not None and not callable(fn):
                raise ValueError(f"{name} must be callable or None, got {type(fn).__name__}")
        if start_method is not None and start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method must be one of {mp.get_all_start_methods()}, got {start_method!r}")

        self.rank_layout = rank_layout(None if rank is None else int(rank),
                                       None if world_size is None else int(world_size))
        self.device, self.device_id = _resolve_device(device, self.rank_layout)
        self.dataset = dataset
        self.seed = self._agreed_seed() if seed is None else int(seed)
        self._sampler = BatchSampler(n, batch_size, bool(shuffle), self.seed, bool(drop_last),
                                     self.rank_layout.rank, self.rank_layout.world_size)
        if num_workers == "auto":
            from ..nwt.pick import auto_num_workers  # noqa: PLC0415 - below the loader; never the tuner itself

            num_workers = auto_num_workers(
                dataset, batch_size=batch_size, prefetch_factor=prefetch_factor, pin_memory=pin_memory,
                device=self.device if self.device_id is None else f"cuda:{self.device_id}",
                batch_transform=batch_transform, layout=self.rank_layout)
        num_workers = check_int("num_workers", num_workers, ge=0, also="'auto'")
        self.num_workers = int(num_workers)
        self.prefetch_factor = int(prefetch_factor)
        self.pin_memory = pin_memory
        self.collate_fn = collate_fn
        self.batch_transform = batch_transform
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = bool(persistent_workers)
        self.timeout = None if timeout is None else float(timeout)
        self.in_order = bool(in_order)
        self.zero_copy = bool(zero_copy)
        self.start_method = start_method or default_start_method(self.device)
        self._res = Resources(DevicePrefetcher(pin_memory) if self.device == "cuda" else None)
        self._finalizer = weakref.finalize(self, self._res.close)
        self._epoch = 0
        self._active: weakref.ref | None = None
        self._layout: SlotLayout | None = None

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

    # -- the public surface

    @property
    def rank(self) -> int:
        return self.rank_layout.rank

    @property
    def world_size(self) -> int:
        return self.rank_layout.world_size

    @property
    def batch_size(self) -> int:
        return self._sampler.batch_size

    @property
    def sampler(self) -> BatchSampler:
        return self._sampler

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
        """The slot layout (fields, shapes, dtypes) once the first batch has been made."""
        return self._layout

    def worker_pids(self) -> list[int]:
        """PIDs of the live worker processes (empty with num_workers=0 or between epochs)."""
        stage = self._res.stage
        return stage.workers.pids() if stage is not None and stage.workers is not None else []

    def __len__(self) -> int:
        return len(self._sampler)

    def __iter__(self) -> Iterator[Any]:
        if not self._finalizer.alive:
            raise LoaderError("this DataLoader is closed")
        self._close_active()
        gen = self._run_epoch(self._epoch)
        self._epoch += 1
        self._active = weakref.ref(gen)
        return gen

    def close(self) -> None:
        """End the current iteration, stop the workers, unlink the ring. Idempotent."""
        self._close_active()
        self._finalizer()

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.device if self.device_id is None else f"cuda:{self.device_id}"
        ranks = f", rank={self.rank}/{self.world_size}" if self.rank_layout.is_distributed else ""
        return (f"DataLoader(n={self._sampler.n}, batch_size={self.batch_size}, num_workers={self.num_workers}, "
                f"device={where!r}{ranks}, start_method={self.start_method!r}, pin_path={self.pin_path!r})")

    # -- one epoch

    def _close_active(self) -> None:
        gen = self._active() if self._active is not None else None
        self._active = None
        if gen is not None:
            gen.close()

    def _run_epoch(self, epoch: int) -> Iterator[Any]:
        res = self._res
        plan = self._sampler.plan(epoch)
        if len(plan) == 0:
            return
        maker = BatchMaker(self.dataset, self.collate_fn, self.batch_transform)
        source: BatchSource | None = None
        graceful = False
        try:
            first = self._build_stage(maker, plan) if res.stage is None else None
            stage = res.stage
            assert stage is not None and self._layout is not None  # built above, or kept from an earlier epoch
            ready = stage.hold(0, first) if first is not None else None
            if stage.workers is not None:
                source = WorkerSource(stage.workers, plan, self.in_order, self.timeout, first=ready)
            else:
                source = InlineSource(maker, plan, self._layout, stage.ring, stage.slots, first=ready)
            if res.prefetcher is not None:
                yield from _on_device(res.prefetcher.batches(source, self._layout), self.device_id)
            else:
                yield from self._host_batches(source, self._layout)
            graceful = True
        except GeneratorExit:
            graceful = True  # a break or a dropped iterator: persistent workers may stay
            raise
        finally:
            if source is not None:
                source.close()
            if not (graceful and self.persistent_workers):
                res.end_epoch()

    def _build_stage(self, maker: BatchMaker, plan: EpochPlan) -> list[np.ndarray] | None:
        """Start the workers, make batch 0 here while they start if the layout is not known yet, then
        make the ring and its slot pool and attach the prefetcher and the workers to it.

        Returns batch 0 when it was made here (it is delivered, not thrown away), else None.
        """
        workers = None
        ring = None
        try:
            if self.num_workers > 0:
                workers = WorkerPool(
                    dataset=self.dataset, num_workers=self.num_workers, prefetch_factor=self.prefetch_factor,
                    seed=self.seed, collate_fn=self.collate_fn, batch_transform=self.batch_transform,
                    worker_init_fn=self.worker_init_fn, start_method=self.start_method,
                )
            first = self._first_batch(maker, plan) if self._layout is None else None
            assert self._layout is not None
            slots = None
            if self.num_workers > 0 or self.device == "cuda":
                n = max(2, self.num_workers * self.prefetch_factor) if self.num_workers > 0 else 2
                ring = Ring(self._layout, n, shared=self.num_workers > 0)
                slots = SlotPool(ring)
                if self._res.prefetcher is not None:
                    with _device_scope(self.device_id):
                        self._res.prefetcher.attach(ring)
                if workers is not None:
                    workers.attach(slots)
        except BaseException:
            Resources.discard(workers, ring, self._res.prefetcher)
            raise
        self._res.stage = Stage(slots, workers)
        return first

    def _first_batch(self, maker: BatchMaker, plan: EpochPlan) -> list[np.ndarray]:
        """Make batch 0 here; its shapes and dtypes become the ring's slot layout."""
        indices = plan.indices(0)
        try:
            batch = maker.make(indices, plan.transform_seed(0))
        except Exception as exc:  # noqa: BLE001
            raise inline_error(exc, maker, 0) from exc
        layout = SlotLayout.for_batch(batch, self._sampler.max_rows)
        leaves, treedef = flatten(batch)
        arrays = layout.check(leaves, treedef, len(indices), 0)
        self._layout = layout
        return arrays

    def _host_batches(self, source: BatchSource, layout: SlotLayout) -> Iterator[Any]:
        held = None
        try:
            while True:
                if held is not None:
                    source.release(held)
                    held = None
                hb = source.next(True)
                if hb is None:
                    return
                if hb.slot is None:
                    leaves = hb.leaves
                elif self.zero_copy:
                    leaves = [_readonly(a) for a in hb.leaves]
                    held = hb
                else:
                    leaves = [a.copy() for a in hb.leaves]
                    source.release(hb)
                yield unflatten(layout.treedef, leaves)
        finally:
            if held is not None:
                source.release(held)


def _device_scope(device_id: int | None) -> contextlib.AbstractContextManager:
    """``device_id`` current inside the block; nothing to switch for a loader without a GPU of its own."""
    return contextlib.nullcontext() if device_id is None else cuda.device_scope(device_id)


def _on_device(batches: Generator[Any, None, None], device_id: int | None) -> Iterator[Any]:
    """Run each step of ``batches`` with this loader's GPU current; hand each batch out outside it.

    So a rank's streams, events, copies and batch allocations all live on its device, while the
    caller's code between batches runs on whatever device the caller made current.
    """
    try:
        while True:
            with _device_scope(device_id):
                try:
                    batch = next(batches)
                except StopIteration:
                    return
            yield batch
    finally:
        with _device_scope(device_id):
            batches.close()


def _resolve_device(device: Any, layout: RankLayout) -> tuple[str, int | None]:
    """``("cuda", index)`` or ``("cpu", None)`` from "auto", "cuda", "cuda:N" or "cpu"."""
    m = re.fullmatch(r"cuda:(\d+)", device) if isinstance(device, str) else None
    if not (m or device in ("auto", "cuda", "cpu")):
        raise ValueError(f"device must be one of {', '.join(_DEVICES)}; got {device!r}")
    if device == "cpu" or (device == "auto" and not cuda.gpu_status().available):
        return "cpu", None
    cuda.require_gpu()
    count = cuda.device_count()
    if m is None:
        return "cuda", device_for_rank(layout, count)
    index = int(m.group(1))
    if index >= count:
        raise ValueError(f"device={device!r}, but this process sees {count} CUDA device(s): 0..{count - 1} "
                         "(CUDA_VISIBLE_DEVICES renumbers them)")
    return "cuda", index


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v
