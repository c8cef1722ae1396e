"""Loader resume through real loaders: the rest of an epoch, bitwise with the same settings, the same
with other worker settings, elastic over world sizes, user samplers, the NWT path, and bad states."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cupy_nwt.loader import DataLoader, merge_states
from cupy_nwt.picks.pick import auto_fingerprint
from cupy_nwt.picks.store import TuneResult

pytestmark = pytest.mark.usefixtures("worker_type")  # each test once per kind of worker

N, B = 13, 3


class Ids:
    """Sample i is the int64 array [i]: batches spell the indices they hold."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.array([i], np.int64)


def noisy(batch, seed):
    """A random transform: its output depends on the batch's transform seed."""
    return np.concatenate([batch, np.random.default_rng(seed).integers(0, 1 << 30, (len(batch), 1))], axis=1)


def loader(**kw) -> DataLoader:
    opts = dict(batch_size=B, shuffle=True, seed=11, batch_transform=noisy, device="cpu")
    opts.update(kw)
    return DataLoader(Ids(opts.pop("n", N)), **opts)


def epoch(dl) -> list[list[list[int]]]:
    return [b.tolist() for b in dl]


def stop_after(dl, k: int):
    """Take k batches, save the state through JSON (as a checkpoint would), drop the iterator."""
    it = iter(dl)
    got = [next(it).tolist() for _ in range(k)]
    state = json.loads(json.dumps(dl.state_dict()))
    it.close()
    return got, state


@pytest.mark.parametrize("drop_last", [False, True])
def test_same_settings_every_stop_point_is_bitwise_and_the_next_epoch_follows(drop_last):
    full = loader(drop_last=drop_last)
    first, second = epoch(full), epoch(full)
    for k in range(len(first) + 1):
        got, state = stop_after(loader(drop_last=drop_last), k)
        again = loader(drop_last=drop_last)
        again.load_state_dict(state)
        assert got + epoch(again) == first
        assert epoch(again) == second


@pytest.mark.parametrize("before,after", [
    (dict(num_workers=0), dict(num_workers=2, prefetch_factor=3)),
    (dict(num_workers=2), dict(num_workers=0)),
    (dict(num_workers=2, persistent_workers=True), dict(num_workers=1, prefetch_factor=1)),
    (dict(num_workers=1, prefetch_factor=4), dict(num_workers=2, persistent_workers=True)),
])
def test_other_worker_settings_give_the_same_rest(before, after):
    first = epoch(loader())
    with loader(**before) as a:
        got, state = stop_after(a, 2)
    with loader(**after) as b:
        b.load_state_dict(state)
        assert got + epoch(b) == first


def test_prefetched_batches_are_not_consumed():
    with loader(num_workers=2, prefetch_factor=4) as dl:
        it = iter(dl)
        next(it)
        assert dl.state_dict()["delivered"] == 1  # the workers are well ahead; only one was delivered
        it.close()


def test_a_failed_batch_counts_as_delivered():
    class Flaky(Ids):
        def __getitem__(self, i):
            if i == 5:
                raise ValueError("bad sample")
            return super().__getitem__(i)

    dl = DataLoader(Flaky(), batch_size=B, seed=1)  # no shuffle: sample 5 is in batch 1
    it = iter(dl)
    next(it)
    with pytest.raises(Exception, match="bad sample"):
        next(it)
    assert dl.state_dict()["delivered"] == 2


def test_state_between_epochs_and_before_any():
    dl = loader()
    assert dl.state_dict()["epoch"] == 0 and dl.state_dict()["delivered"] == 0
    epoch(dl)
    sd = dl.state_dict()
    assert (sd["epoch"], sd["delivered"]) == (1, 0)
    it = iter(dl)
    assert dl.state_dict()["epoch"] == 1
    for _ in it:
        pass
    assert (dl.state_dict()["epoch"], dl.state_dict()["delivered"]) == (2, 0)


