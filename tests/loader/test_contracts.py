"""The loader's internal contracts: the slot pool, the worker messages, the source and CUDA-ops protocols."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
from test_prefetch import LazyCuda
from toy_data import Squares

from cupy_nwt import DataLoader, WorkerError
from cupy_nwt.loader import LoaderParts
from cupy_nwt.loader.device.prefetch import STAGING_BUFFERS, CudaOps, PrefetchOps
from cupy_nwt.loader.epoch.sources import InlineSource, WorkerSource
from cupy_nwt.loader.plan.order import BatchSampler
from cupy_nwt.loader.ring.ring import Ring, SlotLayout
from cupy_nwt.loader.ring.slots import RETIRED, BatchSource, SlotPool
from cupy_nwt.loader.workers.maker import BatchMaker
from cupy_nwt.loader.workers.messages import ErrorReport, InitFailed, Ok, Raised, RingMsg, Skipped, Stop, Task

pytestmark = pytest.mark.usefixtures("worker_type")


def small_ring(slots: int = 3) -> Ring:
    layout = SlotLayout.for_batch((np.zeros((4, 2), np.float32), np.zeros(4, np.int64)), 4)
    return Ring(layout, slots, shared=False)


# ---------------------------------------------------------------- the slot pool


def test_slots_rotate_oldest_released_first_and_run_out():
    with small_ring(3) as ring:
        pool = SlotPool(ring)
        assert [pool.take(), pool.take(), pool.take()] == [0, 1, 2]
        assert pool.take() is None  # exhausted: the caller waits or stops submitting
        pool.release(1)
        pool.release(0)
        assert pool.take() == 1
        pool.put_back(1)  # a take that was not filled goes to the front
        assert list(pool.free) == [1, 0]


def test_a_new_generation_is_published_in_the_ring_header_and_retire_outdates_all():
    with small_ring() as ring:
        pool = SlotPool(ring)
        assert pool.generation == ring.generation == 0
        assert pool.new_generation() == 1 and ring.generation == 1
        pool.retire()
        assert ring.generation == RETIRED and pool.generation == 1


def test_a_stale_generation_result_frees_its_slot_and_is_not_delivered():
    with small_ring(2) as ring:
        pool = SlotPool(ring)
        old = pool.generation
        slot = pool.take()
        pool.new_generation()  # the epoch the task was for was abandoned
        assert not pool.accept(old, slot)
        assert slot in pool.free
        current = pool.take()
        assert pool.accept(pool.generation, current)
        assert current not in pool.free  # delivered: the consumer releases it later


def test_hold_copies_a_batch_made_elsewhere_into_a_slot():
    with small_ring(2) as ring:
        pool = SlotPool(ring)
        leaves = [np.arange(6, dtype=np.float32).reshape(3, 2), np.array([7, 8, 9])]
        hb = pool.hold(0, leaves)
        assert (hb.index, hb.rows) == (0, 3) and list(pool.free) == [1 - hb.slot]
        assert all(np.array_equal(a, b) for a, b in zip(hb.leaves, leaves))
        assert np.shares_memory(hb.leaves[0], ring.buffer)
        pool.take()
        with pytest.raises(RuntimeError, match="no free ring slot"):
            pool.hold(1, leaves)


# ---------------------------------------------------------------- messages


def report() -> ErrorReport:
    try:
        raise KeyError("sample 7 is missing")
    except KeyError as exc:
        return ErrorReport.from_exception(exc, 7)


def test_error_report_keeps_type_text_traceback_and_the_exception():
    r = report()
    d = r.to_dict()
    assert d["exc_type"] == "KeyError" and "sample 7 is missing" in d["message"] and d["sample_index"] == 7
    assert "raise KeyError" in d["traceback"]
    assert isinstance(pickle.loads(d["pickled"]), KeyError)
    try:
        raise ValueError("x")
    except ValueError as exc:
        assert ErrorReport.from_exception(exc, None, keep_object=False).pickled is None


@pytest.mark.parametrize("msg", [
    Task(3, 11, 2, np.arange(5), 99), Ok(3, 11, 2, 5), Skipped(3, 11, 2), Stop(),
    Raised(3, 11, 2, report()), InitFailed(report()),
    RingMsg("cupy_nwt_1_ab", SlotLayout.for_batch(np.zeros((2, 3)), 2), 4),
], ids=lambda m: type(m).__name__)
def test_messages_round_trip_through_pickle(msg):
    back = pickle.loads(pickle.dumps(msg))
    assert type(back) is type(msg)
    for name in msg.__slots__:
        a, b = getattr(msg, name), getattr(back, name)
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
    assert not hasattr(msg, "__dict__")
    for name in msg.__slots__:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(msg, name, None)


def test_a_result_message_pickles_about_as_small_as_a_tagged_tuple():
    assert len(pickle.dumps(Ok(3, 11, 2, 5))) <= len(pickle.dumps(("ok", 3, 11, 2, 5))) + 32


# ---------------------------------------------------------------- protocols


def test_both_sources_and_both_ops_meet_their_protocols() -> None:
    ops: PrefetchOps = LazyCuda()  # mypy checks the fake against the protocol too
    assert isinstance(ops, PrefetchOps) and isinstance(CudaOps(), PrefetchOps)
    assert issubclass(InlineSource, BatchSource) and issubclass(WorkerSource, BatchSource)


def test_a_failed_batch_on_the_inline_device_path_leaves_every_slot_free_for_the_next_epoch():
    """num_workers=0 with a prefetcher: the batch in flight when batch n+1 fails is still given back."""

    class FailsOnce(Squares):
        armed = True

        def __getitem__(self, i):
            if self.armed and i == 13:
                type(self).armed = False
                raise OSError("disk hiccup")
            return super().__getitem__(i)

    ops = LazyCuda()  # as if on a GPU: the main process's ring and the prefetcher, run by the fake
    dl = DataLoader(FailsOnce(40, modulo=200), batch_size=4, device="cuda", pin_memory=True, parts=LoaderParts(ops=ops))
    with dl:
        with pytest.raises(WorkerError, match="disk hiccup"):
            for b in dl:
                ops.consume(b)
        assert dl.slots_in_use() == 0 and dl.layout is not None
        got = [ops.consume(b)[1].tolist() for b in dl]
        assert got == [list(range(i, min(i + 4, 40))) for i in range(0, 40, 4)]
        assert dl.slots_in_use() == 0


def test_inline_source_alone_makes_its_own_pool_and_delivers_a_held_first_batch():
    ds = Squares(10, modulo=200)
    plan = BatchSampler(10, 4, shuffle=False, seed=0).plan(0)
    maker = BatchMaker(ds, None, None)
    first = maker.make(plan.indices(0), 0)
    layout = SlotLayout.for_batch(first, 4)
    with Ring(layout, 2, shared=False) as ring:
        pool = SlotPool(ring)
        held = pool.hold(0, [np.asarray(x) for x in first])
        source = InlineSource(maker, plan, ring, pool, first=held)
        hb = source.next(True)
        assert hb is held and source.next(True).index == 1
        assert source.next(False) is None  # both slots are taken, none released
        source.release(hb)
        assert source.next(True).index == 2 and source.next(True) is None
        alone = InlineSource(maker, plan, ring)
        assert alone.slots is not pool and len(alone.free) == 2


@pytest.mark.parametrize("pin", [True, "staging"])
@pytest.mark.parametrize("failing", ["empty", "h2d"])
def test_a_copy_failing_half_way_gives_its_slot_and_staging_buffer_back(pin, failing):
    class FailsOnce(LazyCuda):
        calls = 0

        def __getattribute__(self, name):
            if name == failing:
                self.calls += 1
                if self.calls == 5:
                    raise MemoryError(f"{failing} failed")
            return super().__getattribute__(name)

    def loader(ops):  # as if on a GPU: the main process's ring and the prefetcher, run by the fake
        return DataLoader(Squares(40, modulo=200), batch_size=4, device="cuda", pin_memory=pin, parts=LoaderParts(ops=ops))

    whole = LazyCuda()
    with loader(whole) as dl:
        assert len([whole.consume(b) for b in dl]) == 10
    assert whole.pinned_count < STAGING_BUFFERS  # so a staging buffer kept back would show as one more made
    ops = FailsOnce()
    with loader(ops) as dl:
        with pytest.raises(MemoryError):
            for b in dl:
                ops.consume(b)
        assert dl.slots_in_use() == 0 and dl.layout is not None
        assert len([ops.consume(b) for b in dl]) == 10
        assert ops.pinned_count == whole.pinned_count  # every staging buffer came back
