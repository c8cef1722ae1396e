"""Online tuning in a real loader: changes applied mid-epoch leave the batches as a fixed setting's,
the budgets hold, each change is logged with its reason, and bad arguments get one line. With
``num_workers="auto"`` it starts from the saved pick, or on a miss from half its budget, and saves what it
settles at."""

from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np
import pytest
from test_faults import Slow, clean  # noqa: F401 - clean: the fixture used below
from toy_data import Squares

from cupy_nwt import DataLoader, IterableDataset
from cupy_nwt.errors import ArgumentError
from cupy_nwt.loader import Autotune, Listener, LoaderParts
from cupy_nwt.loader.ring.ring import live_segments, segment_bytes
from cupy_nwt.loader.tuning.online import SETTLED_INTERVALS
from cupy_nwt.loader.tuning.policy import Decision, Limits, Observation, Setting, starting_workers
from cupy_nwt.loader.workers.thread import STUCK_SUFFIX
from cupy_nwt.picks.pick import auto_fingerprint
from cupy_nwt.picks.store import TuneResult, lookup


def noisy(batch, seed):
    img, y = batch
    return img + np.random.default_rng(seed).integers(0, 3, img.shape, dtype=np.uint8), y


class Scripted:
    """A policy that proposes the given (workers, slots) in turn, one per interval, then nothing."""

    def __init__(self, *plan: tuple[int, int]) -> None:
        self.plan = list(plan)
        self.seen: list[Observation] = []
        self.limits: Limits | None = None

    def decide(self, obs: Observation, now: Setting, limits: Limits) -> Decision | None:
        self.seen.append(obs)
        self.limits = limits
        if not self.plan:
            return None
        workers, slots = self.plan.pop(0)
        action = "add_workers" if workers > now.workers else "park_worker" if workers < now.workers else "add_prefetch"
        return Decision(action, workers, slots, f"scripted {workers}/{slots}")


def tuned(dataset, policy, **kw) -> DataLoader:
    """A loader whose policy is asked every other step."""
    spec = Autotune(None if policy is True else policy, interval_steps=2, min_interval_s=0.0)
    return DataLoader(dataset, autotune=spec, device="cpu", **kw)


def pool_size(dl: DataLoader) -> int:
    """Workers started (parked ones included), processes or threads."""
    if dl.worker_type == "process":
        return len(dl.worker_pids())
    return sum(t.name.startswith("cupy_nwt-worker-") and not t.name.endswith(STUCK_SUFFIX)
               for t in threading.enumerate())


def batches(dl: DataLoader, watch=None) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for img, y in dl:
        out.append((img, y))
        if watch is not None:
            watch(dl)
    return out


@pytest.mark.usefixtures("clean", "worker_type")
@pytest.mark.parametrize("persistent", [False, True])
def test_changing_workers_mid_epoch_gives_the_fixed_settings_batches(persistent):
    kw = dict(batch_size=4, shuffle=True, seed=7, batch_transform=noisy, persistent_workers=persistent)
    fixed = DataLoader(Squares(240), num_workers=2, device="cpu", **kw)
    want = [batches(fixed) for _ in range(2)]
    fixed.close()
    policy = Scripted((3, 6), (1, 2), (1, 3), (4, 9), (2, 4))
    dl = tuned(Squares(240), policy, num_workers=2, cpu_budget=4, **kw)
    most = []
    got = [batches(dl, lambda d: most.append(pool_size(d))) for _ in range(2)]
    dl.close()
    for g, w in zip(got, want):
        assert len(g) == len(w) == 60
        for (gi, gy), (wi, wy) in zip(g, w):
            np.testing.assert_array_equal(gi, wi)
            np.testing.assert_array_equal(gy, wy)
    assert [(d.action, d.workers, d.slots) for d in dl.decisions] == [
        ("start", 2, 4), ("add_workers", 3, 6), ("park_worker", 1, 2), ("add_prefetch", 1, 3),
        ("add_workers", 4, 9), ("park_worker", 2, 4)]
    assert all(d.step > 0 and d.reason.startswith("scripted") for d in dl.decisions[1:])
    assert max(most) == 4  # the fourth worker was started mid-epoch, never a fifth


@pytest.mark.usefixtures("clean", "worker_type")
def test_budgets_hold_whatever_the_policy_proposes(caplog):
    slot = 4096
    policy = Scripted((3, 4), (2, 40), (2, 3))
    dl = tuned(Squares(120), policy, batch_size=4, num_workers=1, cpu_budget=2, memory_budget=4096 + 3 * slot)
    pids = []
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        batches(dl, lambda d: pids.append(pool_size(d)))
    assert max(pids) <= 2 and policy.limits == Limits(2, 3, 2)
    assert [(d.workers, d.slots) for d in dl.decisions] == [(1, 2), (2, 3)]
    assert caplog.text.count("beyond the budget") == 2
    assert "autotune: add_workers -> 2 workers, 3 slots (epoch 0, step " in caplog.text
    assert "scripted 2/3" in caplog.text


