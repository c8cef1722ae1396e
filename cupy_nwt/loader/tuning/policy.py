"""Online tuning's decisions: a pure policy from what one interval of iteration showed to a change.

Kept apart from the mechanism (``online``) so it can be tested against a simulated pipeline
whose costs the test controls. The signals are the caller's: how long ``next()`` was blocked for a
batch not yet made, per step (starved: the workers fall behind), and how many active workers, when it asked, had
already finished all they were given (idle: the slot cap or the caller, not they, set the pace).
Workers idle while the caller waits mean the buffer is too short for the batches' spread, so the
policy adds a slot there rather than a worker.

Why the hysteresis: a change takes an interval to show (a new worker starts, the buffer refills),
so the interval after a change is not judged; adding reacts to one starved interval, because
waiting costs the caller time, while parking waits for several idle ones, because an idle worker
costs only a process. A park regretted soon (starved again at once) doubles the idle intervals
the next park needs, so a pipeline that sits between two counts does not flip between them.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from ...system import memory_room, usable_cpus
from ..ring.memory import memfd_available
from ..ring.ring import HEADER_BYTES, SHM_DIR

RAM_SHARE = 0.25  # of the available memory (or a cgroup's headroom), by default, for the ring
SHM_SHARE = 0.5  # of /dev/shm's free space, by default, where the ring is a /dev/shm segment


@dataclass(frozen=True)
class Budget:
    """What online tuning may use: ``cpus`` worker processes, ``memory_bytes`` of ring (header included)."""

    cpus: int
    memory_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_budget(cpu_budget: int | None, memory_budget: int | None) -> Budget:
    """The usable CPUs less one (the caller's), at least 1; a share of the memory the ring may take (``_default_memory``)."""
    cpus = cpu_budget if cpu_budget is not None else max(1, usable_cpus() - 1)
    return Budget(cpus, memory_budget if memory_budget is not None else _default_memory())


def _default_memory() -> int:
    """A share of the memory a ring may take (cgroup limits included); of /dev/shm's too where the ring lives there."""
    ram = memory_room().bytes * RAM_SHARE
    if memfd_available():
        return max(0, int(ram))
    try:
        st = os.statvfs(SHM_DIR)
        shm = st.f_bavail * st.f_frsize
    except OSError:
        shm = 0
    return max(0, int(min(ram, shm * SHM_SHARE)))


@dataclass(frozen=True)
class Setting:
    """Active workers, and the ring slots they may hold at once (in flight, ready, or with the caller)."""

    workers: int
    slots: int


@dataclass(frozen=True)
class Limits:
    """The largest setting the budgets allow, and the per-worker prefetch a worker brings with it."""

    workers: int
    slots: int
    prefetch_factor: int

    @classmethod
    def of(cls, budget: Budget, prefetch_factor: int, slot_bytes: int) -> Limits:
        """``slots``: one more per worker than the prefetch factor gives, within the memory budget."""
        by_memory = (budget.memory_bytes - HEADER_BYTES) // max(1, slot_bytes)
        return cls(budget.cpus, int(min(budget.cpus * (prefetch_factor + 1), by_memory)), prefetch_factor)

    def clamp(self, s: Setting) -> Setting:
        return Setting(max(1, min(s.workers, self.workers)), max(1, min(s.slots, self.slots)))


@dataclass(frozen=True)
class Observation:
    """One interval: ``steps`` batches handed out in ``elapsed_s``, ``wait_s`` of it blocked for a batch not yet made;
    ``asks`` times the caller asked, ``idle_workers`` summed over them: active workers done with their tasks."""

    steps: int
    elapsed_s: float
    wait_s: float
    asks: int
    idle_workers: int

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mean_idle(self) -> float:
        """Active workers with nothing to do, on average, when the caller asked."""
        return self.idle_workers / self.asks if self.asks else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "wait_share": self.wait_share, "mean_idle": self.mean_idle}


