"""How many loader workers this machine can hold, said before any starts, and a count it cannot refused.

``num_workers=5000`` is a typo, not a plan: started blindly it forks until a limit bites (the open
files of the main process, which keeps 5 descriptors a worker; the tasks a user may run; memory),
minutes later and half-way, and then takes as long again to tear down. So before the first worker
starts, the count is held against what the machine has room for now:

* tasks: ``RLIMIT_NPROC`` (threads of this user, when not root), the kernel's ``pid_max`` and
  ``threads-max`` (every task on the machine, from ``/proc/loadavg``), a cgroup's ``pids.max``;
  a worker runs its main thread and a watchdog (``TASKS_PER_WORKER`` leaves room for one more);
* open files: ``RLIMIT_NOFILE`` against this process's open descriptors;
* memory: what is free (``system.memory_room``: MemAvailable and every cgroup limit) against a
  worker's private memory as measured on a small dataset (``WORKER_BYTES``: a floor, the dataset's
  own copy under forkserver and spawn comes on top);
* the ring: ``max(2, num_workers * prefetch_factor)`` slots in what memory is left, of at least a
  page each (its real size is known only from the first batch, and checked again then).

While a count it can hold starts, ``StartProgress`` shows it moving once that takes a while.
``read_limits`` is the one reader of the machine (tests hand it a made-up ``root``, or replace it).
"""

from __future__ import annotations

import mmap
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from ...errors import ArgumentError, LoaderError
from ...reporting.progress import ProgressBar
from ...system import memory_room

TASKS_PER_WORKER = 3
FDS_PER_WORKER = 5  # kept in the main process: the task and result pipes' ends, the spill socket, and the two
# pipe ends multiprocessing keeps for the process (its sentinel, and the end whose closing tells it the parent is gone)
#: open at once beyond those while a worker starts (the ends handed to it, multiprocessing's own pipes, and the
#: server's connection): the last worker needs them too. Measured (Python 3.11): the fewest free descriptors
#: that n workers start with are 5n + 5 under fork, 5n + 9 under forkserver and spawn
START_FDS = {"fork": 5, "forkserver": 9, "spawn": 9}
#: a worker's private (USS) memory right after its first batch of a small dataset, measured on Linux
#: x86-64 with Python 3.11: what the smallest worker costs, before its dataset and imports grow it
WORKER_BYTES = {"fork": 4 << 20, "forkserver": 8 << 20, "spawn": 24 << 20, "thread": 0}


@dataclass(frozen=True)
class Limits:
    """What this machine has room for now; ``None``: no limit found."""

    user_tasks_left: int | None  # RLIMIT_NPROC minus this user's tasks (None for root or unlimited)
    pids_left: int | None  # min(pid_max, threads-max, a cgroup's pids.max) minus tasks in use
    pids_bound: str
    fds_left: int | None  # RLIMIT_NOFILE minus this process's open descriptors
    memory_bytes: int
    memory_bound: str


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().split()
        return int(text[0]) if text and text[0].isdigit() else None
    except (OSError, ValueError):
        return None


def _user_tasks(root: str, uid: int) -> int:
    """Tasks (threads) of ``uid`` now: what RLIMIT_NPROC counts."""
    count = 0
    try:
        entries = [e for e in os.listdir(os.path.join(root, "proc")) if e.isdigit()]
    except OSError:
        return 0
    for pid in entries:
        try:
            with open(os.path.join(root, "proc", pid, "status")) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue  # gone meanwhile
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


def _cgroup_pids_left(root: str) -> int | None:
    """``pids.max - pids.current`` of this process's cgroup (v2, or v1's pids controller), if limited."""
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as f:
            lines = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    for _, controllers, path in lines:
        if controllers == "":
            base = os.path.join(root, "sys/fs/cgroup")
        elif "pids" in controllers.split(","):
            base = os.path.join(root, "sys/fs/cgroup/pids")
        else:
            continue
        where = os.path.join(base, path.lstrip("/"))
        limit, used = _read_int(os.path.join(where, "pids.max")), _read_int(os.path.join(where, "pids.current"))
        if limit is not None and used is not None:
            return limit - used
    return None


