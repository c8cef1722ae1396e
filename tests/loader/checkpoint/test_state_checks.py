"""``load_state_dict`` checks every field before trusting it.

Each malformed state is derived from a real one (map-style, a user's sampler, a stream with two
workers, two ranks merged) by one edit a damaged file, a hand edit or another loader's state
would make. Every one must be refused by one ``StateError`` (a ``ValueError`` and a
``CupyNwtError``) that names the field and its value, and the loader keeps its previous state.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from toy_data import Indices, ShardedIndices

import cupy_nwt
from cupy_nwt.loader import merge_states

N, B = 100, 8


def map_loader(**kw: Any) -> cupy_nwt.DataLoader:
    return cupy_nwt.DataLoader(Indices(N), batch_size=B, shuffle=True, seed=3, **kw)


def sampler_loader() -> cupy_nwt.DataLoader:
    return cupy_nwt.DataLoader(Indices(N), batch_size=B, sampler=list(range(N)))


def stream_loader() -> cupy_nwt.DataLoader:
    return cupy_nwt.DataLoader(ShardedIndices(N), batch_size=B, num_workers=2, worker_type="thread")


def saved(loader: cupy_nwt.DataLoader, batches: int) -> dict[str, Any]:
    """The JSON round trip of the state after ``batches`` batches and a ``break``."""
    for i, _ in enumerate(loader):
        if i + 1 == batches:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state


def merged_state() -> dict[str, Any]:
    return merge_states([saved(map_loader(rank=r, world_size=2), 2 + r) for r in range(2)])


MAKERS: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[], cupy_nwt.DataLoader]]] = {
    "map": (lambda: saved(map_loader(), 3), map_loader),
    "merged": (merged_state, map_loader),
    "sampler": (lambda: saved(sampler_loader(), 3), sampler_loader),
    "iterable": (lambda: saved(stream_loader(), 3), stream_loader),
}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def edit(sd: dict[str, Any]) -> Any:
        *outer, last = path.split(".")
        node: Any = sd
        for key in outer:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return sd
    return edit


def _drop(key: str) -> Callable[[dict[str, Any]], Any]:
    def edit(sd: dict[str, Any]) -> Any:
        del sd[key]
        return sd
    return edit


# (base state, edit, the field the error must name)
CASES = [
    ("map", _drop("delivered"), "delivered"),
    ("map", _drop("epoch"), "epoch"),
    ("map", _drop("base"), "base"),
    ("map", _set("delivered", -3), "delivered"),
    ("map", _set("delivered", 1000), "delivered"),
    ("map", _set("delivered", "3"), "delivered"),
    ("map", _set("delivered", True), "delivered"),
    ("map", _set("delivered", 2.5), "delivered"),
    ("map", _set("base", 10**12), "base"),
    ("map", _set("base", -1), "base"),
    ("map", _set("extra", [999]), "extra[0]"),
    ("map", _set("extra", [9, 7]), "extra[1]"),
    ("map", _set("extra", ["5"]), "extra[0]"),
    ("map", _set("extra", "5"), "extra"),
    ("map", _set("world_size", 0), "world_size"),
    ("map", _set("rank", 99), "rank"),
    ("map", _set("epoch", "1"), "epoch"),
    ("map", _set("epoch", -1), "epoch"),
    ("map", _set("seed", 4), "seed"),
    ("map", _set("n", "100"), "n"),
    ("map", _set("batch_size", 0), "batch_size"),
    ("map", _set("shuffle", 1), "shuffle"),
    ("map", _set("excluded", [[1, 2]]), "excluded[0]"),
    ("map", _set("excluded", {"a": 1}), "excluded"),
    ("map", _set("excluded", [N + 5]), "excluded[0]"),
    ("map", _set("version", True), "version"),
    ("map", _set("version", 3), "version"),
    ("map", _set("workers", "x"), "workers"),
    ("map", _set("workers", [{"batches": 0, "dataset": {}, "iterator": None}]), "workers[0].ended"),
    ("sampler", _set("workers", []), "workers"),
    ("map", _set("kind", "torch"), "kind"),
    ("map", _set("bogus", {"deep": [[[]]]}), "bogus"),
    ("map", lambda sd: [sd], "state"),
    ("map", lambda sd: None, "state"),
    ("merged", _set("ranks", [{"delivered": 2, "extra": []}]), "ranks"),
    ("merged", _set("ranks.1", "garbage"), "ranks[1]"),
    ("merged", _set("ranks.0.delivered", 10**9), "ranks[0].delivered"),
    ("merged", _set("ranks.0.extra", [-1]), "ranks[0].extra[0]"),
    ("merged", _set("world_size", 3), "ranks"),
    ("sampler", _set("delivered", 10**6), "delivered"),
    ("sampler", _drop("sampler_state"), "sampler_state"),
    ("sampler", _set("extra", [{"x": 1}]), "extra[0]"),
    ("iterable", _set("workers", "x"), "workers"),
    ("iterable", _set("workers", []), "workers"),
    ("iterable", _set("workers.0.batches", -1), "workers[0].batches"),
    ("iterable", _set("workers.0", {"batches": 1, "dataset": None, "iterator": None, "ended": False, "junk": 1}),
     "workers[0].junk"),
    ("iterable", _set("workers.0", {"batches": 1, "dataset": None, "iterator": None, "ended": "no"}),
     "workers[0].ended"),
    ("iterable", _set("workers.1", [1, 2]), "workers[1]"),
    ("iterable", _set("next_worker", 5), "next_worker"),
    ("iterable", _set("next_task", -1), "next_task"),
    ("iterable", _set("rank", 99), "rank"),
    ("iterable", _set("world_size", 0), "world_size"),
    ("map", _set("world_size", 2**40), "world_size"),
    ("map", _set("world_size", 10**30), "world_size"),
    ("sampler", _set("batch_size", 4), "batch_size"),
    ("sampler", _set("batch_size", "8"), "batch_size"),
    ("sampler", _set("drop_last", True), "drop_last"),
    ("iterable", _set("batch_size", 16), "batch_size"),
    ("iterable", _set("batch_size", None), "batch_size"),
    ("iterable", _set("drop_last", "no"), "drop_last"),
]


@pytest.mark.parametrize(("base", "edit", "field"), CASES,
                         ids=[f"{b}-{f}-{i}" for i, (b, _, f) in enumerate(CASES)])
def test_a_malformed_state_is_refused_naming_its_field(base: str, edit: Callable, field: str) -> None:
    make_state, make_loader = MAKERS[base]
    good = make_state()
    bad = edit(copy.deepcopy(good))
    loader = make_loader()
    before = loader.state_dict()
    with pytest.raises(cupy_nwt.StateError) as caught:
        loader.load_state_dict(bad)
    err = caught.value
    assert isinstance(err, ValueError) and isinstance(err, cupy_nwt.CupyNwtError)
    assert err.field == field
    assert f"{field}=" in str(err) and "\n" not in str(err)
    assert loader.state_dict() == before  # nothing changed
    loader.load_state_dict(good)  # and it still takes a good one
    assert loader.state_dict() == good
    loader.close()


def test_enough_malformed_states() -> None:
    assert len(CASES) >= 27


def test_after_a_refusal_the_loader_runs_its_own_epoch() -> None:
    loader = map_loader()
    with pytest.raises(ValueError, match="delivered=-3"):
        loader.load_state_dict({**saved(map_loader(), 2), "delivered": -3})
    assert sorted(int(x) for b in loader for x in b) == list(range(N))
    loader.close()


def test_the_good_states_all_resume() -> None:
    for base, (make_state, make_loader) in MAKERS.items():
        loader = make_loader()
        loader.load_state_dict(make_state())
        assert sum(len(b) for b in loader) > 0, base
        loader.close()


@pytest.mark.parametrize("base", ["sampler", "iterable"])
def test_a_state_saved_without_its_batching_still_resumes(base: str) -> None:
    """A user sampler's and a stream's states name their batching since it is checked; one saved before
    loads as it did."""
    make_state, make_loader = MAKERS[base]
    state = make_state()
    older = {k: v for k, v in state.items() if k not in ("batch_size", "drop_last")}
    rest = []
    for saved_state in (state, older):
        loader = make_loader()
        loader.load_state_dict(saved_state)
        rest.append(sorted(int(x) for b in loader for x in b))
        loader.close()
    assert rest[0] == rest[1] and len(rest[0]) == N - 3 * B


def test_a_given_seed_refuses_a_state_of_another_seed() -> None:
    state = saved(map_loader(), 2)
    loader = cupy_nwt.DataLoader(Indices(N), batch_size=B, shuffle=True, seed=4)
    with pytest.raises(ValueError, match="seed=3"):
        loader.load_state_dict(state)
    assert loader.seed == 4


def test_a_drawn_seed_takes_the_state_s_seed_as_torchdata_restores_its_generator() -> None:
    """No ``seed`` nor ``generator``: the loader drew one, so a state saved by another process resumes."""
    state = saved(map_loader(), 2)
    full = [int(x) for b in map_loader() for x in b]
    loader = cupy_nwt.DataLoader(Indices(N), batch_size=B, shuffle=True)
    loader.load_state_dict(state)
    assert loader.seed == 3
    assert [int(x) for b in loader for x in b] == full[2 * B:]
    for bad in (-1, "3", True):
        fresh = cupy_nwt.DataLoader(Indices(N), batch_size=B, shuffle=True)
        drawn = fresh.seed
        with pytest.raises(ValueError, match="seed"):
            fresh.load_state_dict({**state, "seed": bad})
        assert fresh.seed == drawn


def test_a_generator_s_seed_takes_the_state_s_seed_as_torchdata_restores_its_generator() -> None:
    """A run resumed with a generator in another state (seeded from the OS, or already drawn from) resumes the
    saved epoch, as torchdata restores the generator from its state; it used to be refused naming ``seed``."""
    state = saved(map_loader(), 2)
    full = [int(x) for b in map_loader() for x in b]
    loader = cupy_nwt.DataLoader(Indices(N), batch_size=B, shuffle=True, generator=np.random.default_rng())
    loader.load_state_dict(state)
    assert loader.seed == 3 and isinstance(loader.generator, np.random.Generator)
    assert [int(x) for b in loader for x in b] == full[2 * B:]
    loader.load_state_dict(state)  # and again: the generator still yields to a state
    assert [int(x) for b in loader for x in b] == full[2 * B:]


@pytest.mark.parametrize("base", ["map", "iterable"])
def test_an_empty_state_is_refused_in_one_line_and_the_loader_is_unchanged(base: str) -> None:
    """``{}`` is not a loader state (a checkpoint that lacks the loader's entry): refused rather than taken as
    "start over" (torchdata 0.11 takes it as nothing to load; docs/pytorch.md)."""
    make_state, make_loader = MAKERS[base]
    loader = make_loader()
    loader.load_state_dict(make_state())
    before = loader.state_dict()
    with pytest.raises(cupy_nwt.StateError, match=r"^load_state_dict: state=\{\}: empty") as caught:
        loader.load_state_dict({})
    assert "\n" not in str(caught.value) and caught.value.field == "state"
    assert loader.state_dict() == before
    loader.close()


def test_a_version_1_state_is_read_as_version_2_says_it() -> None:
    """A state saved before the readers' states were kept: no dataset states (map-style), a stream's
    per-worker ``state`` (its dataset's, or its iterator's under a tag) split in two."""
    old_map = {k: v for k, v in saved(map_loader(), 3).items() if k != "workers"}
    loader = map_loader()
    loader.load_state_dict({**old_map, "version": 1})
    assert loader.state_dict()["workers"] == [None] and sum(len(b) for b in loader) == N - 3 * B
    loader.close()
    new = saved(stream_loader(), 3)
    old = {**new, "version": 1, "workers": [{"batches": p["batches"], "state": None} for p in new["workers"]]}
    loader = stream_loader()
    loader.load_state_dict(old)
    assert [p["batches"] for p in loader.state_dict()["workers"]] == [p["batches"] for p in new["workers"]]
    loader.close()


class EpochSampler:
    """A sampler with a state of its own: which epoch's permutation it draws next."""

    def __init__(self) -> None:
        self.epoch = 0

    def __len__(self) -> int:
        return N

    def __iter__(self):
        order = np.random.default_rng(self.epoch).permutation(N).tolist()
        self.epoch += 1
        return iter(order)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, sd: dict) -> None:
        self.epoch = sd["epoch"]