@dataclass(frozen=True)
class Decision:
    """A change (``action``: start, add_workers, add_prefetch, park_worker, at_budget) to ``workers`` and
    ``slots``, made after ``step`` batches of the epoch, and why."""

    action: str
    workers: int
    slots: int
    reason: str
    epoch: int = 0
    step: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def starting_workers(cpus: int) -> int:
    """Where ``num_workers="auto"`` starts tuning online when nothing is saved: half the CPU budget,
    rounded up (at least 1).

    Read off ``AutotunePolicy``: a starved interval adds workers in proportion to the caller's wait,
    up to twice the count in one change, while parking takes ``park_after`` idle intervals (after one
    unjudged) per worker. From half the budget one change reaches the whole budget when the work
    needs it; a start at the budget would take about four intervals per surplus worker to come
    down, and a start at one worker about log2(budget) changes, each followed by an unjudged
    interval, of the caller waiting.
    """
    return max(1, (cpus + 1) // 2)


class Policy(Protocol):
    """Anything that turns an interval's observation into a proposed setting (or None: keep it)."""

    def decide(self, obs: Observation, now: Setting, limits: Limits) -> Decision | None: ...


class AutotunePolicy:
    """The default rules. ``starved``: the caller waited more than this share of the interval;
    ``calm``: less than this share counts as not waiting; ``idle``: idle workers per ask, on average,
    from which one can be parked (above 1, so the rest keep a margin); ``park_after``: such intervals
    before a park; ``jitter``: idle workers per ask while starved that point to a short buffer. A slot
    added for jitter that does not cut the wait by a quarter is the last: the next starved interval
    asks for a worker instead (or holds, at the budget), so slots do not pile up for nothing. "at_budget"
    is said once per setting: a caller at the budget whose wait hovers about ``starved`` would otherwise
    add a line and a decision every other interval for the rest of the run."""

    def __init__(self, *, starved: float = 0.05, calm: float = 0.01, idle: float = 1.5, jitter: float = 0.5, park_after: int = 3,
                 regret_within: int = 4, max_park_after: int = 48) -> None:
        self.starved, self.calm, self.idle, self.jitter = starved, calm, idle, jitter
        self.park_after, self.regret_within, self.max_park_after = park_after, regret_within, max_park_after
        self._settle = 0  # intervals not judged, after a change
        self._idle_run = 0
        self._since_park: int | None = None
        self._said_full: Setting | None = None  # the setting "at_budget" was said at: said once for it
        self._slot_base: float | None = None  # the wait share when a slot was last added for jitter

    def decide(self, obs: Observation, now: Setting, limits: Limits) -> Decision | None:
        if self._since_park is not None:
            self._since_park += 1
        if self._settle > 0:
            self._settle -= 1
            return None
        share = obs.wait_share
        if share > self.starved:
            self._idle_run = 0
            return self._changed(self._feed(obs, now, limits, share))
        self._slot_base = None
        if share < self.calm and obs.mean_idle >= self.idle and now.workers > 1:
            self._idle_run += 1
            if self._idle_run >= self.park_after:
                self._idle_run = 0
                self._since_park = 0
                slots = max(2, now.slots - limits.prefetch_factor)
                return self._changed(Decision(
                    "park_worker", now.workers - 1, slots,
                    f"{obs.mean_idle:.1f} workers sat idle per ask for {self.park_after} intervals "
                    f"and the caller waited {share:.1%} of the time"))
            return None
        self._idle_run = 0
        return None

    def _feed(self, obs: Observation, now: Setting, limits: Limits, share: float) -> Decision | None:
        """Starved: more workers while the CPU budget allows, sized from the wait; else one more slot."""
        waited = f"the caller waited {share:.0%} of the last {obs.steps} steps' time"
        if self._since_park is not None and self._since_park <= self.regret_within:
            self.park_after = min(self.max_park_after, self.park_after * 2)
            self._since_park = None
        jitter = obs.mean_idle >= self.jitter  # workers idle, yet the caller waited: a buffer too short
        helped = self._slot_base is None or share < 0.75 * self._slot_base
        if jitter and not helped:  # the last slot did not cut the wait: more hands, not more buffer
            jitter = False
        if now.workers < limits.workers and not jitter:
            busy = max(obs.elapsed_s - obs.wait_s, 1e-9)  # the caller's own time: the pace to keep up with
            want = math.ceil(now.workers * obs.elapsed_s / busy)
            workers = min(limits.workers, max(now.workers + 1, min(want, 2 * now.workers)))
            slots = min(limits.slots, now.slots + (workers - now.workers) * limits.prefetch_factor)
            if slots > now.slots or workers > now.workers:
                self._slot_base = None
                return Decision("add_workers", workers, max(slots, now.slots), waited)
        if now.slots < limits.slots and helped:
            self._slot_base = share
            why = "workers were idle at times, so the buffer is too short" if jitter else "workers at the CPU budget"
            return Decision("add_prefetch", now.workers, now.slots + 1, f"{waited}; {why}")
        if self._said_full == now:
            return None
        self._said_full = now
        return Decision("at_budget", now.workers, now.slots,
                        f"{waited}, but {limits.workers} workers and {limits.slots} slots are the budget")

    def _changed(self, d: Decision | None) -> Decision | None:
        if d is not None and d.action != "at_budget":
            self._settle = 1
            self._said_full = None
        return d
