"""The loader's events, as a program listening to its pipeline hears them (``LoaderParts(listeners=...)``),
and the worker kinds' registry."""

from __future__ import annotations

import numpy as np
import pytest
from test_faults import clean  # noqa: F401 - the fixture used below
from toy_data import Squares

from cupy_nwt import DataLoader
from cupy_nwt.loader import Listener, LoaderParts, StageTimes
from cupy_nwt.loader.workers.kinds import KINDS, WORKER_TYPES, kind


class Heard(Listener):
    """Everything it hears, by event."""

    def __init__(self) -> None:
        self.times: list[StageTimes] = []
        self.turns: list[tuple[int, bool]] = []
        self.copies: list[float] = []
        self.epochs: list[int] = []
        self.firsts = self.ends = 0

    def began(self, epoch):
        self.epochs.append(epoch)

    def made(self, times):
        self.times.append(times)

    def waited(self, epoch, seconds, delivered):
        assert seconds >= 0
        self.turns.append((epoch, delivered))

    def copied(self, seconds):
        self.copies.append(seconds)

    def first_batch(self, pids):
        self.firsts += 1

    def ended(self, pids):
        self.ends += 1


def plus_one(batch, seed):
    img, y = batch
    return img + np.uint8(1), y


@pytest.mark.usefixtures("clean", "worker_type")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_listener_hears_each_batch_made_with_its_stage_times_and_each_turn(num_workers):
    heard = Heard()
    with DataLoader(Squares(40), batch_size=4, num_workers=num_workers, device="cpu", batch_transform=plus_one,
                    parts=LoaderParts(listeners=(heard,))) as dl:
        for epoch in range(2):
            assert len(list(dl)) == 10
    assert heard.epochs == [0, 1]
    assert len(heard.times) == 20 and all(isinstance(t, StageTimes) for t in heard.times)
    assert all(t.fetch_s > 0 and t.transform_s > 0 and t.total() >= t.fetch_s for t in heard.times)
    assert heard.turns == [*[(0, True)] * 10, (0, False), *[(1, True)] * 10, (1, False)]  # False: the StopIteration
    assert heard.firsts == 2 and heard.ends == (2 if num_workers else 0)
    if num_workers == 0:
        assert heard.copies == []  # on the host the main process makes batches in the caller's own arrays
    else:  # copied out of the ring, all but the first few (made before the ring, handed over whole)
        assert 0 < len(heard.copies) < 20 and all(c >= 0 for c in heard.copies)


@pytest.mark.usefixtures("clean")
def test_stats_sum_every_field_of_stage_times():
    with DataLoader(Squares(40), batch_size=4, num_workers=1, device="cpu", batch_transform=plus_one) as dl:
        list(dl)
        s = dl.stats()
    assert isinstance(s.stages, StageTimes) and s.made == 10
    d = s.to_dict()
    for name in StageTimes.names():
        assert d[name] == getattr(s.stages, name) == getattr(s, name)
    assert s.busy_fraction is not None and s.busy_fraction > 0


def test_stage_times_travel_as_their_numbers():
    import pickle

    t = StageTimes(0.5, 0.25, 0.125)
    assert pickle.loads(pickle.dumps(t)) == t and t.total() == 0.875
    assert b"fetch_s" not in pickle.dumps(t)  # per batch across a pipe: no field names


def test_worker_kinds_come_from_one_registry():
    assert WORKER_TYPES == tuple(KINDS) == ("process", "thread")
    assert kind("process").processes and not kind("thread").processes
    assert kind("thread").start_method(None, "cpu") == "thread"
    with pytest.raises(ValueError, match="worker_type must be 'process' or 'thread', got 'fiber'"):
        kind("fiber")


class RingsMade(Listener):
    """Each ring the loader makes, and how many batches had been handed out when it came."""

    def __init__(self) -> None:
        self.turns = 0
        self.rings: list[tuple[int, int]] = []

    def waited(self, epoch, seconds, delivered):
        self.turns += delivered

    def ring_made(self, slot_bytes, pool):
        self.rings.append((self.turns, slot_bytes))


@pytest.mark.usefixtures("clean", "worker_type")
@pytest.mark.parametrize("persistent", [False, True])
def test_the_first_batch_shows_the_layout_once_and_later_workshops_start_with_their_ring(persistent):
    """The first epoch's ring is made from its first batch (before that batch is handed out); fresh workers of a later
    epoch get a ring of the same layout as they start, and persistent ones keep theirs."""
    rings = RingsMade()
    with DataLoader(Squares(40), batch_size=4, num_workers=2, device="cpu", persistent_workers=persistent,
                    parts=LoaderParts(listeners=(rings,))) as dl:
        for epoch in range(3):
            assert len(list(dl)) == 10
            assert dl.layout is not None
    slot = dl.layout.slot_bytes
    assert rings.rings == ([(0, slot)] if persistent else [(0, slot), (10, slot), (20, slot)])