def test_a_sampler_state_the_sampler_refuses_is_a_state_error_naming_the_field() -> None:
    """The sampler's state is the user's format, checked by the sampler itself as the epoch begins: its
    refusal is the state's fault, said in one line with the sampler's own words."""
    state = saved(cupy_nwt.DataLoader(Indices(N), batch_size=B, sampler=EpochSampler()), 2)
    loader = cupy_nwt.DataLoader(Indices(N), batch_size=B, sampler=EpochSampler())
    loader.load_state_dict({**state, "sampler_state": "garbage"})
    with pytest.raises(cupy_nwt.StateError, match=r"^load_state_dict: sampler_state: .*TypeError") as caught:
        next(iter(loader))
    assert caught.value.field == "sampler_state" and "\n" not in str(caught.value)
    loader.close()


class PositionSampler(EpochSampler):
    """A sampler whose state is how far its iteration got (torchdata's ``StatefulDistributedSampler`` kind)."""

    def __init__(self) -> None:
        super().__init__()
        self.given = 0

    def __iter__(self):
        for i in range(self.given, N):
            self.given += 1
            yield i

    def state_dict(self) -> dict:
        return {"given": self.given}

    def load_state_dict(self, sd: dict) -> None:
        self.given = sd["given"]


@pytest.mark.parametrize(("position", "delivered", "why"), [
    ("garbage", 2, "expected null or a dict"), ({}, 2, "expected null or a dict"),
    ({"sampler": {"given": 6}, "other": 1}, 2, "expected null or a dict"),
    ({"sampler": {"given": 6}}, 0, "before a delivered batch .delivered=0. a sampler.s position is its previous"),
])
def test_a_damaged_sampler_position_is_refused_naming_the_field(position, delivered, why) -> None:
    state = saved(cupy_nwt.DataLoader(Indices(N), batch_size=B, sampler=PositionSampler()), 2)
    assert state["sampler_resume"] == {"sampler": {"given": 2 * B}}
    loader = cupy_nwt.DataLoader(Indices(N), batch_size=B, sampler=PositionSampler())
    with pytest.raises(cupy_nwt.StateError, match=rf"^load_state_dict: sampler_resume=.*: {why}") as caught:
        loader.load_state_dict({**state, "sampler_resume": position, "delivered": delivered})
    assert caught.value.field == "sampler_resume"
    loader.close()


def test_a_sampler_position_the_sampler_refuses_is_a_state_error_naming_the_field() -> None:
    state = saved(cupy_nwt.DataLoader(Indices(N), batch_size=B, sampler=PositionSampler()), 2)
    loader = cupy_nwt.DataLoader(Indices(N), batch_size=B, sampler=PositionSampler())
    loader.load_state_dict({**state, "sampler_resume": {"sampler": "garbage"}})
    with pytest.raises(cupy_nwt.StateError, match=r"^load_state_dict: sampler_resume: .*TypeError"):
        next(iter(loader))
    loader.close()
