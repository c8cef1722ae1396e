"""What a loader's epochs run on, and its teardown: held apart from the loader so a finalizer can own it.

``Stage`` bundles the slot pool (and its ring, once the layout is known) and the workers that fill
it. A loader's shared stage lives across epochs (persistent workers, or the main process's ring on
the GPU path); every other iteration with workers has a stage of its own, so several iterators of
one loader can be live at once. The layout outlives a stage: the next one is built from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .device.prefetch import DevicePrefetcher
from .ring.ring import Ring
from .ring.slots import SlotPool
from .workers.thread import Workers


@dataclass(frozen=True, eq=False)
class Stage:
    """What an epoch runs on: the slot pool (its ring attached once the layout is known) and the workers.

    ``workers`` is None for ``num_workers=0`` (whose only stage is the GPU path's ring).
    """

    slots: SlotPool
    workers: Workers | None

    @property
    def ring(self) -> Ring | None:
        return self.slots.ring


class Resources:
    """What must be released: the stages (workers, rings) and the prefetcher. Apart so a finalizer can own it."""

    def __init__(self, prefetcher: DevicePrefetcher | None) -> None:
        self.stage: Stage | None = None  # the shared one
        self.loose: list[Stage] = []  # one per live iteration that has its own workers
        self.prefetcher = prefetcher

    @property
    def ring(self) -> Ring | None:
        return self.stage.ring if self.stage is not None else None

    def stages(self) -> list[Stage]:
        return ([self.stage] if self.stage is not None else []) + self.loose

    def end_epoch(self) -> None:
        """Stop the shared stage's workers and drop their ring (the main process's own ring stays)."""
        if self.stage is not None and self.stage.workers is not None:
            self.drop(self.stage)

    def drop(self, stage: Stage) -> None:
        """Stop ``stage``'s workers, then release its ring. Idempotent."""
        if stage is self.stage:
            self.stage = None
            prefetcher = self.prefetcher
        elif stage in self.loose:
            self.loose.remove(stage)
            prefetcher = None
        else:
            return
        self.discard(stage.workers, stage.ring, prefetcher)

    @staticmethod
    def discard(workers: Workers | None, ring: Ring | None, prefetcher: DevicePrefetcher | None) -> None:
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
            for stage in self.stages():
                self.drop(stage)
        finally:
            if self.prefetcher is not None:
                self.prefetcher.close()
