"""Online tuning's mechanism: listen to the caller's epoch, ask the policy, apply.

A loader built with ``autotune=`` has one ``OnlineTuner``, a listener on its events (``_events``).
It follows the newest epoch (``began``): its delivered turns (``waited``) and the first worker
source that asks for a batch in it (``asked``): each ask counts the active workers that had
finished their tasks, and the source's ``blocked_s`` is the caller's wait. (Not the whole time
inside ``next()``: on a busy machine handing out a ready batch takes a few percent of a short step,
waiting for a CPU, and reading that as starvation kept every worker of an idle pool.) Every
``interval_steps`` steps (and at least ``min_interval_s``) the policy sees the interval and may
change the setting. An epoch that ends (or is left) inside an interval hands its watched part, up
to its caller's last ask, to the next epoch's: a job whose epochs are shorter than an interval is
judged over several, and the caller's own time between epochs is not in it.

A change never touches which batches are made or their order: those are fixed by the plan, and a
map-style batch b goes to active worker b % active. Adding a worker un-parks one or
starts one more process; parking one stops giving it tasks (it finishes those it has and stays
alive). The ring is made once, for the largest setting the budgets allow; the slot cap sets how
much of it is in use. The budgets are enforced here, whatever a policy proposes. Each change is
logged on ``cupy_nwt.tuner`` with its reason and kept in ``decisions``.

``num_workers="auto"`` with nothing saved tunes this way too, and its tuning carries where to save
the pick (``Tuning.saves``). The tuner has settled when ``SETTLED_INTERVALS`` intervals in a row
passed without a change, or when an epoch ends with at least one interval watched since the last
change, whichever comes first (the first epoch's start-up is never watched: an epoch's intervals
begin once its ring is up). It then saves the active count, with the caller's loop as it saw it
since that change, once per loader; tuning goes on as before.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..._checks import check_int, check_number
from ...errors import ArgumentError
from ...picks.pick import OnlinePick
from .._events import Listener
from ..ring.ring import HEADER_BYTES
from .policy import AutotunePolicy, Budget, Decision, Limits, Observation, Policy, Setting, default_budget

_log = logging.getLogger("cupy_nwt.tuner")  # picks.pick's logger: the auto lines and these go together
# The default policy parks a surplus worker after one unjudged and three idle intervals: eight quiet
# intervals mean it found nothing to park twice over.
SETTLED_INTERVALS = 8
_NOTHING_CARRIED = Observation(0, 0.0, 0.0, 0, 0)


@dataclass(frozen=True)
class Autotune:
    """``DataLoader(autotune=...)``'s long form: the policy, and how often it is asked (``autotune=True`` is
    ``Autotune()``).

    Args:
        policy: What decides from each interval's waits and idle workers (None: the default rules).
        interval_steps: Batches between two asks.
        min_interval_s: Seconds an interval lasts at least, so that a fast loop is judged on enough time.
    """

    policy: Any = None
    interval_steps: int = 8
    min_interval_s: float = 0.1


@dataclass(frozen=True)
class Tuning:
    """Online tuning as a loader resolved it: the policy, its budget and cadence, and where it starts."""

    policy: Policy
    budget: Budget
    interval_steps: int
    min_interval_s: float
    requested: int = 1  # the worker count given (or the saved pick)
    prefetch_factor: int = 2
    saves: OnlinePick | None = None  # num_workers="auto" with nothing saved: where the settled count goes

    @property
    def workers(self) -> int:
        """The workers to start with: the requested count within the CPU budget."""
        return max(1, min(self.requested, self.budget.cpus))

    def starting(self, requested: int, prefetch_factor: int, saves: OnlinePick | None = None) -> Tuning:
        """This tuning from ``requested`` workers; ``saves``: where to save the count it settles at."""
        return replace(self, requested=requested, prefetch_factor=prefetch_factor, saves=saves)

    def ring_slots(self, slot_bytes: int) -> int:
        """The ring's size: the largest setting the budgets allow (the tuner keeps its setting within it)."""
        slots = Limits.of(self.budget, self.prefetch_factor, slot_bytes).slots
        if slots < 2:
            raise ArgumentError(f"memory_budget={self.budget.memory_bytes} bytes holds fewer than 2 ring slots of "
                                f"{slot_bytes} bytes (plus a {HEADER_BYTES}-byte header): give more, or autotune=False")
        return slots


