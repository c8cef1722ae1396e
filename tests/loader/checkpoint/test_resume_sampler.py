"""A user's sampler with a state of its own, stopped and resumed as a training script does: a state that
holds the sampler's position (torchdata's ``StatefulDistributedSampler`` kind) and one that says how to draw
the epoch again (a seed, an epoch count) both resume every sample exactly once, in any epoch, in order or
not, and again after a resume (``cupy_nwt.loader.checkpoint.user_sampler``)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import cupy_nwt
from cupy_nwt.loader import DataLoader

pytestmark = pytest.mark.usefixtures("worker_type")  # each test once per kind of worker

N = 12


class Ids:
    """Sample i is i; ``slow`` samples take a while (so that batches can come out of order)."""

    def __init__(self, slow: frozenset[int] = frozenset()) -> None:
        self.slow = slow

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        if i in self.slow:
            time.sleep(0.5)
        return i


class Positioned:
    """A sampler whose state is how far its iteration got, kept after the iteration ends until the next one
    begins (torchdata's ``StatefulDistributedSampler``, written without torch); shuffled by its epoch."""

    def __init__(self) -> None:
        self.given, self.resume, self.epoch = 0, None, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        self.given, self.resume = self.resume or 0, None
        order = np.random.default_rng(self.epoch).permutation(N).tolist()
        for i in order[self.given:]:
            self.given += 1
            yield i

    def __len__(self) -> int:
        return N

    def state_dict(self) -> dict:
        return {"given": self.given}

    def load_state_dict(self, sd: dict) -> None:
        self.resume = sd["given"]


class Redrawn:
    """A sampler whose state is its generator, which draws the whole epoch's order when iteration begins:
    loaded as the epoch began, the same order comes again (a generator function: nothing is drawn until
    the first index is asked for)."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(3)

    def __iter__(self):
        yield from self.rng.permutation(N).tolist()

    def __len__(self) -> int:
        return N

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, sd: dict) -> None:
        self.rng.bit_generator.state = sd["rng"]


SAMPLERS = {"position": Positioned, "redrawn": Redrawn}


def values(batches) -> list[int]:
    return [int(x) for b in batches for x in np.asarray(b).reshape(-1)]


def run(sampler, epochs: int, **kw) -> list[list[int]]:
    """Each epoch's samples, as one uninterrupted script gets them."""
    dl = DataLoader(Ids(), batch_size=2, sampler=sampler, device="cpu", seed=0, **kw)
    out = []
    for e in range(epochs):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(e)
        out.append(values(dl))
    dl.close()
    return out


def checkpoint(dl) -> dict:
    return json.loads(json.dumps(dl.state_dict()))  # as a checkpoint file keeps it


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_stopped_in_the_second_epoch_the_rest_is_the_uninterrupted_one(kind, num_workers):
    whole = run(SAMPLERS[kind](), 2, num_workers=num_workers)[1]
    sampler = SAMPLERS[kind]()
    dl = DataLoader(Ids(), batch_size=2, sampler=sampler, num_workers=num_workers, device="cpu", seed=0)
    values(dl)
    getattr(sampler, "set_epoch", lambda e: None)(1)
    it = iter(dl)
    head = values(next(it) for _ in range(2))
    state = checkpoint(dl)
    it.close()
    dl.close()
    again = DataLoader(Ids(), batch_size=2, sampler=(s := SAMPLERS[kind]()), num_workers=num_workers, device="cpu",
                       seed=0)
    getattr(s, "set_epoch", lambda e: None)(1)
    again.load_state_dict(state)
    assert head + values(again) == whole
    again.close()


@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_a_resumed_epoch_saved_and_resumed_again_still_gives_each_sample_once(kind):
    whole = run(SAMPLERS[kind](), 2)[1]
    sampler = SAMPLERS[kind]()
    dl = DataLoader(Ids(), batch_size=2, sampler=sampler, device="cpu", seed=0)
    values(dl)
    getattr(sampler, "set_epoch", lambda e: None)(1)
    it = iter(dl)
    got = values([next(it)])
    state = checkpoint(dl)
    it.close()
    for _ in range(2):
        dl = DataLoader(Ids(), batch_size=2, sampler=(s := SAMPLERS[kind]()), num_workers=2, device="cpu", seed=0)
        getattr(s, "set_epoch", lambda e: None)(1)
        dl.load_state_dict(state)
        it = iter(dl)
        got += values([next(it), next(it)])
        state = checkpoint(dl)
        it.close()
        dl.close()
    last = DataLoader(Ids(), batch_size=2, sampler=(s := SAMPLERS[kind]()), device="cpu", seed=0)
    getattr(s, "set_epoch", lambda e: None)(1)
    last.load_state_dict(state)
    assert got + values(last) == whole


@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_batches_delivered_out_of_order_resume_with_each_sample_once(kind):
    """``in_order=False`` with a slow batch 0: what came before it is saved as extras beyond an empty prefix
    (in the second epoch, where a position sampler's state as the epoch began still counts the first)."""
    sampler = SAMPLERS[kind]()
    first = run(SAMPLERS[kind](), 1)[0][:2]
    dl = DataLoader(Ids(frozenset(first)), batch_size=2, sampler=sampler, num_workers=2, in_order=False,
                    device="cpu", seed=0)
    values(dl)
    it = iter(dl)
    head = values([next(it), next(it)])
    state = checkpoint(dl)
    it.close()
    dl.close()
    assert state["extra"], "batch 0 (slow) should have come after others"
    again = DataLoader(Ids(), batch_size=2, sampler=SAMPLERS[kind](), device="cpu", seed=0)
    again.load_state_dict(state)
    assert sorted(head + values(again)) == list(range(N))


@pytest.mark.parametrize("when", ["between-epochs", "before-the-first-batch"])
def test_a_position_saved_before_an_epoch_s_first_batch_gives_that_whole_epoch(when):
    """A checkpoint at an epoch's end (or of an iterator that delivered nothing yet) holds a position at the
    previous iteration's end: the resumed epoch is the whole next one, not an empty one."""
    sampler = Positioned()
    dl = DataLoader(Ids(), batch_size=2, sampler=sampler, device="cpu", seed=0)
    values(dl)
    it = iter(dl) if when == "before-the-first-batch" else None
    state = checkpoint(dl)
    del it
    again = DataLoader(Ids(), batch_size=2, sampler=Positioned(), device="cpu", seed=0)
    again.load_state_dict(state)
    assert sorted(values(again)) == list(range(N))


def test_a_position_for_a_sampler_that_cannot_load_one_is_a_state_error():
    sampler = Positioned()
    dl = DataLoader(Ids(), batch_size=2, sampler=sampler, device="cpu", seed=0)
    it = iter(dl)
    next(it)
    state = checkpoint(dl)
    it.close()
    assert state["sampler_resume"] == {"sampler": {"given": 2}}  # after the delivered batch, though drawn ahead
    again = DataLoader(Ids(), batch_size=2, sampler=list(range(N)), device="cpu", seed=0)
    again.load_state_dict(state)
    with pytest.raises(cupy_nwt.StateError, match=r"^load_state_dict: sampler_resume: .* has no load_state_dict"):
        next(iter(again))


def test_without_workers_the_sampler_is_drawn_only_as_far_as_delivered_from_the_second_batch_on():
    """As with torch's loader, whose ``num_workers=0`` draws each batch as it is made: a script that reads
    the sampler's own state finds it at the delivered batches (the first batch alone draws the second too)."""
    sampler = Positioned()
    it = iter(DataLoader(Ids(), batch_size=2, sampler=sampler, device="cpu", seed=0))
    seen = []
    for _ in range(4):
        next(it)
        seen.append(sampler.given)
    assert seen == [4, 4, 6, 8]
    it.close()


def test_a_sampler_state_that_cannot_be_copied_does_not_stop_the_epoch():
    """The states are copied as they are taken (a sampler may change them in place); one holding what cannot
    be copied (a lock, a file) is kept as returned, and the loop runs as it did without a state."""
    import threading

    class Locked(Positioned):
        def state_dict(self) -> dict:
            return {"given": self.given, "guard": threading.Lock()}

    dl = DataLoader(Ids(), batch_size=2, sampler=Locked(), device="cpu", seed=0)
    assert sorted(values(dl)) == list(range(N)) and sorted(values(dl)) == list(range(N))
    dl.close()


class Stuck:
    """Samples 0 .. n-1; sample 5 waits until ``flag`` exists (a sample on a network read that hangs)."""

    def __init__(self, n: int, flag) -> None:
        self.n, self.flag = n, flag

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        deadline = time.monotonic() + 30
        while i == 5 and not self.flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return i


class Counted:
    """0 .. n-1 in order, its state how many it gave this iteration (a ``StatefulDistributedSampler``)."""

    def __init__(self, n: int) -> None:
        self.n, self.given, self.resume = n, 0, None

    def __iter__(self):
        self.given, self.resume = self.resume or 0, None
        for i in range(self.given, self.n):
            self.given += 1
            yield i

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict:
        return {"given": self.given}

    def load_state_dict(self, sd: dict) -> None:
        self.resume = sd["given"]


def test_a_batch_stuck_while_many_more_come_out_of_order_still_saves_and_resumes(tmp_path):
    """``in_order=False``: batch 5 hangs while 145 later ones arrive, far more than the loader's prefetch; the
    sampler's state the save needs (after batch 4) is still held, and the rest comes after a resume."""
    n, flag = 200, tmp_path / "go"
    dl = DataLoader(Stuck(n, flag), batch_size=1, sampler=Counted(n), num_workers=2, in_order=False, device="cpu",
                    seed=0)
    it = iter(dl)
    head = values(next(it) for _ in range(150))
    state = checkpoint(dl)
    flag.touch()
    it.close()
    dl.close()
    assert 5 not in head and state["delivered"] == 5 and len(state["extra"]) == 145
    assert state["sampler_resume"] == {"sampler": {"given": 5}}
    again = DataLoader(Stuck(n, flag), batch_size=1, sampler=Counted(n), device="cpu", seed=0)
    again.load_state_dict(state)
    assert sorted(head + values(again)) == list(range(n))


@pytest.mark.parametrize(("before", "after"), [(2, 0), (0, 2), (1, 2)])
def test_a_position_resumes_under_another_worker_count(before, after):
    """A sampler's position is where its epoch stands, whoever made the batches: the rest is the same with any
    worker count (persistent workers too)."""
    whole = run(Positioned(), 2, num_workers=before)[1]
    sampler = Positioned()
    dl = DataLoader(Ids(), batch_size=2, sampler=sampler, num_workers=before, persistent_workers=before > 0,
                    device="cpu", seed=0)
    values(dl)
    sampler.set_epoch(1)
    it = iter(dl)
    head = values(next(it) for _ in range(3))
    state = checkpoint(dl)
    it.close()
    dl.close()
    again = DataLoader(Ids(), batch_size=2, sampler=(s := Positioned()), num_workers=after, device="cpu", seed=0)
    s.set_epoch(1)
    again.load_state_dict(state)
    assert head + values(again) == whole
    again.close()
