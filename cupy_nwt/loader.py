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
import os
import re
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import cuda
from .collate import flatten, unflatten
from .distributed import RankLayout, agree, device_for_rank, rank_layout
from .prefetch import DevicePrefetcher
from .sampler import BatchSampler, EpochPlan, fresh_seed
from .shm import Ring, SlotLayout
from .worker import (BatchMaker, Done, Failed, LoaderError, LoaderTimeoutError, WorkerDiedError, WorkerError,
                     WorkerPool, default_start_method, error_report, get_worker_info, make_worker_error)

__all__ = ["DataLoader", "HostBatch", "LoaderError", "LoaderTimeoutError", "WorkerDiedError", "WorkerError",
           "get_worker_info"]

_DEVICES = ("auto", "cuda", "cpu", "cuda:N")
_log = logging.getLogger(__name__)


@dataclass
class HostBatch:
    """A batch on the host: ``leaves`` are views into ring ``slot`` (or fresh arrays when slot is None)."""

    index: int
    slot: int | None
    rows: int
    leaves: list[np.ndarray]


def _inline_error(exc: Exception, maker: BatchMaker, batch_index: int) -> LoaderError:
    report = error_report(exc, maker.failed_index(exc))
    report["pickled"] = None  # the original is chained directly below
    err = make_worker_error(report, worker_id=None, pid=os.getpid(), batch_index=batch_index)
    err.__cause__ = exc
    return err


class _InlineSource:
    """``num_workers=0``: batches made in the main process, into the ring when there is one."""

    def __init__(self, maker: BatchMaker, plan: EpochPlan, layout: SlotLayout,
                 ring: Ring | None, first: list[np.ndarray] | None) -> None:
        self.maker, self.plan = maker, plan
        self.layout, self.ring, self.first = layout, ring, first
        self.free = deque(range(ring.slots)) if ring is not None else deque()
        self.b = 0

    def next(self, block: bool) -> HostBatch | None:
        b = self.b
        if b >= len(self.plan):
            return None
        indices = self.plan.indices(b)
        rows = len(indices)
        if self.ring is None:
            leaves = self.first if (b == 0 and self.first is not None) else self._make(b, indices)
            self.b += 1
            return HostBatch(b, None, rows, leaves)
        if not self.free:
            if block:
                raise LoaderError("internal error: no free ring slot for the main process to fill")
            return None
        slot = self.free.popleft()
        views = self.ring.slot_views(slot, rows)
        try:
            if b == 0 and self.first is not None:
                for dst, src in zip(views, self.first):
                    np.copyto(dst, src)
            else:
                try:
                    self.maker.fill(indices, self.plan.transform_seed(b), self.layout, views, b)
                except Exception as exc:  # noqa: BLE001 - rewrapped with the batch and sample index
                    raise _inline_error(exc, self.maker, b) from exc
        except BaseException:
            self.free.appendleft(slot)
            raise
        self.b += 1
        return HostBatch(b, slot, rows, views)

    def _make(self, b: int, indices: np.ndarray) -> list[np.ndarray]:
        try:
            return self.maker.make_checked(indices, self.plan.transform_seed(b), self.layout, b)
        except Exception as exc:  # noqa: BLE001
            raise _inline_error(exc, self.maker, b) from exc

    def release(self, hb: HostBatch) -> None:
        if hb.slot is not None:
            self.free.append(hb.slot)

    def close(self) -> None:
        self.first = None


class _WorkerSource:
    """``num_workers>0``: keeps every worker busy, and hands batches out in order (or as they come)."""

    def __init__(self, pool: WorkerPool, ring: Ring, plan: EpochPlan,
                 in_order: bool, timeout: float | None, preloaded: Done | None) -> None:
        self.pool, self.ring, self.plan, self.epoch = pool, ring, plan, plan.epoch
        self.in_order, self.timeout = in_order, timeout
        pool.new_generation()
        self.ready: dict[int, Done | Failed] = {}
        self.next_submit = 0
        self.next_deliver = 0
        self.delivered = 0
        if preloaded is not None:
            self.ready[preloaded.batch_index] = preloaded
            self.next_submit = 1

    def _submit(self) -> None:
        n = len(self.plan)
        while self.next_submit < n:
            b = self.next_submit
            if not self.pool.submit(b, self.plan.indices(b), self.plan.transform_seed(b)):
                return
            self.next_submit += 1

    def _pick(self) -> int | None:
        if self.in_order:
            return self.next_deliver if self.next_deliver in self.ready else None
        return min(self.ready) if self.ready else None

    def _absorb(self, items: list[Done | Failed]) -> None:
        for item in items:
            self.ready[item.batch_index] = item

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
                return HostBatch(b, item.slot, item.rows, self.ring.slot_views(item.slot, item.rows))
            if self.delivered >= len(self.plan):
                return None
            if not block:
                items = self.pool.collect(0)
                self._absorb(items)
                if not items:
                    return None
                continue
            if self.timeout is None:
                self._absorb(self.pool.collect(None))
                continue
            now = time.monotonic()
            deadline = deadline if deadline is not None else now + self.timeout
            if now >= deadline:
                want = f"batch {self.next_deliver}" if self.in_order else "any batch"
                raise LoaderTimeoutError(
                    f"no batch from the workers within timeout={self.timeout} s (waiting for {want} of "
                    f"epoch {self.epoch}); the dataset may be too slow or blocked"
                )
            self._absorb(self.pool.collect(deadline - now))

    def release(self, hb: HostBatch) -> None:
        if hb.slot is not None:
            self.pool.release(hb.slot)

    def close(self) -> None:
        """Return the slots of finished but undelivered batches; queued tasks are dropped by generation."""
        for item in self.ready.values():
            if isinstance(item, Done):
                self.pool.release(item.slot)
        self.ready.clear()