def check_tuning(autotune: Any, cpu_budget: Any, memory_budget: Any, *, num_workers: int | str,
                 iterable: bool, default_cpus: int | None = None) -> Tuning | None:
    """The loader's tuning, or None without ``autotune``; one-line errors for arguments that cannot work.

    ``default_cpus``: the CPU budget when ``cpu_budget`` is not given (None: ``default_budget``'s)."""
    cpu_budget = check_int("cpu_budget", cpu_budget, ge=1, optional=True)
    memory_budget = check_int("memory_budget", memory_budget, ge=1, optional=True)
    if autotune is False or autotune is None:
        if cpu_budget is not None or memory_budget is not None:
            raise ArgumentError("cpu_budget and memory_budget bound online tuning: give them with autotune=True")
        return None
    spec = autotune if isinstance(autotune, Autotune) else Autotune(None if autotune is True else autotune)
    policy = AutotunePolicy() if spec.policy is None else spec.policy
    if not callable(getattr(policy, "decide", None)):
        raise ArgumentError(f"autotune must be True, False or a policy with decide(), got {autotune!r}")
    steps = check_int("autotune interval_steps", spec.interval_steps, ge=1)
    min_s = check_number("autotune min_interval_s", spec.min_interval_s, ge=0, unit="seconds")
    if iterable:
        raise ArgumentError("autotune=True needs a map-style dataset: an iterable-style dataset's batches depend "
                            "on the worker count, so it cannot change it without changing the batches")
    if num_workers == 0:
        raise ArgumentError("autotune=True tunes worker processes: give num_workers >= 1 or 'auto'")
    budget = default_budget(cpu_budget if cpu_budget is not None else default_cpus, memory_budget)
    if isinstance(num_workers, int) and num_workers > budget.cpus:
        raise ArgumentError(f"num_workers={num_workers} is more than cpu_budget={budget.cpus}")
    return Tuning(policy, budget, steps, float(min_s))


@dataclass(frozen=True)
class Quiet:
    """The intervals watched since the tuner's last change: how many, their steps, seconds and waits."""

    intervals: int = 0
    steps: int = 0
    elapsed_s: float = 0.0
    wait_s: float = 0.0

    def plus(self, obs: Observation) -> Quiet:
        return Quiet(self.intervals + 1, self.steps + obs.steps, self.elapsed_s + obs.elapsed_s,
                     self.wait_s + obs.wait_s)


class Tunable(Protocol):
    """What the tuner changes on a worker pool."""

    slot_cap: int | None

    def set_active(self, n: int) -> None: ...


