"""``state_dict()`` taken after the loop was left early resumes at the next undelivered batch.

The user's script: 2,000 samples, a loop left mid-epoch (``break``, an exception, Ctrl-C), the state
saved *after* the loop, a new loader that loads it and runs: together the two runs deliver every
sample exactly once. After an epoch that really ended, the state is the next epoch's start. Where
torchdata's ``StatefulDataLoader`` defines the behaviour, it runs the same script.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from toy_data import Indices, ShardedIndices

import cupy_nwt

N, B = 2000, 16
LAYOUTS = [pytest.param({"num_workers": 0}, id="inline"),
           pytest.param({"num_workers": 2}, id="processes"),
           pytest.param({"num_workers": 2, "worker_type": "thread"}, id="threads")]


def make(dataset, layout: dict) -> cupy_nwt.DataLoader:
    shuffle = {"shuffle": True} if isinstance(dataset, Indices) else {}
    return cupy_nwt.DataLoader(dataset, batch_size=B, seed=7, **shuffle, **layout)


def leave_early(loader: cupy_nwt.DataLoader, stop_after: int, how: str) -> list[int]:
    """The training loop, left after ``stop_after`` batches; what it got."""
    seen: list[int] = []
    try:
        for i, batch in enumerate(loader):
            seen += batch.tolist()
            if i + 1 == stop_after:
                if how == "break":
                    break
                raise {"exception": RuntimeError, "ctrl-c": KeyboardInterrupt}[how]("stopped by the user")
    except (RuntimeError, KeyboardInterrupt):
        pass
    return seen


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["map", "iterable"])
@pytest.mark.parametrize("how", ["break", "exception", "ctrl-c"])
def test_state_saved_after_leaving_the_loop_resumes_at_the_next_batch(kind: str, layout: dict, how: str) -> None:
    dataset = Indices(N) if kind == "map" else ShardedIndices(N)
    first = make(dataset, layout)
    seen = leave_early(first, 73, how)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    assert state["epoch"] == 0
    again = make(dataset, layout)
    again.load_state_dict(state)
    rest = [x for batch in again for x in batch.tolist()]
    again.close()
    assert len(seen) == 73 * B
    assert sorted(seen + rest) == list(range(N))  # no sample skipped, none repeated


@pytest.mark.parametrize("layout", LAYOUTS)
def test_state_after_an_epoch_that_ended_is_the_next_epoch(layout: dict) -> None:
    loader = make(Indices(N), layout)
    assert sum(len(b) for b in loader) == N
    state = loader.state_dict()
    assert (state["epoch"], state["delivered"]) == (1, 0)
    again = make(Indices(N), layout)
    again.load_state_dict(state)
    second = [x for b in again for x in b.tolist()]
    assert sorted(second) == list(range(N))
    assert again.state_dict()["epoch"] == 2
    loader.close()
    again.close()


def test_every_batch_taken_without_the_end_resumes_to_an_empty_rest() -> None:
    """All batches delivered but the loop never asked for one more: the rest of that epoch is empty,
    the iteration after it the next epoch (torchdata's StatefulDataLoader does the same)."""
    loader = make(Indices(N), {"num_workers": 0})
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    state = loader.state_dict()
    again = make(Indices(N), {"num_workers": 0})
    again.load_state_dict(state)
    assert list(again) == []
    assert sum(len(b) for b in again) == N


def test_set_epoch_after_a_break_chooses_that_epoch() -> None:
    loader = make(Indices(N), {"num_workers": 0})
    leave_early(loader, 3, "break")
    loader.set_epoch(5)
    assert (loader.state_dict()["epoch"], loader.state_dict()["delivered"]) == (5, 0)


def test_a_loaded_state_is_what_state_dict_says_until_it_runs() -> None:
    loader = make(Indices(N), {"num_workers": 0})
    leave_early(loader, 3, "break")
    state = loader.state_dict()
    other = make(Indices(N), {"num_workers": 0})
    leave_early(other, 10, "break")
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_torchdata_stateful_dataloader_agrees_after_break() -> None:
    torch = pytest.importorskip("torch", reason="torch is a test-only extra")
    sdl = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is a test-only extra")
    data = list(range(N))
    results = {}
    for name, cls, kw in (("torchdata", sdl.StatefulDataLoader, {"generator": torch.Generator().manual_seed(7)}),
                          ("cupy_nwt", cupy_nwt.DataLoader, {"seed": 7})):
        first = cls(data, batch_size=B, shuffle=True, **kw)
        seen = []
        for i, batch in enumerate(first):
            seen += np.asarray(batch).tolist()
            if i == 72:
                break
        state = first.state_dict()
        again = cls(data, batch_size=B, shuffle=True, **kw)
        again.load_state_dict(state)
        rest = [x for batch in again for x in np.asarray(batch).tolist()]
        results[name] = (len(seen), sorted(seen + rest) == data)
    assert results["torchdata"] == results["cupy_nwt"] == (73 * B, True)


@pytest.mark.parametrize("taken", ["all-batches-no-end", "epoch-ended"])
def test_torchdata_stateful_dataloader_agrees_at_the_epochs_end(taken: str) -> None:
    """Every batch taken: if the loop never asked for one more, the rest is empty (then the next
    epoch); if the epoch ended, the state is the next epoch's start. torchdata does the same."""
    pytest.importorskip("torch", reason="torch is a test-only extra")
    sdl = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is a test-only extra")
    data = list(range(N))
    results = {}
    for name, cls, kw in (("torchdata", sdl.StatefulDataLoader, {}), ("cupy_nwt", cupy_nwt.DataLoader, {"seed": 0})):
        first = cls(data, batch_size=B, **kw)
        if taken == "epoch-ended":
            list(first)
        else:
            it = iter(first)
            for _ in range(len(first)):
                next(it)
        state = first.state_dict()
        again = cls(data, batch_size=B, **kw)
        again.load_state_dict(state)
        results[name] = [sum(len(b) for b in again) for _ in range(2)]
    expected = [0, N] if taken == "all-batches-no-end" else [N, N]
    assert results["torchdata"] == results["cupy_nwt"] == expected
