"""What a trainer does to a loader besides iterating it, as Lightning does: an ``iter()`` that takes no
batch (its check that the loader is iterable), ``set_epoch`` on ``loader.sampler`` before each epoch, and
a loaded state with an unused ``iter()`` and a ``set_epoch`` of the same epoch between it and the loop."""

from __future__ import annotations

import numpy as np

from cupy_nwt import DataLoader


def epoch_of(loader: DataLoader) -> list[int]:
    return [int(i) for b in loader for i in b]


def test_an_iter_that_takes_no_batch_uses_up_no_epoch() -> None:
    loader = DataLoader(np.arange(12), batch_size=4, shuffle=True, seed=3, device="cpu")
    first = epoch_of(DataLoader(np.arange(12), batch_size=4, shuffle=True, seed=3, device="cpu"))
    iter(loader)  # made and dropped
    unused = iter(loader)
    assert loader.epoch == 0 and loader.state_dict()["epoch"] == 0
    assert epoch_of(loader) == first and loader.epoch == 1
    del unused


def test_set_epoch_on_the_loaders_sampler_chooses_the_epoch() -> None:
    loader = DataLoader(np.arange(12), batch_size=4, shuffle=True, seed=3, device="cpu")
    orders = []
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)  # Lightning's _set_sampler_epoch
        orders.append(epoch_of(loader))
    loader.sampler.set_epoch(0)
    assert epoch_of(loader) == orders[0] != orders[1]
    assert list(loader.sampler) == orders[1]  # the sampler lists the next epoch


def test_a_loaded_state_survives_an_unused_iter_and_a_set_epoch_of_its_own_epoch() -> None:
    kw = dict(batch_size=2, shuffle=True, seed=5, num_workers=2, device="cpu")
    loader = DataLoader(np.arange(12), **kw)
    loader.set_epoch(1)
    it = iter(loader)
    taken = [next(it).tolist() for _ in range(2)]
    state = loader.state_dict()
    rest = [b.tolist() for b in it]
    again = DataLoader(np.arange(12), **kw)
    again.load_state_dict(state)
    throwaway = iter(again)  # Lightning: the iterable check, then the fetcher's iter(), then set_epoch
    again.sampler.set_epoch(1)
    assert [b.tolist() for b in again] == rest and len(taken) == 2
    del throwaway
