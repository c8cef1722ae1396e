"""Each reader's own state in a loader state (``checkpoint.readers``): kept small and checked, and what another
layout of readers keeps.

A dataset whose state does not pickle, or is huge, is refused at ``state_dict()`` in one line while
iteration goes on; a map-style state resumes its sample order under another worker count, its dataset
states dropped with a one-line warning; thread workers sharing one map-style dataset are one reader.
"""

from __future__ import annotations

import pickle
import sys
import warnings
from multiprocessing import resource_sharer

import numpy as np
import pytest

import cupy_nwt
from cupy_nwt.loader import merge_states
from cupy_nwt.loader.checkpoint.readers import MAX_STATE_BYTES

N = 12


class Counted:
    """Sample i is 100 * i plus how many samples this copy made: a state of its own."""

    def __init__(self) -> None:
        self.made = 0

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        self.made += 1
        return 100 * i + self.made

    def state_dict(self) -> dict:
        return {"made": self.made}

    def load_state_dict(self, sd: dict) -> None:
        self.made = sd["made"]


class Unpicklable(Counted):
    def state_dict(self) -> dict:
        return {"made": self.made, "handle": lambda: None}


class Handle:
    """An object whose pickling fails with a message that names no pickling (as a local object's does on
    Python 3.13: "Can't get local object")."""

    def __reduce__(self):
        raise AttributeError("no handle here")


class HoldsHandle(Counted):
    def state_dict(self) -> dict:
        return {"made": self.made, "handle": Handle()}


class Huge(Counted):
    def state_dict(self) -> dict:
        return {"made": self.made, "cache": b"x" * (MAX_STATE_BYTES + 1)}


def loader(dataset, **kw) -> cupy_nwt.DataLoader:
    return cupy_nwt.DataLoader(dataset, batch_size=2, device="cpu", seed=0, **kw)


def samples(batches) -> list[int]:
    return [int(x) for b in batches for x in np.asarray(b).ravel()]


@pytest.mark.parametrize(("dataset", "words"), [(Unpicklable, "(?i:pickle)"), (HoldsHandle, "does not pickle.*no handle"),
                                                (Huge, "over the 64 MiB limit")])
