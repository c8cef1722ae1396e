"""Online tuning's policy against a simulated pipeline whose costs the test sets (no clocks, no processes).

The simulation is the loader's pipeline in discrete events: batch k starts on the earliest free
active worker once the slot cap allows (a slot comes back when the caller takes its batch), takes
``work(k)`` seconds, and the caller, after a step of ``step`` seconds, asks for the next one. The
policy sees what the loader's tuner would: per interval the steps, the time, the caller's wait,
and how many active workers, summed over the asks, had finished their tasks.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cupy_nwt.loader.tuning.policy import AutotunePolicy, Budget, Decision, Limits, Observation, Setting

SLOT = 1 << 20


def simulate(work: Callable[[int], float], step: float, batches: int, start: Setting, limits: Limits,
             policy: AutotunePolicy, interval: int = 8) -> tuple[list[Decision], list[Setting], float]:
    """Run the pipeline for ``batches`` batches; the decisions, the setting at each batch, and the total time."""
    setting = start
    free_at = [0.0] * setting.workers  # per worker: when it has finished its tasks
    taken: list[float] = []  # when the caller took each batch (its slot came back then)
    done: list[float] = []
    decisions: list[Decision] = []
    settings: list[Setting] = []
    t = 0.0
    mark = (0, 0.0, 0.0)
    wait = 0.0
    asks = idle = 0
    made = 0

    def make_upto(k: int) -> None:
        nonlocal made
        while made <= k:
            slot_free = taken[made - setting.slots] if made >= setting.slots else 0.0
            active = free_at[:setting.workers]
            w = min(range(len(active)), key=lambda i: active[i])
            begin = max(active[w], slot_free)
            free_at[w] = begin + work(made)
            done.append(free_at[w])
            made += 1

    for k in range(batches):
        asks += 1
        make_upto(min(batches - 1, k - 1 + setting.slots))  # given out by now: the caller freed their slots
        if made < batches:
            idle += sum(f <= t for f in free_at[:setting.workers])
        make_upto(k)
        got = max(t, done[k])
        wait += got - t
        taken.append(got)
        t = got + step
        settings.append(setting)
        if k + 1 - mark[0] >= interval:
            obs = Observation(k + 1 - mark[0], t - mark[2], wait - mark[1], asks, idle)
            mark, asks, idle = (k + 1, wait, t), 0, 0
            d = policy.decide(obs, setting, limits)
            if d is not None:
                assert limits.clamp(Setting(d.workers, d.slots)) == Setting(d.workers, d.slots), d
                decisions.append(d)
                setting = Setting(d.workers, d.slots)
                while len(free_at) < setting.workers:
                    free_at.append(t)
    return decisions, settings, t


def limits(cpus: int = 8, slots: int | None = None, pf: int = 2) -> Limits:
    memory = 4096 + (slots if slots is not None else 10_000) * SLOT
    return Limits.of(Budget(cpus, memory), pf, SLOT)


def test_a_starved_caller_gets_workers_until_it_no_longer_waits() -> None:
    lim = limits()
    decisions, settings, total = simulate(lambda k: 0.04, 0.01, 400, Setting(1, 2), lim, AutotunePolicy())
    assert decisions[0].action == "add_workers" and "waited" in decisions[0].reason
    assert 4 <= settings[-1].workers <= 6  # 0.04 s of work per 0.01 s step: 4 keep up, with a margin
    fixed = simulate(lambda k: 0.04, 0.01, 400, Setting(5, 10), lim, AutotunePolicy(starved=2.0))[2]
    assert total < 1.15 * fixed  # the ramp up costs a little, not the run


def test_the_cpu_budget_and_the_memory_budget_are_never_exceeded() -> None:
    lim = limits(cpus=3, slots=7)
    decisions, settings, _ = simulate(lambda k: 0.1, 0.01, 300, Setting(1, 2), lim, AutotunePolicy())
    assert max(s.workers for s in settings) == 3 and max(s.slots for s in settings) == 7
    assert [d.action for d in decisions].count("at_budget") == 1  # said once, not every interval
    assert any(d.action == "add_prefetch" for d in decisions)


def test_at_budget_is_said_once_while_the_wait_hovers_about_the_threshold() -> None:
    lim = limits(cpus=2, slots=6)
    full = Setting(2, 6)
    starved, calm = Observation(8, 1.0, 0.2, 8, 0), Observation(8, 1.0, 0.02, 8, 0)
    p = AutotunePolicy()
    said = [p.decide(starved if k % 2 == 0 else calm, full, lim) for k in range(1000)]
    assert [d.action for d in said if d is not None] == ["at_budget"]


def test_idle_workers_are_parked_one_at_a_time_down_to_what_keeps_up() -> None:
    lim = limits()
    decisions, settings, _ = simulate(lambda k: 0.02, 0.01, 600, Setting(8, 16), lim, AutotunePolicy())
    parks = [d for d in decisions if d.action == "park_worker"]
    assert parks and all("idle" in d.reason for d in parks)
    assert [d.workers for d in parks] == list(range(7, 7 - len(parks), -1))
    assert 2 <= settings[-1].workers < 8


def test_no_oscillation_in_a_steady_pipeline() -> None:
    _, settings, _ = simulate(lambda k: 0.03, 0.01, 3000, Setting(6, 12), limits(), AutotunePolicy())
    changes = sum(a.workers != b.workers for a, b in zip(settings, settings[1:]))
    assert changes <= 8  # parks down, a regretted park or two, then it stays


def test_a_phase_that_quadruples_the_work_is_followed_up_and_back_down() -> None:
    def work(k: int) -> float:
        return 0.08 if 300 <= k < 600 else 0.02

    decisions, settings, _ = simulate(work, 0.01, 1200, Setting(3, 6), limits(), AutotunePolicy())
    assert settings[299].workers <= 4
    assert settings[599].workers >= 8 or settings[599].workers == limits().workers
    assert settings[-1].workers < settings[599].workers
    assert any(d.action == "add_workers" for d in decisions) and any(d.action == "park_worker" for d in decisions)


def test_a_caller_that_waits_although_workers_idle_gets_a_longer_buffer() -> None:
    def work(k: int) -> float:
        return 0.2 if k % 10 == 0 else 0.001  # bursts: one slow batch in ten

    decisions, _, _ = simulate(work, 0.02, 400, Setting(2, 4), limits(), AutotunePolicy())
    assert any(d.action == "add_prefetch" and "buffer" in d.reason for d in decisions)


def test_nothing_is_judged_in_the_interval_after_a_change() -> None:
    policy, lim = AutotunePolicy(), limits()
    starved = Observation(8, 1.0, 0.5, 8, 0)
    assert policy.decide(starved, Setting(1, 2), lim) is not None
    assert policy.decide(starved, Setting(2, 4), lim) is None
    assert policy.decide(starved, Setting(2, 4), lim) is not None


def test_the_worker_count_grows_from_the_wait_at_most_doubling() -> None:
    lim = limits()
    d = AutotunePolicy().decide(Observation(8, 1.0, 0.75, 8, 0), Setting(2, 4), lim)  # 4x the caller's pace
    assert d is not None and (d.workers, d.slots) == (4, 8)
    d = AutotunePolicy().decide(Observation(8, 1.0, 0.2, 8, 0), Setting(4, 8), lim)
    assert d is not None and d.workers == 5


def test_a_regretted_park_makes_the_next_one_wait_longer() -> None:
    policy, lim = AutotunePolicy(park_after=2), limits()
    calm, starved = Observation(8, 1.0, 0.0, 8, 16), Observation(8, 1.0, 0.3, 8, 0)
    assert policy.decide(calm, Setting(3, 6), lim) is None
    assert policy.decide(calm, Setting(3, 6), lim).action == "park_worker"  # type: ignore[union-attr]
    policy.decide(calm, Setting(2, 4), lim)  # settling
    assert policy.decide(starved, Setting(2, 4), lim).action == "add_workers"  # type: ignore[union-attr]
    assert policy.park_after == 4


@pytest.mark.parametrize("memory", [4096 + 3 * SLOT, 4096 + 3 * SLOT + SLOT - 1])
def test_limits_fit_the_ring_header_and_whole_slots_in_the_memory_budget(memory: int) -> None:
    assert Limits.of(Budget(4, memory), 2, SLOT).slots == 3
    assert Limits.of(Budget(1, 10**12), 2, SLOT).slots == 3  # one worker: its prefetch and one more


def test_a_slot_that_does_not_cut_the_wait_is_the_last_one() -> None:
    """Workers idle and the caller waiting alike before and after a slot: the next ask is for a worker,
    and at the CPU budget the policy holds instead of adding slot after slot."""
    lim = limits(cpus=3, slots=40)
    jittery = Observation(8, 1.0, 0.2, 8, 8)  # 20% waited, one idle worker per ask
    p = AutotunePolicy()
    first = p.decide(jittery, Setting(2, 4), lim)
    assert first is not None and first.action == "add_prefetch" and first.slots == 5
    assert p.decide(jittery, Setting(2, 5), lim) is None  # the interval after a change is not judged
    second = p.decide(jittery, Setting(2, 5), lim)
    assert second is not None and second.action == "add_workers" and second.workers == 3
    assert p.decide(jittery, Setting(3, 7), lim) is None
    third = p.decide(jittery, Setting(3, 7), lim)
    assert third is not None and third.action == "add_prefetch"  # a new worker count: a slot may help again
    p.decide(jittery, Setting(3, 8), lim)
    held = [p.decide(jittery, Setting(3, 8), lim) for _ in range(6)]
    assert [d.action for d in held if d is not None] == ["at_budget"]  # no slot after a slot that did not help
    helped = AutotunePolicy()
    helped.decide(jittery, Setting(2, 4), lim)
    helped.decide(jittery, Setting(2, 5), lim)
    better = helped.decide(Observation(8, 1.0, 0.1, 8, 8), Setting(2, 5), lim)  # the wait halved: keep going
    assert better is not None and better.action == "add_prefetch" and better.slots == 6