def test_in_order_false_keeps_the_prefix_and_the_few_beyond():
    full = {tuple(row[:1]) for b in epoch(loader(batch_transform=None)) for row in b}
    with loader(num_workers=2, in_order=False, batch_transform=None) as dl:
        it = iter(dl)
        got = [next(it).tolist() for _ in range(3)]
        state = json.loads(json.dumps(dl.state_dict()))
        it.close()
    assert state["delivered"] + len(state["extra"]) == 3
    again = loader(batch_transform=None)
    again.load_state_dict(state)
    rest = epoch(again)
    seen = [tuple(row) for b in got + rest for row in b]
    assert len(seen) == len(set(seen)) and set(seen) == full


def ranks_rest(states, world, **kw):
    out = []
    for r in range(world):
        dl = loader(rank=r, world_size=world, **kw)
        dl.load_state_dict(states[r] if isinstance(states, list) else states)
        out.append([i for b in epoch(dl) for i in np.asarray(b)[:, 0].tolist()])
    return out


@pytest.mark.parametrize("W,W2,k", [(2, 3, 1), (4, 1, 1), (1, 4, 2), (3, 2, 0), (2, 1, 3)])
def test_elastic_world_size_any_old_ranks_state(W, W2, k):
    before, states = [], []
    for r in range(W):
        got, state = stop_after(loader(rank=r, world_size=W, num_workers=r % 2), k)
        before += [row[0] for b in got for row in b]
        states.append(state)
    rest = ranks_rest(states[-1], W2, num_workers=1)  # one old rank's state serves every new rank
    flat = [i for s in rest for i in s]
    left = set(range(N)) - set(before)
    assert set(flat) == left and not set(flat) & set(before)
    per = -(-len(left) // W2)
    assert all(len(s) == per for s in rest) and len(flat) - len(set(flat)) == per * W2 - len(left)


def test_merge_states_for_ranks_that_delivered_differently():
    W, W2 = 3, 2
    before, states = [], []
    for r, k in enumerate((1, 3, 2)):
        got, state = stop_after(loader(rank=r, world_size=W, n=20), k)
        before += [row[0] for b in got for row in b]
        states.append(state)
    with pytest.raises(ValueError, match="merge_states"):
        ranks_rest(states[0] | {"extra": [2]}, W2, n=20)
    merged = json.loads(json.dumps(merge_states(states)))
    rest = ranks_rest(merged, W2, n=20)
    flat = [i for s in rest for i in s]
    assert set(flat) == set(range(20)) - set(before) and len(rest[0]) == len(rest[1])
    with pytest.raises(ValueError, match="no state for rank"):
        merge_states(states[:2])


def test_user_sampler_fast_forwards_and_a_stateful_one_reloads():
    order = [4, 2, 9, 0, 12, 1, 3, 5, 7, 6, 8, 10, 11]
    full = epoch(DataLoader(Ids(), batch_size=B, sampler=order))
    got, state = stop_after(DataLoader(Ids(), batch_size=B, sampler=order), 2)
    again = DataLoader(Ids(), batch_size=B, sampler=order, num_workers=2)
    again.load_state_dict(state)
    assert got + epoch(again) == full
    again.close()

    class Drawn:
        """A sampler whose order is drawn from a generator it carries: its state is what it will draw."""

        def __init__(self):
            self.rng = np.random.default_rng(3)

        def __iter__(self):
            return iter(self.rng.permutation(N).tolist())

        def __len__(self):
            return N

        def state_dict(self):
            return {"rng": self.rng.bit_generator.state}

        def load_state_dict(self, sd):
            self.rng.bit_generator.state = sd["rng"]

    s1 = Drawn()
    dl = DataLoader(Ids(), batch_size=B, sampler=s1)
    epoch(dl)  # the sampler moves on each epoch
    full = epoch(DataLoader(Ids(), batch_size=B, sampler=_copy(s1)))
    got, state = stop_after(dl, 3)
    fresh = DataLoader(Ids(), batch_size=B, sampler=Drawn())  # its own generator is elsewhere
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert got + epoch(fresh) == full


def test_a_ranks_own_sampler_resumes_on_the_same_ranks_and_another_world_size_is_refused():
    """Each rank's sampler deals that rank's share (as DistributedSampler does): its delivered count means
    nothing on another world size, where it would skip other samples, so that is refused in one line."""
    from cupy_nwt.errors import StateError

    def rank_loader(rank: int, world: int) -> DataLoader:
        return DataLoader(Ids(), batch_size=2, sampler=list(range(rank, N, world)), rank=rank, world_size=world)

    got, state = stop_after(rank_loader(0, 2), 1)  # rank 0 of 2 took [0, 2]
    assert got == [[[0], [2]]]
    same = rank_loader(1, 2)  # ranks in lockstep: rank 0's count is rank 1's too
    same.load_state_dict(state)
    assert [row[0] for b in epoch(same) for row in b] == [5, 7, 9, 11]
    with pytest.raises(StateError, match=r"world_size=2: a user sampler's delivered batches were counted on 2 rank"):
        rank_loader(0, 3).load_state_dict(state)
    with pytest.raises(StateError, match=r"extra=\[2\]: rank 0's batches delivered out of order"):
        rank_loader(1, 2).load_state_dict(state | {"extra": [2]})  # as in_order=False may leave it


def test_a_loader_made_before_its_process_group_checks_a_state_against_the_groups_ranks(monkeypatch):
    """Lightning's order: the loader is made, then the group is initialised, then the checkpoint is loaded."""
    import sys
    import types

    got, state = stop_after(DataLoader(Ids(), batch_size=2, sampler=list(range(0, N, 2)), rank=0, world_size=2), 1)
    early = DataLoader(Ids(), batch_size=2, sampler=list(range(1, N, 2)))  # no group yet: one process
    group = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                  get_world_size=lambda: 2, get_rank=lambda: 1)
    monkeypatch.setitem(sys.modules, "torch.distributed", group)
    early.load_state_dict(state)
    assert (early.rank, early.world_size) == (1, 2)
    assert [row[0] for b in epoch(early) for row in b] == [5, 7, 9, 11]


