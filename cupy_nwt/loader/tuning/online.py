"""Online tuning's mechanism: watch the caller through its epoch iterator, ask the policy, apply.

A loader built with ``autotune=True`` has one ``OnlineTuner``. It follows the newest iterator
(its ``delivered``), and the first worker source that asks for a batch after it: each ask counts
the active workers that had finished their tasks, and the source's ``blocked_s`` is the caller's
wait. (Not the whole time inside ``next()``: on a busy machine handing out a ready batch takes a
few percent of a short step, waiting for a CPU, and reading that as starvation kept every worker
of an idle pool.) Every ``interval_steps`` steps (and at least ``min_interval_s``) the policy sees
the interval and may change the setting.

A change never touches which batches are made or their order: those are fixed by the plan, and a
map-style task goes to whichever active worker is least busy. Adding a worker un-parks one or
starts one more process; parking one stops giving it tasks (it finishes those it has and stays
alive). The ring is made once, for the largest setting the budgets allow; the slot cap sets how
much of it is in use. The budgets are enforced here, whatever a policy proposes. Each change is
logged on ``cupy_nwt.tuner`` with its reason and kept in ``decisions``.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import TYPE_CHECKING, Any

from ..._checks import check_int
from ...errors import ArgumentError
from .policy import AutotunePolicy, Budget, Decision, Limits, Observation, Policy, Setting, default_budget
from ..ring.ring import HEADER_BYTES

if TYPE_CHECKING:
    from ..epoch.epoch import EpochIterator
    from ..epoch.sources import WorkerSource
    from ..workers.thread import Workers

_log = logging.getLogger("cupy_nwt.tuner")  # nwt.pick's logger: the auto lines and these go together


def make_online(autotune: Any, cpu_budget: Any, memory_budget: Any, *, num_workers: int | str,
                iterable: bool) -> OnlineTuner | None:
    """The loader's tuner, or None without ``autotune``; one-line errors for arguments that cannot work."""
    cpu_budget = check_int("cpu_budget", cpu_budget, ge=1, optional=True)
    memory_budget = check_int("memory_budget", memory_budget, ge=1, optional=True)
    if autotune is False or autotune is None:
        if cpu_budget is not None or memory_budget is not None:
            raise ArgumentError("cpu_budget and memory_budget bound online tuning: give them with autotune=True")
        return None
    policy = AutotunePolicy() if autotune is True else autotune
    if not callable(getattr(policy, "decide", None)):
        raise ArgumentError(f"autotune must be True, False or a policy with decide(), got {autotune!r}")
    if iterable:
        raise ArgumentError("autotune=True needs a map-style dataset: an iterable-style dataset's batches depend "
                            "on the worker count, so it cannot change it without changing the batches")
    if num_workers == 0:
        raise ArgumentError("autotune=True tunes worker processes: give num_workers >= 1 or 'auto'")
    budget = default_budget(cpu_budget, memory_budget)
    if isinstance(num_workers, int) and num_workers > budget.cpus:
        raise ArgumentError(f"num_workers={num_workers} is more than cpu_budget={budget.cpus}")
    return OnlineTuner(policy, budget)


class OnlineTuner:
    """The current setting of a loader tuned online, the decisions made, and the interval being watched."""

    def __init__(self, policy: Policy, budget: Budget, *, interval_steps: int = 8, min_interval_s: float = 0.1) -> None:
        self.policy, self.budget = policy, budget
        self.interval_steps, self.min_interval_s = interval_steps, min_interval_s
        self.decisions: list[Decision] = []
        self.setting: Setting | None = None
        self.limits: Limits | None = None
        self._it: weakref.ref | None = None
        self._source: weakref.ref | None = None
        self._epoch = 0
        self._mark: tuple[int, float, float] | None = None  # (delivered, blocked_s, time) at the interval's start
        self._asks = self._idle = 0

    def start(self, workers: int, prefetch_factor: int) -> int:
        """The workers to start with: ``workers`` (the given count or the saved pick) within the CPU budget."""
        n = max(1, min(workers, self.budget.cpus))
        if self.setting is None:
            self.setting = Setting(n, max(2, n * prefetch_factor))
            why = f"from num_workers={workers}" if n == workers else f"num_workers={workers} within the budgets"
            self._record("start", f"{why}; budget {self.budget.cpus} workers, {self.budget.memory_bytes} ring bytes")
        return self.setting.workers

    @property
    def workers(self) -> int:
        """The active workers now (the start count before the first change)."""
        assert self.setting is not None
        return self.setting.workers

    def ring_slots(self, slot_bytes: int, prefetch_factor: int) -> int:
        """The ring's size: the largest setting the budgets allow; the setting is clamped into it."""
        limits = Limits.of(self.budget, prefetch_factor, slot_bytes)
        if limits.slots < 2:
            raise ArgumentError(f"memory_budget={self.budget.memory_bytes} bytes holds fewer than 2 ring slots of "
                                f"{slot_bytes} bytes (plus a {HEADER_BYTES}-byte header): give more, or autotune=False")
        self.limits = limits
        assert self.setting is not None
        clamped = limits.clamp(self.setting)
        if clamped != self.setting:
            self.setting = clamped
            self._record("start", f"clamped into the memory budget: at most {limits.slots} slots of {slot_bytes} bytes")
        return limits.slots

    def configure(self, pool: Workers) -> None:
        """Give ``pool`` the current setting (a new stage, or the ring just made)."""
        if self.setting is not None:
            pool.set_active(self.setting.workers)
            if self.limits is not None:
                pool.slot_cap = self.setting.slots

    def follow(self, it: EpochIterator, epoch: int) -> None:
        """Watch the caller of this (the newest) iteration from now on."""
        self._it, self._source, self._epoch, self._mark = weakref.ref(it), None, epoch, None

    def tick(self, source: WorkerSource) -> None:
        """One ask of the caller (from ``source.next``): sample idleness; at an interval's end, decide."""
        it = self._it() if self._it is not None else None
        if it is None or source.workers.slots.ring is None or self.limits is None:
            return
        if self._source is None:
            self._source = weakref.ref(source)
        elif self._source() is not source:
            return
        source.poll()
        now = time.perf_counter()
        if self._mark is None:  # the epoch's first steps include start-up: start watching once the ring is up
            self._mark, self._asks, self._idle = (it.delivered, source.blocked_s, now), 0, 0
            return
        self._asks += 1
        self._idle += source.idle_workers()
        steps, elapsed = it.delivered - self._mark[0], now - self._mark[2]
        if steps < self.interval_steps or elapsed < self.min_interval_s:
            return
        obs = Observation(steps, elapsed, source.blocked_s - self._mark[1], self._asks, self._idle)
        self._mark, self._asks, self._idle = (it.delivered, source.blocked_s, now), 0, 0
        assert self.setting is not None
        d = self.policy.decide(obs, self.setting, self.limits)
        if d is None:
            return
        proposed = Setting(d.workers, d.slots)
        if self.limits.clamp(proposed) != proposed:
            _log.warning("autotune: the policy proposed %s beyond the budget %s; ignored", proposed, self.limits)
            return
        self.setting = proposed
        self._record(d.action, d.reason, step=it.delivered)
        self.configure(source.workers)

    def _record(self, action: str, reason: str, step: int = 0) -> None:
        assert self.setting is not None
        d = Decision(action, self.setting.workers, self.setting.slots, reason, self._epoch, step)
        self.decisions.append(d)
        _log.info("autotune: %s -> %d workers, %d slots (epoch %d, step %d): %s",
                  action, d.workers, d.slots, d.epoch, d.step, reason)
