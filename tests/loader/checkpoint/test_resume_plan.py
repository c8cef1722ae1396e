"""The rest of an epoch, at the plan level: every stop point of small datasets, world sizes 1-4 before
and after, shuffle and drop_last on and off. Pure functions, so the whole grid runs in seconds."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from cupy_nwt.loader import BatchSampler
from cupy_nwt.loader.plan.order import epoch_order
from cupy_nwt.loader.plan.remainder import Session, SessionPlan, split_done

GRID = list(itertools.product((10, 11, 12, 13), (2, 3), (False, True), (False, True)))  # n, B, shuffle, drop_last


def fresh(n, B, shuffle, drop_last, W) -> Session:
    return Session(n, B, shuffle, 7, 1, drop_last, W)


def rank_batches(session: Session, rank: int, done=()) -> list[list[int]]:
    return [t[1].tolist() for t in SessionPlan.make(session, rank, done).tasks()]


def delivered_samples(session: Session, done: dict[int, list[int]]) -> set[int]:
    out: set[int] = set()
    for r, bs in done.items():
        batches = rank_batches(session, r)
        for b in bs:
            out.update(batches[b])
    return out


def check_rest(before: set[int], old: Session, new: Session, undelivered: set[int]) -> None:
    """Over the new ranks: nothing delivered again, every undelivered sample once (pads aside), balanced."""
    shards = [[i for b in rank_batches(new, r) for i in b] for r in range(new.world_size)]
    flat = [i for s in shards for i in s]
    assert not set(flat) & before, "a sample delivered before the stop came again"
    m = len(undelivered)
    W2, B = new.world_size, new.batch_size
    if not new.drop_last:
        per = -(-m // W2)
        assert set(flat) == undelivered
        assert len(flat) - len(set(flat)) == per * W2 - m  # only DistributedSampler's pads repeat
        assert all(len(s) == per for s in shards)
    else:
        per = (m // W2) // B * B
        assert len(flat) == len(set(flat)) and set(flat) <= undelivered
        assert all(len(s) == per for s in shards)
    assert len({new.batches(r) for r in range(W2)}) == 1


@pytest.mark.parametrize("n,B,shuffle,drop_last", GRID)
def test_fresh_session_is_the_loaders_own_sampler(n, B, shuffle, drop_last):
    for W in range(1, 5):
        s = fresh(n, B, shuffle, drop_last, W)
        for r in range(W):
            own = BatchSampler(n, B, shuffle, 7, drop_last, r, W).plan(1)
            plan = SessionPlan.make(s, r)
            assert [(b, i.tolist(), seed) for b, i, seed in own.tasks()] == \
                   [(b, i.tolist(), seed) for b, i, seed in plan.tasks()]


@pytest.mark.parametrize("n,B,shuffle,drop_last", GRID)
def test_same_world_resume_at_every_stop_is_the_uninterrupted_rest(n, B, shuffle, drop_last):
    for W in range(1, 5):
        s = fresh(n, B, shuffle, drop_last, W)
        for r in range(W):
            full = [(i.tolist(), seed) for _, i, seed in SessionPlan.make(s, r).tasks()]
            for k in range(len(full) + 1):
                rest = [(i.tolist(), seed) for _, i, seed in SessionPlan.make(s, r, range(k)).tasks()]
                assert rest == full[k:]


@pytest.mark.parametrize("n,B,shuffle,drop_last", GRID)
def test_elastic_every_stop_every_world_size(n, B, shuffle, drop_last):
    """Every old rank stopped after k batches (a loop in lockstep), for every k; 1-4 ranks before and after."""
    for W, W2 in itertools.product(range(1, 5), range(1, 5)):
        old = fresh(n, B, shuffle, drop_last, W)
        for k in range(old.batches(0) + 1):
            done = {r: list(range(k)) for r in range(W)}
            before = delivered_samples(old, done)
            new = old.after(done, W2)
            check_rest(before, old, new, set(range(n)) - before)


@pytest.mark.parametrize("n,B,shuffle,drop_last", GRID)
def test_elastic_after_uneven_and_out_of_order_progress_and_twice(n, B, shuffle, drop_last):
    """Ranks that delivered different batch sets (in_order=False, a rank ahead), then a second hop."""
    rng = random.Random(n * 100 + B * 10 + shuffle * 2 + drop_last)
    for _ in range(30):
        W, W2, W3 = (rng.randint(1, 4) for _ in range(3))
        old = fresh(n, B, shuffle, drop_last, W)
        nb = old.batches(0)
        done = {r: sorted(rng.sample(range(nb), rng.randint(0, nb))) for r in range(W)}
        before = delivered_samples(old, done)
        mid = old.after(done, W2)
        check_rest(before, old, mid, set(range(n)) - before)
        nb2 = mid.batches(0)
        done2 = {r: sorted(rng.sample(range(nb2), rng.randint(0, nb2))) for r in range(W2)}
        before2 = before | delivered_samples(mid, done2)
        last = mid.after(done2, W3)
        check_rest(before2, mid, last, set(range(n)) - before2)


def test_resharded_seeds_differ_from_the_uninterrupted_run():
    old = fresh(12, 3, True, False, 2)
    new = old.after({0: [0], 1: [0]}, 3)
    assert not new.fresh
    seeds_old = {t[2] for r in range(2) for t in SessionPlan.make(old, r).tasks()}
    seeds_new = {t[2] for r in range(3) for t in SessionPlan.make(new, r).tasks()}
    assert not seeds_old & seeds_new


def test_split_done():
    assert split_done([]) == (0, [])
    assert split_done([0, 1, 2]) == (3, [])
    assert split_done([3, 0, 1, 5]) == (2, [3, 5])
    assert split_done([1]) == (0, [1])


def test_state_stays_small_for_a_big_dataset():
    s = Session(10_000_000, 256, True, 0, 0, False, 4)
    new = s.after({r: range(100) for r in range(4)}, 3)
    assert new.base == 100 * 256 * 4 and new.excluded == ()  # a prefix: two ints, no sample list
    order = epoch_order(s.n, shuffle=True, seed=0, epoch=0)
    assert np.array_equal(SessionPlan.make(new, 1).order[:4], order[new.base + 1 : new.base + 12 : 3])