@pytest.mark.usefixtures("clean")
def test_the_ring_is_made_once_within_the_memory_budget():
    slot = 4096
    before = live_segments(os.getpid())  # an earlier test's loader may await the garbage collector
    dl = tuned(Squares(64), Scripted(), batch_size=4, num_workers=1, cpu_budget=3, memory_budget=4096 + 5 * slot)
    it = iter(dl)
    next(it)
    next(it)
    (segment,) = live_segments(os.getpid()) - before
    assert dl.layout is not None and dl.layout.slot_bytes == slot
    assert segment_bytes(segment) == 4096 + 5 * slot  # the header and 5 slots
    it.close()


@pytest.mark.usefixtures("clean")
def test_a_waiting_caller_gets_a_worker_and_the_log_says_why(caplog):
    dl = DataLoader(Slow(96, 0.01), batch_size=2, num_workers=1, autotune=Autotune(min_interval_s=0.0), cpu_budget=2,
                    device="cpu")
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        n = len(batches(dl))
    assert n == 48
    adds = [d for d in dl.decisions if d.action == "add_workers"]
    assert adds and adds[0].workers == 2 and "the caller waited" in adds[0].reason
    assert "autotune: add_workers -> 2 workers" in caplog.text


def _save_pick(dataset, batch_size: int, workers: int, worker_type: str = "process") -> None:
    fp = auto_fingerprint(dataset, batch_size=batch_size, device="cpu")
    TuneResult(workers, "fast", (), 4, 8, 0.5, 0.02, batch_size, 2, False, "cpu", fingerprint=fp,
               worker_type=worker_type).save_pick()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.usefixtures("clean", "cache")
def test_auto_starts_from_the_saved_pick(tmp_path, monkeypatch):
    _save_pick(Squares(16), 4, 3)
    dl = DataLoader(Squares(16), batch_size=4, num_workers="auto", autotune=True, cpu_budget=2, device="cpu")
    assert dl.num_workers == 2 and dl.decisions[0].action == "start" and "num_workers=3" in dl.decisions[0].reason
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "another"))
    _save_pick(Squares(16), 4, 0, "thread")
    dl = DataLoader(Squares(16), batch_size=4, num_workers="auto", autotune=True, cpu_budget=2, device="cpu")
    assert dl.num_workers == 1 and dl.worker_type == "thread"  # workers are what it tunes: one to start from
    assert len(batches(dl)) == 4


@pytest.mark.usefixtures("clean", "cache")
def test_auto_with_nothing_saved_starts_from_half_the_budget_and_saves_once_settled(caplog):
    assert [starting_workers(n) for n in (1, 2, 3, 4, 7)] == [1, 1, 2, 2, 4]
    policy = Scripted((3, 6))  # one change, then quiet
    dl = tuned(Squares(240), policy, batch_size=4, num_workers="auto", cpu_budget=4)
    assert dl.decisions[0].workers == 2 and "num_workers=2" in dl.decisions[0].reason
    assert lookup(auto_fingerprint(Squares(240), batch_size=4, device="cpu")) is None
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):
        for _ in range(2):
            assert len(batches(dl)) == 60
    dl.close()
    saved = lookup(auto_fingerprint(Squares(240), batch_size=4, device="cpu"))
    assert saved is not None and saved.strategy == "online" and saved.best_workers == 3
    assert saved.search_end == f"online: no change in {SETTLED_INTERVALS} intervals"
    (seen,) = saved.runs  # the caller's loop over the quiet intervals, as the tuner saw it
    assert seen.workers == 3 and seen.phase == "online" and seen.iterations >= 2 * SETTLED_INTERVALS
    assert seen.wait_fraction is not None and saved.max_workers == 4
    assert caplog.text.count("the online tuner settled at 3 workers") == 1  # once per loader


@pytest.mark.usefixtures("clean", "cache")
def test_an_epoch_that_ends_after_a_quiet_interval_settles_the_tuner():
    dl = tuned(Squares(40), Scripted(), batch_size=4, num_workers="auto", cpu_budget=2)
    assert len(batches(dl)) == 10
    dl.close()
    saved = lookup(auto_fingerprint(Squares(40), batch_size=4, device="cpu"))
    assert saved is not None and saved.best_workers == 1 and saved.search_end.startswith("online: an epoch ended ")


@pytest.mark.usefixtures("clean", "cache")
@pytest.mark.parametrize("persistent", [False, True])
def test_epochs_shorter_than_an_interval_are_judged_together_and_settle_the_tuner(persistent):
    """A job whose epochs end before one interval (a small validation set, a short fine-tune) is still
    judged: the watched steps of each epoch add up across epochs, the time between epochs left out."""
    policy = Scripted()
    spec = Autotune(policy, interval_steps=4, min_interval_s=0.0)
    dl = DataLoader(Squares(12), batch_size=4, num_workers="auto", autotune=spec, cpu_budget=2, device="cpu",
                    persistent_workers=persistent)
    for _ in range(4):
        assert len(batches(dl)) == 3
        time.sleep(0.5)  # the caller's own work between epochs: not the loader's interval
    dl.close()
    assert policy.seen and all(obs.steps >= 4 and obs.elapsed_s < 0.5 for obs in policy.seen)
    saved = lookup(auto_fingerprint(Squares(12), batch_size=4, device="cpu"))
    assert saved is not None and saved.best_workers == 1 and saved.search_end.startswith("online: an epoch ended ")


