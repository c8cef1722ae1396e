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

from ..errors import LoaderError
from ._device import readonly
from ._ring import SlotLayout
from ._sources import BatchSource, FailedBatch
from ._stats import Clock
from ._tree import OutputTree, join, leaf_frameworks

if TYPE_CHECKING:
    from ._dataloader import DataLoader

T_co = TypeVar("T_co", covariant=True)


class EpochIterator(Iterator[T_co]):
    """One epoch's batches. A batch that failed raises its ``WorkerError`` in its turn and the next
    ``next()`` goes on with the following batch, as PyTorch's iterator does; any other error ends it.

    ``delivered`` counts the turns taken so far (batches and failed batches); ``waited_s`` is the
    time the caller has spent inside ``next()``, that is, waiting for data. The count is also kept in
    the loader's ``track``, which outlives the iterator: a ``for`` loop left by ``break`` or an
    exception drops its iterator, and ``state_dict()`` taken afterwards must still know where it was.
    """

    def __init__(self, steps: Iterator[Any], loader: DataLoader, track: Any = None) -> None:
        self._steps = steps
        self._loader = weakref.ref(loader)
        self._stats = loader._stats  # the loader's figures (``_stats``): the caller's side is counted here
        self._track = track  # the loader's record of this epoch (``_resume.Track``): outlives this iterator
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
        if self._track is not None:
            self._track.delivered = self.delivered
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
                 clock: Clock | None = None, output: str = "auto") -> Iterator[Any]:
    """The source's host batches as the caller gets them on the CPU: copies out of the ring, or
    (``zero_copy``) read-only views whose slot is held until the next batch is asked for. The copies'
    seconds go to ``clock``. Array leaves come back in the framework their samples came in, or as
    ``output`` says (``_frameworks``); with ``zero_copy`` a torch tensor is over the slot itself
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
            try:
                hb = source.next(True)
            except FailedBatch as failed:
                yield failed
                continue
            if hb is None:
                return
            treedef = as_output(hb.treedef if hb.treedef is not None else _layout_treedef(layout()))
            if hb.slot is None:  # made outside the ring: the caller's already
                leaves = _views(hb.leaves, treedef) if zero_copy else hb.leaves
            elif zero_copy:
                leaves = _views(hb.leaves, treedef)
                held = hb
            else:
                t0 = time.perf_counter()
                leaves = [a.copy() for a in hb.leaves]
                if clock is not None:
                    clock.copy_s += time.perf_counter() - t0
                source.release(hb)
            yield join(treedef, leaves, hb.objects)
    finally:
        if held is not None:
            source.release(held)


def _views(leaves: list[Any], treedef: Any) -> list[Any]:
    """Read-only views of a batch's arrays; writable where a torch tensor will be made over them."""
    return [a if fw == "torch" else readonly(a) for a, fw in zip(leaves, leaf_frameworks(treedef))]


def _layout_treedef(layout: SlotLayout | None) -> Any:
    if layout is None:
        raise LoaderError("internal error: a ring batch before the layout was known")
    return layout.treedef
