"""One epoch as the caller sees it: the iterator ``iter(loader)`` returns, and host batches turned
into what it yields.

The iterator is where the caller's side of the pipeline is observed: it counts the batches handed
out (a failed batch counts too: its turn has passed) and the seconds the caller spent inside
``next()`` waiting for them. Resume and the per-stage figures are built on those two numbers.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ...errors import LoaderError
from ..device.place import readonly
from ..ring.ring import SlotLayout
from .sources import BatchSource, FailedBatch
from .._stats import Clock
from ..ring.tree import join

if TYPE_CHECKING:
    from .._dataloader import DataLoader

T_co = TypeVar("T_co", covariant=True)


class EpochIterator(Iterator[T_co]):
    """One epoch's batches. A batch that failed raises its ``WorkerError`` in its turn and the next
    ``next()`` goes on with the following batch, as PyTorch's iterator does; any other error ends it.

    ``delivered`` counts the turns taken so far (batches and failed batches); ``waited_s`` is the
    time the caller has spent inside ``next()``, that is, waiting for data.
    """

    def __init__(self, steps: Iterator[Any], loader: DataLoader) -> None:
        self._steps = steps
        self._loader = weakref.ref(loader)
        self._stats = loader._stats  # the loader's figures (``_stats``): the caller's side is counted here
        self.delivered = 0
        self.waited_s = 0.0

    def __next__(self) -> T_co:
        t0 = time.perf_counter()
        try:
            item = next(self._steps)
        finally:
            waited = time.perf_counter() - t0
            self.waited_s += waited
            self._stats.clock.waited_s += waited
        self.delivered += 1
        self._stats.clock.delivered += 1
        if self.delivered == 1:
            loader = self._loader()
            if loader is not None:
                self._stats.first_batch(loader.worker_pids())
        if isinstance(item, FailedBatch):
            error = item.error
            del self, item  # the traceback must not keep the epoch alive: a dropped iterator frees its slots
            raise error
        return item

    def __len__(self) -> int:
        loader = self._loader()
        if loader is None:
            raise TypeError("the DataLoader of this iterator is gone")
        return len(loader)

    def close(self) -> None:
        """End this epoch now: its workers stop (unless persistent) and its slots are given back."""
        close = getattr(self._steps, "close", None)
        if close is not None:
            close()


def host_batches(source: BatchSource, zero_copy: bool, layout: Callable[[], SlotLayout | None],
                 clock: Clock | None = None) -> Iterator[Any]:
    """The source's host batches as the caller gets them on the CPU: copies out of the ring, or
    (``zero_copy``) read-only views whose slot is held until the next batch is asked for. The copies'
    seconds go to ``clock``.

    A failed batch is yielded as its ``FailedBatch``, for the iterator to raise in its turn.
    """
    held = None
    try:
        while True:
            if held is not None:
                source.release(held)
                held = None
            try:
                hb = source.next(True)
            except FailedBatch as failed:
                yield failed
                continue
            if hb is None:
                return
            if hb.slot is None:  # made outside the ring: the caller's already
                leaves = [readonly(a) for a in hb.leaves] if zero_copy else hb.leaves
            elif zero_copy:
                leaves = [readonly(a) for a in hb.leaves]
                held = hb
            else:
                t0 = time.perf_counter()
                leaves = [a.copy() for a in hb.leaves]
                if clock is not None:
                    clock.copy_s += time.perf_counter() - t0
                source.release(hb)
            treedef = hb.treedef if hb.treedef is not None else _layout_treedef(layout())
            yield join(treedef, leaves, hb.objects)
    finally:
        if held is not None:
            source.release(held)


def _layout_treedef(layout: SlotLayout | None) -> Any:
    if layout is None:
        raise LoaderError("internal error: a ring batch before the layout was known")
    return layout.treedef