class _Resources:
    """What must be released: workers, ring, registration. Held apart so a finalizer can own it."""

    def __init__(self, prefetcher: DevicePrefetcher | None) -> None:
        self.pool: WorkerPool | None = None
        self.ring: Ring | None = None
        self.layout: SlotLayout | None = None
        self.prefetcher = prefetcher

    def end_epoch(self) -> None:
        """Stop the workers and drop their shared ring (the main process's own ring stays)."""
        if self.pool is None:
            return
        pool, self.pool = self.pool, None
        try:
            pool.shutdown()
        finally:
            self._drop_ring()

    def _drop_ring(self) -> None:
        ring, self.ring = self.ring, None
        try:
            if self.prefetcher is not None:
                self.prefetcher.detach()
        finally:
            if ring is not None:
                ring.close()

    def close(self) -> None:
        try:
            self.end_epoch()
        finally:
            self._drop_ring()
            if self.prefetcher is not None:
                self.prefetcher.close()


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
        if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
        if not isinstance(prefetch_factor, (int, np.integer)) or isinstance(prefetch_factor, bool) or prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be a positive integer, got {prefetch_factor!r}")
        if pin_memory not in (True, False, "staging"):
            raise ValueError(f"pin_memory must be True, False or 'staging', got {pin_memory!r}")
        for name, value in (("rank", rank), ("world_size", world_size)):
            if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool)):
                raise ValueError(f"{name} must be an integer or None, got {value!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
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
            from .nwt.pick import auto_num_workers  # noqa: PLC0415 - below the loader; never the tuner itself

            num_workers = auto_num_workers(
                dataset, batch_size=batch_size, prefetch_factor=prefetch_factor, pin_memory=pin_memory,
                device=self.device if self.device_id is None else f"cuda:{self.device_id}",
                batch_transform=batch_transform, layout=self.rank_layout)
        if not isinstance(num_workers, (int, np.integer)) or isinstance(num_workers, bool) or num_workers < 0:
            raise ValueError(f"num_workers must be a non-negative integer or 'auto', got {num_workers!r}")
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
        self._res = _Resources(DevicePrefetcher(pin_memory) if self.device == "cuda" else None)
        self._finalizer = weakref.finalize(self, self._res.close)
        self._epoch = 0
        self._active: weakref.ref | None = None

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
        if not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self._epoch = int(epoch)

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
        return self._res.layout

    def worker_pids(self) -> list[int]:
        """PIDs of the live worker processes (empty with num_workers=0 or between epochs)."""
        return self._res.pool.pids() if self._res.pool is not None else []

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
        source = None
        graceful = False
        try:
            if self.num_workers > 0 and res.pool is None:
                res.pool = WorkerPool(
                    dataset=self.dataset, num_workers=self.num_workers, prefetch_factor=self.prefetch_factor,
                    seed=self.seed, collate_fn=self.collate_fn, batch_transform=self.batch_transform,
                    worker_init_fn=self.worker_init_fn, start_method=self.start_method,
                )
            first = self._first_batch(maker, plan) if res.layout is None else None
            if res.ring is None and (self.num_workers > 0 or self.device == "cuda"):
                slots = max(2, self.num_workers * self.prefetch_factor) if self.num_workers > 0 else 2
                res.ring = Ring(res.layout, slots, shared=self.num_workers > 0)
                if res.prefetcher is not None:
                    with _device_scope(self.device_id):
                        res.prefetcher.attach(res.ring)
                if res.pool is not None:
                    res.pool.set_ring(res.ring)
            if self.num_workers > 0:
                preloaded = None
                if first is not None:
                    slot = res.pool.take_slot()
                    for dst, src in zip(res.ring.slot_views(slot, len(plan.indices(0))), first):
                        np.copyto(dst, src)
                    preloaded = Done(0, slot, len(plan.indices(0)), -1)
                source = _WorkerSource(res.pool, res.ring, plan, self.in_order, self.timeout, preloaded)
            else:
                source = _InlineSource(maker, plan, res.layout, res.ring, first)
            if res.prefetcher is not None:
                yield from _on_device(res.prefetcher.batches(source, res.layout), self.device_id)
            else:
                yield from self._host_batches(source, res.layout)
            graceful = True
        except GeneratorExit:
            graceful = True  # a break or a dropped iterator: persistent workers may stay
            raise
        finally:
            if source is not None:
                source.close()
            if not (graceful and self.persistent_workers):
                res.end_epoch()

    def _first_batch(self, maker: BatchMaker, plan: EpochPlan) -> list[np.ndarray]:
        """Make batch 0 here; its shapes and dtypes become the ring's slot layout."""
        indices = plan.indices(0)
        try:
            batch = maker.make(indices, plan.transform_seed(0))
        except Exception as exc:  # noqa: BLE001
            raise _inline_error(exc, maker, 0) from exc
        layout = SlotLayout.for_batch(batch, self._sampler.max_rows)
        leaves, treedef = flatten(batch)
        arrays = layout.check(leaves, treedef, len(indices), 0)
        self._res.layout = layout
        return arrays

    def _host_batches(self, source: Any, layout: SlotLayout) -> Iterator[Any]:
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


def _on_device(batches: Iterator[Any], device_id: int | None) -> Iterator[Any]:
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
