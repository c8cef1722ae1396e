"""A dropped iterator of persistent workers: workers and ring go with the last reference, whichever
object held it (the loader, or the iterator that alone keeps the loader, as PyTorch's does).

Each test records its own workers (the pids its samples report) and its own rings (those of this
process that appeared during the test: anonymous memory, or a ``/dev/shm`` name carrying its pid),
never anything of other runs.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref

import numpy as np
import pytest
from pids import alive

import cupy_nwt
from cupy_nwt.loader.ring.ring import live_segments


class WhoMadeIt:
    """Each sample names the process and thread that read it."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array([os.getpid(), threading.get_ident()], np.int64)


def my_rings() -> set[str]:
    return live_segments(os.getpid())



def gone_within(seconds: float, check) -> bool:
    """The contract's one second: shutdown is synchronous, the slack is for the kernel's bookkeeping."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def makers(batches) -> set[int]:
    return {int(p) for b in batches for p in np.asarray(b)[:, 0]}


def persistent(worker_type: str = "process") -> cupy_nwt.DataLoader:
    return cupy_nwt.DataLoader(WhoMadeIt(), batch_size=4, num_workers=2, persistent_workers=True, device="cpu",
                               worker_type=worker_type)


def test_an_iterator_of_a_loader_nobody_names_frees_its_workers_and_ring():
    before = my_rings()
    it = iter(persistent())
    seen = []
    for batch in it:
        seen.append(batch)
        if len(makers(seen)) == 2:
            break
    pids, rings = makers(seen), my_rings() - before
    assert len(pids) == 2 and os.getpid() not in pids and len(rings) == 1 and all(map(alive, pids))
    del it, batch
    assert gone_within(1.0, lambda: not any(map(alive, pids)) and not rings & my_rings())


def test_a_named_loader_keeps_its_persistent_workers_until_it_goes():
    before = my_rings()
    loader = persistent()
    it = iter(loader)
    pids = makers([next(it) for _ in range(8)])
    rings = my_rings() - before
    del it
    assert all(map(alive, pids)) and rings <= my_rings(), "persistent workers stay with their loader"
    assert makers(loader) == pids  # the next epoch on the same workers
    del loader
    assert gone_within(1.0, lambda: not any(map(alive, pids)) and not rings & my_rings())


def test_the_iterator_keeps_the_loader_it_came_from():
    loader = persistent()
    it = iter(loader)
    first = [next(it)]
    pids = makers(first)
    del loader  # the iterator alone holds it now: the epoch goes on to its end
    rest = list(it)
    assert len(first) + len(rest) == 16
    del it
    assert gone_within(1.0, lambda: not any(map(alive, pids)))


def test_thread_workers_of_a_dropped_iterator_end():
    it = iter(persistent("thread"))
    seen = [next(it) for _ in range(8)]
    idents = {int(t) for b in seen for t in np.asarray(b)[:, 1]} - {threading.get_ident()}
    assert idents
    del it, seen
    assert gone_within(1.0, lambda: not idents & {t.ident for t in threading.enumerate()})



class FailsAt6(WhoMadeIt):
    def __getitem__(self, i: int) -> np.ndarray:
        if i == 6:
            raise RuntimeError("sample 6 is broken")
        return super().__getitem__(i)


def iterate_to_the_error(loader: cupy_nwt.DataLoader) -> weakref.ref:
    """Returns with the iterator in its frame, which the error's traceback holds."""
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="sample 6 is broken"):
        next(it)
    return weakref.ref(it)


@pytest.mark.parametrize(("num_workers", "worker_type"), [(0, "process"), (2, "process"), (2, "thread")])
def test_an_iterator_dropped_after_a_batch_s_error_goes_with_its_last_reference(num_workers, worker_type):
    """Not at the cyclic collector's next run: till then its workers would go on, and a thread worker would be
    beside every process forked meanwhile (a later loader's workers)."""
    loader = cupy_nwt.DataLoader(FailsAt6(), batch_size=4, num_workers=num_workers, device="cpu",
                                 worker_type=worker_type)
    collecting = gc.isenabled()
    gc.disable()
    try:
        gone = iterate_to_the_error(loader)
        del loader
        assert gone() is None
    finally:
        if collecting:
            gc.enable()

class Stream:
    """A stream whose record 9 is broken: the iterator that met it stays in the caller's hands."""

    def __iter__(self):
        for i in range(24):
            if i == 9:
                raise ValueError("record 9 is broken")
            yield np.int64(i)


def test_close_ends_the_iterators_the_caller_still_holds():
    """``close()`` frees every ring at once, not when the caller lets go of an iterator: one that met an error,
    and one still mid-epoch, whose batch views would otherwise keep their ring mapped."""
    before = my_rings()
    loader = cupy_nwt.DataLoader(Stream(), batch_size=4, num_workers=2, device="cpu")
    failed = iter(loader)
    try:
        for _ in range(10):
            next(failed)
    except ValueError:
        pass
    other = cupy_nwt.DataLoader(np.arange(64), batch_size=4, num_workers=2, device="cpu")
    middle = iter(other)
    next(middle)
    assert my_rings() - before
    loader.close()
    other.close()
    assert my_rings() - before == set()
    assert next(failed, None) is None and next(middle, None) is None
