"""What a loader's epochs run on, and its teardown: held apart from the loader so a finalizer can own it.

``Stage`` bundles the ring, its slot pool and the workers attached to it: it is built in one go once
the layout is known (from the first batch) and dropped in one go, at the end of an epoch or, with
persistent workers, at ``close``. The layout itself outlives a stage: the next one is built from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._prefetch import DevicePrefetcher
from ._ring import Ring
from ._slots import HostBatch, SlotPool
from ._workers import WorkerPool


@dataclass(frozen=True)
class Stage:
    """What an epoch runs on: the ring with its slot pool, and the workers that fill it.

    Built in one go once the layout is known, the ring exists and the workers are attached to it;
    dropped in one go. ``slots`` is None only for ``num_workers=0`` on the CPU (no ring), ``workers``
    whenever ``num_workers=0``.
    """

    slots: SlotPool | None
    workers: WorkerPool | None

    @property
    def ring(self) -> Ring | None:
        return self.slots.ring if self.slots is not None else None

    def hold(self, index: int, leaves: list[np.ndarray]) -> HostBatch:
        """A batch the main process made, ready to hand out: in a ring slot when there is a ring."""
        if self.slots is None:
            return HostBatch(index, None, len(leaves[0]), leaves)
        return self.slots.hold(index, leaves)


class Resources:
    """What must be released: the stage (workers, ring) and the prefetcher. Apart so a finalizer can own it."""

    def __init__(self, prefetcher: DevicePrefetcher | None) -> None:
        self.stage: Stage | None = None
        self.prefetcher = prefetcher

    @property
    def ring(self) -> Ring | None:
        return self.stage.ring if self.stage is not None else None

    def end_epoch(self) -> None:
        """Stop the workers and drop their shared ring (the main process's own ring stays)."""
        if self.stage is not None and self.stage.workers is not None:
            self._drop_stage()

    def _drop_stage(self) -> None:
        stage, self.stage = self.stage, None
        if stage is None:
            self.discard(None, None, self.prefetcher)
        else:
            self.discard(stage.workers, stage.ring, self.prefetcher)

    @staticmethod
    def discard(workers: WorkerPool | None, ring: Ring | None, prefetcher: DevicePrefetcher | None) -> None:
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
        try:
            self._drop_stage()
        finally:
            if self.prefetcher is not None:
                self.prefetcher.close()
