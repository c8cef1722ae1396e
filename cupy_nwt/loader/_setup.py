"""Setting up what an epoch runs on, from a loader's settings: its workers (processes or threads),
and the ring once the first batch has fixed the layout. Apart from ``_dataloader`` so that file
stays about the loader's surface and its epochs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .device.place import device_scope
from .ring.ring import Ring, SlotLayout
from .ring.slots import HostBatch, SlotPool
from ._runtime import Stage
from .workers.thread import ThreadPool
from .workers.process import WorkerPool

if TYPE_CHECKING:
    from ._dataloader import DataLoader


def new_stage(loader: DataLoader, epoch: int, shared: bool) -> Stage:
    """Start the workers (if any) and, when the layout is already known, make their ring."""
    workers: ThreadPool | WorkerPool | None = None
    count = loader._online.workers if loader._online is not None else loader.num_workers
    if loader.num_workers > 0 and loader.worker_type == "thread":
        workers = ThreadPool(maker=loader._maker(), num_workers=count, prefetch_factor=loader.prefetch_factor,
                             seed=loader.seed, worker_init_fn=loader.worker_init_fn, epoch=epoch, rank=loader.rank,
                             world_size=loader.world_size)
    elif loader.num_workers > 0:
        workers = WorkerPool(maker=loader._maker(), num_workers=count, prefetch_factor=loader.prefetch_factor,
                             seed=loader.seed, worker_init_fn=loader.worker_init_fn,
                             start_method=loader._context if loader._context is not None else loader.start_method,
                             epoch=epoch, rank=loader.rank, world_size=loader.world_size)
    if workers is not None:
        workers.clock = loader._stats.clock
    if workers is not None and loader._online is not None:
        loader._online.configure(workers)
    stage = Stage(workers.slots if workers is not None else SlotPool(None), workers)
    if shared:
        loader._res.stage = stage
    else:
        loader._res.loose.append(stage)
    if loader._layout is not None:
        attach_ring(loader, stage, loader._layout)
    return stage


def learn_layout(loader: DataLoader, stage: Stage | None, hb: HostBatch) -> None:
    """The first batch made fixes the layout (unless an earlier stage learned it): build the ring."""
    if stage is None or stage.ring is not None:
        return
    if loader._layout is None:
        assert hb.treedef is not None
        rows = loader._sampling.max_rows(loader.dataset)
        loader._layout = SlotLayout.from_parts(hb.treedef, hb.leaves, rows, hb.rows if loader._sampling.batched else None)
    attach_ring(loader, stage, loader._layout)


def attach_ring(loader: DataLoader, stage: Stage, layout: SlotLayout) -> None:
    """Make the ring for ``layout`` (sized for the workers and prefetch, or online tuning's budget) and hand it
    to the stage's workers (or the main process's slot pool) and, on the shared stage, to the GPU prefetcher."""
    n = max(2, loader.num_workers * loader.prefetch_factor) if loader.num_workers > 0 else 2
    if loader._online is not None:
        n = loader._online.ring_slots(layout.slot_bytes, loader.prefetch_factor)
    ring = Ring(layout, n, shared=loader.num_workers > 0 and loader.worker_type == "process")
    try:
        if stage.workers is not None:
            stage.workers.attach(ring)
            if loader._online is not None:
                loader._online.configure(stage.workers)
        else:
            stage.slots.attach(ring)
        if loader._res.prefetcher is not None and stage is loader._res.stage:
            with device_scope(loader.device_id):
                loader._res.prefetcher.attach(ring)
    except BaseException:
        if stage.slots.ring is not ring:
            ring.close()
        raise