def _copy(sampler):
    import copy

    return copy.deepcopy(sampler)


def _saved_pick(workers: int) -> None:
    """The pick ``num_workers="auto"`` finds for ``loader()``'s work on this machine."""
    fp = auto_fingerprint(Ids(N), batch_size=B, batch_transform=noisy, device="cpu")
    TuneResult(workers, "fast", (), 4, 8, 0.5, 0.02, B, 2, False, "cpu", fingerprint=fp).save_pick()


def test_nwt_auto_resumes_with_whatever_count_is_picked(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "here"))
    _saved_pick(2)
    first = epoch(loader())
    a = loader(num_workers="auto")
    assert a.num_workers == 2
    got, state = stop_after(a, 3)
    a.close()
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "there"))
    _saved_pick(0)
    b = loader(num_workers="auto")  # the new machine picks another count
    assert b.num_workers == 0
    b.load_state_dict(state)
    assert got + epoch(b) == first


def test_states_that_do_not_fit_are_refused_in_one_line():
    _, state = stop_after(loader(), 1)
    for bad, what in ((dict(seed=12), "seed"), (dict(n=14), "n="), (dict(batch_size=2), "batch_size"),
                      (dict(shuffle=False), "shuffle"), (dict(drop_last=True), "drop_last")):
        with pytest.raises(ValueError, match=what):
            loader(**bad).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        loader().load_state_dict({"version": 99})
    with pytest.raises(ValueError, match="'map' loader"):
        DataLoader(Ids(), batch_size=B, sampler=list(range(N))).load_state_dict(state)


def test_the_state_is_small_for_a_big_dataset():
    dl = DataLoader(Ids(1_000_000), batch_size=64, shuffle=True, seed=0)
    it = iter(dl)
    for _ in range(5):
        next(it)
    assert len(json.dumps(dl.state_dict())) < 400
    it.close()


@pytest.mark.gpu
def test_gpu_resume_is_the_rest_of_the_epoch():
    full = [b.get().tolist() for b in loader(device="cuda", output="cupy", num_workers=2, pin_memory=True)]
    dl = loader(device="cuda", output="cupy", num_workers=2, pin_memory=True)
    it = iter(dl)
    got = [next(it).get().tolist() for _ in range(2)]
    state = dl.state_dict()
    assert state["delivered"] == 2  # the prefetcher's batch in flight is not consumed
    it.close()
    dl.close()
    again = loader(device="cuda", output="cupy")
    again.load_state_dict(state)
    assert got + [b.get().tolist() for b in again] == full
