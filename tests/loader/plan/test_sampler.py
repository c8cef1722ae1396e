"""The sampler is pure: orders and seeds depend only on (n, batch_size, shuffle, seed, epoch)."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_nwt.loader.plan.order import BatchSampler, batch_seed, epoch_order, fresh_seed, num_batches


def test_sequential_order_and_batches():
    s = BatchSampler(10, 4)
    plan = s.plan(0)
    assert len(s) == len(plan) == 3
    assert [b.tolist() for b in plan] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert s.max_rows == 4


def test_drop_last_drops_only_the_short_batch():
    s = BatchSampler(10, 4, drop_last=True)
    assert len(s) == 2
    assert [b.tolist() for b in s.plan(0)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(BatchSampler(8, 4, drop_last=True)) == 2


def test_shuffle_is_a_reproducible_permutation_per_epoch():
    a = epoch_order(100, shuffle=True, seed=7, epoch=3)
    b = epoch_order(100, shuffle=True, seed=7, epoch=3)
    assert np.array_equal(a, b)
    assert sorted(a.tolist()) == list(range(100))
    assert not np.array_equal(a, epoch_order(100, shuffle=True, seed=7, epoch=4))
    assert not np.array_equal(a, epoch_order(100, shuffle=True, seed=8, epoch=3))
    assert a.dtype == np.int64


def test_every_index_once_per_epoch_with_shuffle():
    s = BatchSampler(1001, 64, shuffle=True, seed=3)
    seen = np.concatenate(list(s.plan(5)))
    assert sorted(seen.tolist()) == list(range(1001))


def test_batch_seed_depends_on_epoch_and_batch_only():
    assert batch_seed(1, 2, 3) == batch_seed(1, 2, 3)
    seeds = {batch_seed(1, e, b) for e in range(4) for b in range(50)}
    assert len(seeds) == 200
    assert all(0 <= x < 2**32 for x in seeds)
    assert batch_seed(1, 0, 0) != batch_seed(2, 0, 0)


def test_fresh_seeds_differ_and_fit_63_bits():
    xs = {fresh_seed() for _ in range(5)}
    assert len(xs) == 5 and all(0 <= x < 2**63 for x in xs)


def test_num_batches_rounding():
    assert num_batches(0, 4, False) == 0
    assert num_batches(3, 4, True) == 0
    assert num_batches(3, 4, False) == 1


@pytest.mark.parametrize("kwargs", [dict(n=-1, batch_size=2), dict(n=4, batch_size=0), dict(n=4, batch_size=2.5),
                                    dict(n=4, batch_size=2, seed=-3)])
def test_invalid_arguments_are_value_errors(kwargs):
    with pytest.raises(ValueError):
        BatchSampler(**kwargs)


def test_out_of_range_batch_is_an_index_error():
    with pytest.raises(IndexError, match="outside"):
        BatchSampler(5, 2).plan(0).indices(3)