def read_limits(root: str = "/") -> Limits:
    """The machine's room for workers now (``root`` prefixes every /proc and /sys path read)."""
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    uid = os.getuid()
    user_left = None if uid == 0 or nproc == resource.RLIM_INFINITY else nproc - _user_tasks(root, uid)
    in_use = 0
    try:
        with open(os.path.join(root, "proc/loadavg")) as f:
            in_use = int(f.read().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        pass
    kernel = {k: v for k, v in (("pid_max", _read_int(os.path.join(root, "proc/sys/kernel/pid_max"))),
                                ("threads-max", _read_int(os.path.join(root, "proc/sys/kernel/threads-max")))) if v is not None}
    bound, pids_left = "", None
    if kernel:
        bound = min(kernel, key=lambda k: kernel[k])
        pids_left = kernel[bound] - in_use
        bound = f"{kernel[bound]:,} ({bound}), {in_use:,} in use"
    cgroup = _cgroup_pids_left(root)
    if cgroup is not None and (pids_left is None or cgroup < pids_left):
        pids_left, bound = cgroup, f"the cgroup's pids.max ({cgroup:,} left)"
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    fds_left = None
    if nofile != resource.RLIM_INFINITY:
        try:
            fds_left = nofile - len(os.listdir(os.path.join(root, "proc/self/fd")))
        except OSError:
            fds_left = nofile
    room = memory_room(root)
    return Limits(user_left, pids_left, bound, fds_left, room.bytes, room.bound)


def out_of_tasks(what: str, remedy: str = "use fewer workers") -> LoaderError:
    """No new process or thread could start (``fork``'s EAGAIN, "can't start new thread"): this user's
    RLIMIT_NPROC, a cgroup's ``pids.max`` or the kernel's limit is reached. One line naming them, as the
    open-files limit gets (``pipes.out_of_files``), instead of the system call's error."""
    lim = read_limits()
    held = [f"{lim.user_tasks_left:,} more tasks for this user (RLIMIT_NPROC)"] if lim.user_tasks_left is not None else []
    held += [f"{lim.pids_left:,} more tasks under {lim.pids_bound}"] if lim.pids_left is not None else []
    room = f" (room now: {'; '.join(held)})" if held else ""
    return LoaderError(f"no more processes or threads can start: {what}; this user's RLIMIT_NPROC (ulimit -u), the "
                       f"cgroup's pids.max or the kernel's limit is reached{room}: raise it or {remedy}")


@dataclass(frozen=True)
class Capacity:
    """How many workers of one kind fit, what bounds it, and the line that says so."""

    workers: int
    line: str


def capacity(method: str, prefetch_factor: int, num_workers: int, limits: Limits | None = None) -> Capacity:
    """How many workers started by ``method`` (``"thread"`` for thread workers) this machine can hold.

    ``num_workers`` sizes the ring that the line describes (its slots share the memory left by the workers).
    """
    lim = read_limits() if limits is None else limits
    process = method != "thread"
    per_task = TASKS_PER_WORKER if process else 1
    per_mem = WORKER_BYTES.get(method, WORKER_BYTES["spawn"])
    fits: dict[str, int] = {}
    parts = []
    if lim.user_tasks_left is not None:
        fits["tasks"] = lim.user_tasks_left // per_task
        parts.append(f"{lim.user_tasks_left:,} more tasks for this user (RLIMIT_NPROC)")
    if lim.pids_left is not None:
        fits["pids"] = lim.pids_left // per_task
        parts.append(f"{lim.pids_left:,} more tasks on the machine (of {lim.pids_bound})")
    tasks = f"processes: {', '.join(parts) or 'no limit found'}, {per_task} a worker"
    files = "open files: no limit"
    if process and lim.fds_left is not None:
        starting = START_FDS.get(method, max(START_FDS.values()))
        fits["files"] = max(0, lim.fds_left - starting) // FDS_PER_WORKER
        files = (f"open files: {lim.fds_left:,} more (RLIMIT_NOFILE), {FDS_PER_WORKER} a worker and {starting} "
                 "more while one starts")
    mem = f"memory: {lim.memory_bytes / 2**30:.1f} GiB free {lim.memory_bound}"
    if per_mem:
        # each worker's own memory, and at least two slots of a page each in the ring, for the ring's share
        fits["memory"] = lim.memory_bytes // (per_mem + prefetch_factor * mmap.PAGESIZE)
        mem += f", about {per_mem >> 20} MiB a worker at least"
    slots = max(2, num_workers * prefetch_factor)
    left = max(0, lim.memory_bytes - num_workers * per_mem)
    ring = f"the ring: {slots:,} slots, at most {left / slots / 2**20:,.1f} MiB each in the memory left"
    n = min(fits.values()) if fits else num_workers
    bound = min(fits, key=lambda k: fits[k]) if fits else "nothing"
    line = (f"this machine can hold about {n:,} loader workers started by {method} (bound by {bound}; {tasks}; "
            f"{files}; {mem}; {ring})")
    return Capacity(n, line)


def check_worker_count(num_workers: int, method: str, prefetch_factor: int, limits: Limits | None = None, *,
                       option: str = "num_workers", value: int | None = None) -> Capacity:
    """What this machine can hold, for ``num_workers``; ``ArgumentError`` (its line) when it cannot hold them.

    ``option=value`` names what the caller asked for where that is not ``num_workers`` itself (the tuner's
    ``max_workers``, whose counts go up to ``num_workers``).
    """
    cap = capacity(method, prefetch_factor, num_workers, limits)
    if num_workers > cap.workers:
        asked = f"{option}={num_workers}" if value is None else f"{option}={value} (up to {num_workers:,} workers)"
        auto = ", or use num_workers='auto'" if option == "num_workers" else ""
        raise ArgumentError(f"{asked} is more than {cap.line}: lower {option} (os.cpu_count() "
                            f"is {os.cpu_count()}), raise the limit named{auto}")
    return cap


START_PROGRESS_AFTER_S = 3.0


class StartProgress:
    """A line on stderr now and then while many workers start, once starting has taken ``START_PROGRESS_AFTER_S``.

    Starting a few workers takes well under a second and says nothing; a count that takes long (hundreds
    of workers, a slow spawn) shows that it is moving, through ``reporting.progress.ProgressBar``.
    """

    def __init__(self, total: int, method: str, *, clock: Callable[[], float] = time.monotonic,
                 stream: TextIO | None = None) -> None:
        self.total, self.method, self.clock, self.stream = total, method, clock, stream
        self.began, self.done = clock(), 0
        self.bar: ProgressBar | None = None

    def started(self) -> None:
        """One more worker has started."""
        self.done += 1
        if self.bar is None and self.done < self.total and self.clock() - self.began >= START_PROGRESS_AFTER_S:
            self.bar = ProgressBar(self.total, f"cupy_nwt: starting loader workers by {self.method}", unit="worker",
                                   stream=self.stream, clock=self.clock)
            self.bar.done = self.done - 1
        if self.bar is not None:
            self.bar.step()

    def __enter__(self) -> StartProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            if self.done == self.total and not any(exc):
                self.bar.note(f"cupy_nwt: {self.total} loader workers started in {self.clock() - self.began:.1f} s")
            self.bar.close()