class OnlineTuner(Listener):
    """The current setting of a loader tuned online, the decisions made, and the interval being watched."""

    def __init__(self, tuning: Tuning, clock: Callable[[], float] = time.perf_counter) -> None:
        self.policy, self.budget = tuning.policy, tuning.budget
        self.interval_steps, self.min_interval_s = tuning.interval_steps, tuning.min_interval_s
        self.clock, self.prefetch_factor = clock, tuning.prefetch_factor
        self.decisions: list[Decision] = []
        self.limits: Limits | None = None
        self._source: weakref.ref | None = None
        self._epoch: int | None = None
        self._delivered = 0  # turns the followed epoch's caller has taken
        self._mark: tuple[int, float, float] | None = None  # (delivered, blocked_s, time) at the interval's start
        self._last: tuple[int, float, float] | None = None  # the same at the caller's last ask
        self._carried = _NOTHING_CARRIED  # the unfinished interval of earlier epochs
        self._asks = self._idle = 0
        self.saves = tuning.saves
        self.quiet = Quiet()
        requested, n = tuning.requested, tuning.workers
        self.setting = Setting(n, max(2, n * tuning.prefetch_factor))
        self._worker_s, self._since = 0.0, clock()  # active workers x seconds, up to the last change
        why = f"from num_workers={requested}" if n == requested else f"num_workers={requested} within the budgets"
        self._record("start", f"{why}; budget {self.budget.cpus} workers, {self.budget.memory_bytes} ring bytes")

    @property
    def workers(self) -> int:
        """The active workers now (the start count before the first change)."""
        return self.setting.workers

    def worker_seconds(self) -> float:
        """The active workers integrated over the seconds since the tuner was made: what ``stats()``'s busy
        fraction divides by, so a change within its interval counts each count for the time it held."""
        return self._worker_s + self.setting.workers * (self.clock() - self._since)

    def _set(self, setting: Setting) -> None:
        now = self.clock()
        self._worker_s += self.setting.workers * (now - self._since)
        self._since, self.setting = now, setting

    def ring_made(self, slot_bytes: int, pool: Any) -> None:
        """The ring is made (``Tuning.ring_slots`` sized it): budgets in slots of its size; the pool gets the setting."""
        limits = Limits.of(self.budget, self.prefetch_factor, slot_bytes)
        self.limits = limits
        clamped = limits.clamp(self.setting)
        if clamped != self.setting:
            self._set(clamped)
            self._record("start", f"clamped into the memory budget: at most {limits.slots} slots of {slot_bytes} bytes")
        if pool is not None:
            self.configure(pool)

    def configure(self, pool: Tunable) -> None:
        """Give ``pool`` the current setting (a new stage, or the ring just made)."""
        pool.set_active(self.setting.workers)
        if self.limits is not None:
            pool.slot_cap = self.setting.slots

    # -- events

    def began(self, epoch: int) -> None:
        """Watch the caller of this (the newest) iteration from now on, carrying the last one's unfinished interval."""
        self._carried = self._watched()
        self._epoch, self._source, self._delivered, self._mark, self._last = epoch, None, 0, None, None

    def waited(self, epoch: int, seconds: float, delivered: bool) -> None:
        if delivered and epoch == self._epoch:
            self._delivered += 1

    def asked(self, epoch: int, source: Any) -> None:
        """One ask of the caller (``source.next``): sample idleness; at an interval's end, decide."""
        if epoch != self._epoch or source.workers.slots.ring is None or self.limits is None:
            return
        if self._source is None:
            self._source = weakref.ref(source)
        elif self._source() is not source:
            return
        source.poll()
        now = self.clock()
        if self._mark is None:  # the epoch's first steps include start-up: start watching once the ring is up
            self._mark, self._asks, self._idle = (self._delivered, source.blocked_s, now), 0, 0
            return
        self._asks += 1
        self._idle += source.idle_workers()
        self._last = (self._delivered, source.blocked_s, now)
        carried = self._carried
        if (carried.steps + self._delivered - self._mark[0] < self.interval_steps
                or carried.elapsed_s + now - self._mark[2] < self.min_interval_s):
            return
        obs = self._watched()
        self._mark, self._last, self._asks, self._idle = self._last, None, 0, 0
        self._carried = _NOTHING_CARRIED
        d = self.policy.decide(obs, self.setting, self.limits)
        if d is not None:
            proposed = Setting(d.workers, d.slots)
            if self.limits.clamp(proposed) != proposed:
                _log.warning("autotune: the policy proposed %s beyond the budget %s; ignored", proposed, self.limits)
            else:
                changed = proposed != self.setting
                self._set(proposed)
                self._record(d.action, d.reason, step=self._delivered)
                self.configure(source.workers)
                if changed:
                    self.quiet = Quiet()
                    return
        self.quiet = self.quiet.plus(obs)
        if self.quiet.intervals >= SETTLED_INTERVALS:
            self._settled(f"no change in {self.quiet.intervals} intervals")

    def _watched(self) -> Observation:
        """The interval so far: the carried part plus this epoch's, from its mark to the caller's last ask."""
        c, mark, last = self._carried, self._mark, self._last
        if mark is None or last is None:
            return c
        return Observation(c.steps + last[0] - mark[0], c.elapsed_s + last[2] - mark[2],
                           c.wait_s + last[1] - mark[1], c.asks + self._asks, c.idle_workers + self._idle)

    def ended(self, pids: Sequence[int]) -> None:
        """An epoch ran to its end: settled, if at least one interval was watched since the last change."""
        if self.quiet.intervals > 0:
            self._settled(f"an epoch ended {self.quiet.intervals} interval(s) after the last change")

    def _settled(self, why: str) -> None:
        """Save the active count where ``num_workers="auto"`` asked (once per loader)."""
        saves, self.saves = self.saves, None
        if saves is not None:
            q = self.quiet
            saves.save(self.setting.workers, steps=q.steps, elapsed_s=q.elapsed_s, wait_s=q.wait_s,
                       budget=self.budget.cpus, search_end=f"online: {why}")

    def _record(self, action: str, reason: str, step: int = 0) -> None:
        d = Decision(action, self.setting.workers, self.setting.slots, reason, self._epoch or 0, step)
        self.decisions.append(d)
        _log.info("autotune: %s -> %d workers, %d slots (epoch %d, step %d): %s",
                  action, d.workers, d.slots, d.epoch, d.step, reason)