@pytest.mark.usefixtures("clean", "cache")
def test_a_hit_tuned_online_saves_nothing_more():
    _save_pick(Squares(40), 4, 1)
    before = lookup(auto_fingerprint(Squares(40), batch_size=4, device="cpu"))
    dl = tuned(Squares(40), Scripted(), batch_size=4, num_workers="auto", cpu_budget=2)
    assert len(batches(dl)) == 10
    dl.close()
    assert lookup(auto_fingerprint(Squares(40), batch_size=4, device="cpu")) == before


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(8))


@pytest.mark.parametrize(("dataset", "kw", "words"), [
    (Stream(), dict(num_workers=2, autotune=True), "map-style"),
    (Squares(8), dict(num_workers=0, autotune=True), "num_workers >= 1"),
    (Squares(8), dict(num_workers=2, cpu_budget=2), "with autotune=True"),
    (Squares(8), dict(num_workers=3, autotune=True, cpu_budget=2), "more than cpu_budget=2"),
    (Squares(8), dict(num_workers=1, autotune=True, cpu_budget=0), "cpu_budget must be a positive integer"),
    (Squares(8), dict(num_workers=1, autotune=True, memory_budget=1.5), "memory_budget must be"),
    (Squares(8), dict(num_workers=1, autotune="yes"), "autotune must be True, False or a policy"),
])
def test_arguments_that_cannot_work_are_refused_in_one_line(dataset, kw, words):
    with pytest.raises(ArgumentError, match=words) as ei:
        DataLoader(dataset, device="cpu", **kw)
    assert "\n" not in str(ei.value)


@pytest.mark.usefixtures("clean")
def test_a_memory_budget_below_two_slots_is_refused_when_the_slot_size_is_known():
    dl = DataLoader(Squares(16), batch_size=4, num_workers=1, autotune=True, memory_budget=4096 + 4095, device="cpu")
    with pytest.raises(ArgumentError, match="fewer than 2 ring slots of 4096 bytes"):
        batches(dl)
    assert dl.worker_pids() == []


class BusyCaller(Listener):
    """Each ask takes 20 ms in the caller's process before the loader looks for the batch."""

    def asked(self, epoch, source):
        time.sleep(0.02)


@pytest.mark.usefixtures("clean")
def test_handing_out_ready_batches_is_not_waiting_for_workers():
    """Every batch is made long before it is asked for, but each ``next()`` spends 20 ms in the
    caller's process (on a busy machine: the caller waiting for a CPU). The tuner judges the time
    ``next()`` was blocked for a batch not yet made, so it sees idle workers and parks them; it
    used to count all of ``next()`` as waiting and kept every worker. ``stats()`` still reports
    the caller's whole time inside ``next()``."""
    dl = DataLoader(Squares(120), batch_size=2, num_workers=3, cpu_budget=3, device="cpu",
                    autotune=Autotune(interval_steps=2, min_interval_s=0.0), parts=LoaderParts(listeners=(BusyCaller(),)))
    assert len(batches(dl)) == 60
    actions = [d.action for d in dl.decisions]
    assert "park_worker" in actions and "add_workers" not in actions and "add_prefetch" not in actions
    assert dl.decisions[-1].workers < 3
    assert dl.stats().waited_s >= 60 * 0.02


class Clock:
    """A clock the test moves: the loader's seconds are whatever it says."""

    t = 0.0

    def __call__(self) -> float:
        return self.t


class ParksAt:
    """Parks one of two workers the first time it is asked at ``when`` (clock seconds) or later."""

    def __init__(self, clock: Clock, when: float) -> None:
        self.clock, self.when, self.at = clock, when, None

    def decide(self, obs, now, limits):
        if self.at is None and self.clock.t >= self.when:
            self.at = self.clock.t
            return Decision("park_worker", 1, 2, "scripted park")
        return None


@pytest.mark.usefixtures("clean", "worker_type")
def test_busy_fraction_counts_each_worker_count_for_the_time_it_held():
    """Two workers for most of the interval, one at its end: the busy fraction divides by the workers'
    seconds as they were: one worker over the whole interval would read more than 100% busy."""
    clock = Clock()
    policy = ParksAt(clock, 10.0)
    with tuned(Squares(64), policy, batch_size=2, num_workers=2, cpu_budget=2, parts=LoaderParts(clock=clock)) as dl:
        it = iter(dl)
        for _ in range(20):
            clock.t += 1.0
            next(it)
        s = dl.stats()
    assert policy.at is not None and s.num_workers == 1 and s.interval_s == 20.0
    worker_s = 2 * policy.at + 1 * (20.0 - policy.at)
    assert s.busy_fraction == pytest.approx(s.stages.total() / worker_s)