@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_state_that_a_checkpoint_could_not_hold_is_refused_in_one_line(dataset, words, num_workers):
    """Refused at ``state_dict()``, naming the reader; the epoch goes on whole."""
    with loader(dataset(), num_workers=num_workers) as dl:
        it = iter(dl)
        got = samples([next(it)])
        with pytest.raises(cupy_nwt.StateError, match=rf"^state_dict: .*{words}") as caught:
            dl.state_dict()
        assert "\n" not in str(caught.value)
        got += samples(it)
    assert sorted(x // 100 for x in got) == list(range(N))


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_a_map_dataset_resumes_its_own_state_in_each_reader(num_workers):
    """One process worker reads its own copy, as two do: its saved state reaches it, not the main process's."""
    with loader(Counted(), num_workers=num_workers) as dl:
        whole = samples(dl)
    with loader(Counted(), num_workers=num_workers) as dl:
        it = iter(dl)
        head = samples([next(it) for _ in range(2)])
        state = pickle.loads(pickle.dumps(dl.state_dict()))
    with loader(Counted(), num_workers=num_workers) as again:
        again.load_state_dict(state)
        assert head + samples(again) == whole



class CountedInTensor(Counted):
    """Its state a torch tensor, as a saved generator state is (``torch.get_rng_state()``)."""

    def state_dict(self) -> dict:
        return {"made": sys.modules["torch"].tensor([self.made])}

    def load_state_dict(self, sd: dict) -> None:
        self.made = int(sd["made"][0])


def test_a_torch_tensor_in_a_saved_state_reaches_the_workers_without_multiprocessing_s_resource_sharer(monkeypatch):
    """Whose thread, once started, runs in this process for good, beside every worker forked after it."""
    pytest.importorskip("torch", reason="a torch tensor in a state")
    shared: list[int] = []
    share = resource_sharer.DupFd
    monkeypatch.setattr(resource_sharer, "DupFd", lambda fd: shared.append(fd) or share(fd))
    with loader(CountedInTensor(), num_workers=2, worker_type="process") as dl:
        whole = samples(dl)
        it = iter(dl)
        head = samples([next(it) for _ in range(2)])
        state = dl.state_dict()
    with loader(CountedInTensor(), num_workers=2, worker_type="process") as again:
        again.load_state_dict(state)
        assert head + samples(again) == whole
    assert shared == []

@pytest.mark.parametrize("layout", [{"num_workers": 0}, {"num_workers": 1}, {"num_workers": 2},
                                    {"num_workers": 2, "persistent_workers": True}], ids=["0", "1", "2", "2-persistent"])
def test_a_state_whose_rest_is_empty_still_carries_the_dataset_into_the_next_epoch(layout):
    """Every batch taken, the loop never asking for one more (torchdata's TestSnapshotEnd): the resumed rest is
    empty, and the next epoch is the uninterrupted run's, reading on from the dataset's saved state."""
    with loader(Counted(), **layout) as dl:
        it = iter(dl)
        for _ in range(len(dl)):
            next(it)
        state = pickle.loads(pickle.dumps(dl.state_dict()))
        it.close()
        expected = samples(dl)
    assert sorted(x // 100 for x in expected) == list(range(N))
    with loader(Counted(), **layout) as again:
        again.load_state_dict(state)
        assert samples(again) == []
        assert samples(again) == expected


def test_a_map_state_under_another_worker_count_keeps_its_order_and_warns_once_of_the_dataset_states():
    with loader(Counted(), num_workers=2) as dl:
        it = iter(dl)
        head = samples([next(it) for _ in range(2)])
        state = pickle.loads(pickle.dumps(dl.state_dict()))
    assert [p["dataset"] for p in state["workers"]] == [{"made": 2}, {"made": 2}]
    with loader(Counted(), num_workers=1) as again, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again.load_state_dict(state)
        rest = samples(again)
    said = [str(w.message) for w in caught if "load_state_dict" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0] and "2 reader(s)" in said[0] and "1 of rank 0" in said[0]
    assert [x // 100 for x in head + rest] == list(range(N))  # the order resumes exactly
    assert rest[0] % 100 == 1  # the dataset starts from its own state


def test_a_stream_state_under_another_worker_count_is_refused():
    class Stream:
        def __iter__(self):
            info = cupy_nwt.get_worker_info()
            w, k = (0, 1) if info is None else (info.id, info.num_workers)
            return iter(range(w, N, k))

    with cupy_nwt.DataLoader(Stream(), batch_size=2, num_workers=2, device="cpu") as dl:
        it = iter(dl)
        next(it)
        state = dl.state_dict()
    with pytest.raises(cupy_nwt.StateError, match="same layout"):
        cupy_nwt.DataLoader(Stream(), batch_size=2, num_workers=1, device="cpu").load_state_dict(state)


def test_thread_workers_sharing_a_map_dataset_save_it_as_one_reader():
    """One object, one state: restored once, before any thread reads it."""
    with loader(Counted(), num_workers=2, worker_type="thread") as dl:
        it = iter(dl)
        next(it)
        state = dl.state_dict()
        rest = samples(it)
    assert len(state["workers"]) == 1 and state["workers"][0]["dataset"]["made"] >= 2
    with loader(Counted(), num_workers=1, worker_type="thread") as again:
        again.load_state_dict(state)
        got = samples(again)
    assert [x // 100 for x in got] == [x // 100 for x in rest]
    assert min(x % 100 for x in got) > state["workers"][0]["dataset"]["made"]


def test_merging_ranks_leaves_their_dataset_states_out_and_says_so():
    states = []
    for r in range(2):
        with loader(Counted(), rank=r, world_size=2) as dl:
            it = iter(dl)
            next(it)
            states.append(dl.state_dict())
    with pytest.warns(UserWarning, match="merge_states: the ranks' dataset states"):
        merged = merge_states(states)
    assert merged["workers"] == [None]
    with loader(Counted(), rank=0, world_size=1) as dl:
        dl.load_state_dict(merged)
        assert len(samples(dl)) == N - 4
