"""CPU seconds of a pipeline (the main process and every process it started), the machine's other load,
and instructions where the kernel lets us count them.

Wall clock on a shared machine measures the neighbours as much as the pipeline. The CPU time the
pipeline itself burns per sample hardly depends on them, so it is the steady figure beside
samples/s. A reading (:meth:`PipelineClock.read`) sums

* this process: ``time.process_time()`` (every thread, so thread workers count; exited threads too);
* every live descendant (process workers whatever the start method: fork and spawn workers are
  children, forkserver workers grandchildren), plus ``loader.worker_pids()`` if it names one the
  listing missed: its own CPU clock (``clock_getcpuclockid``, nanoseconds; psutil's 10 ms ticks as
  the fallback) and the CPU of the children it has already reaped;
* the CPU of children this process has reaped (``RUSAGE_CHILDREN``).

Descendants that are not the pipeline are left out with theirs: those alive before the loader was
made (a fixture's server, an earlier test's loader awaiting the collector, the base revision's
pytest), whose CPU grows with the wall clock and would fail an unchanged pipeline that waits longer.
The loader's own workers count even under such a process (a forkserver started earlier). One of them
that ends and is reaped by this process inside a window brings its whole CPU into ``RUSAGE_CHILDREN``:
its CPU at the last reading is taken back out, so only what it spent since then is misread.

So a worker counts however it ends: a persistent worker is read live at both ends of a window; a
worker that exits and is reaped inside it moves from the live sum into its parent's reaped sum with
its whole CPU, which makes the difference of two readings exactly the CPU spent between them. The
only miss is a process reaped in the instant between listing and reading (at most one worker's CPU,
at a window's edge) and an orphan re-parented away from us.

Instructions: ``perf_event_open`` of retired user-space instructions with ``inherit``, opened before
the loader starts its workers, counts this process and every thread and process started after it. A
VM without a virtual PMU, ``perf_event_paranoid`` > 2, or a seccomp profile refuses it; then
:func:`open_instruction_counter` says why and nothing is counted.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import resource
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

from ..system import affinity_cpus, busy_cpu_seconds


@dataclass(frozen=True)
class Reading:
    """Cumulative seconds at one instant: the pipeline's CPU, the machine's busy CPU, the wall clock."""

    cpu_s: float
    machine_busy_s: float
    wall_s: float
    instructions: int | None


@dataclass(frozen=True)
class Window:
    """What happened between two readings."""

    cpu_s: float
    wall_s: float
    others_cores: float  # other processes' (and the hypervisor's steal) mean cores during the window, on our CPUs
    instructions: int | None


def window(a: Reading, b: Reading) -> Window:
    wall = max(b.wall_s - a.wall_s, 1e-9)
    cpu = max(b.cpu_s - a.cpu_s, 0.0)
    others = max(b.machine_busy_s - a.machine_busy_s - cpu, 0.0) / wall
    ins = b.instructions - a.instructions if a.instructions is not None and b.instructions is not None else None
    return Window(cpu, wall, others, ins)


_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name, use_errno=True)
        except OSError:
            return None
    return _libc


def _process_clock_s(pid: int) -> float | None:
    """Another process's CPU clock in seconds (every thread, nanosecond resolution), None when reaped."""
    libc = _c()
    if libc is not None and hasattr(libc, "clock_getcpuclockid"):
        clk = ctypes.c_int()
        if libc.clock_getcpuclockid(pid, ctypes.byref(clk)) == 0:
            try:
                return time.clock_gettime(clk.value)
            except OSError:
                pass  # a zombie (exited, not yet reaped) has no clock but still shows its times in /proc
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return None
    return t.user + t.system


def live_descendants() -> list[int]:
    """Pids of this process's descendants now: what a clock made later leaves out as not the pipeline."""
    try:
        return [p.pid for p in psutil.Process().children(recursive=True)]
    except (psutil.Error, OSError):
        return []


def _parent_of(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except (psutil.Error, OSError):
        return None


def _reaped_children_s(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return 0.0
    return t.children_user + t.children_system


class PipelineClock:
    """Reads the CPU of this process and its descendants (see the module docstring)."""

    def __init__(self, extra_pids: Callable[[], Iterable[int]] | None = None,
                 instructions: "InstructionCounter | None" = None, exclude: Iterable[int] = ()) -> None:
        self._extra = extra_pids
        self._exclude = frozenset(exclude)  # descendants that are not the pipeline: they and theirs are left out
        self._me = psutil.Process()
        # excluded children of this process: their CPU at the last reading, taken back out once reaped
        self._excluded_children = {pid: 0.0 for pid in self._exclude if _parent_of(pid) == os.getpid()}
        self._reaped_excluded_s = 0.0
        self.instructions = instructions
        self.cpus = affinity_cpus()  # the machine's load is read on the CPUs this process may run on

    def _descendants(self) -> set[int]:
        try:
            pids = {p.pid for p in self._me.children(recursive=True)}
        except (psutil.Error, OSError):
            pids = set()
        for root in self._exclude:
            pids.discard(root)
            try:
                pids.difference_update(p.pid for p in psutil.Process(root).children(recursive=True))
            except (psutil.Error, OSError):
                pass
        if self._extra is not None:  # the loader's workers, under an excluded forkserver too
            pids.update(int(p) for p in self._extra())
        pids.discard(os.getpid())
        return pids

    def _excluded_reaped_s(self) -> float:
        """The CPU that excluded children brought into ``RUSAGE_CHILDREN`` by being reaped, as last read."""
        for pid in list(self._excluded_children):
            own = _process_clock_s(pid)
            if own is None:  # reaped (a zombie still has its times): its CPU is now in RUSAGE_CHILDREN
                self._reaped_excluded_s += self._excluded_children.pop(pid)
            else:
                self._excluded_children[pid] = own + _reaped_children_s(pid)
        return self._reaped_excluded_s

    def cpu_s(self) -> float:
        """This process's CPU, its descendants' (live, and reaped by them), and its reaped children's,
        less what excluded children brought in when they were reaped."""
        total = 0.0
        for pid in self._descendants():
            own = _process_clock_s(pid)
            if own is not None:
                total += own + _reaped_children_s(pid)
        taken_back = self._excluded_reaped_s()
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        return total + time.process_time() + reaped.ru_utime + reaped.ru_stime - taken_back

    def read(self) -> Reading:
        cpu = self.cpu_s()
        busy = busy_cpu_seconds(self.cpus) or 0.0
        ins = self.instructions.read() if self.instructions is not None else None
        return Reading(cpu, busy, time.perf_counter(), ins)


# ---------------------------------------------------------------- instructions (perf_event_open)

_PERF_SYSCALL = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331}
_PERF_TYPE_HARDWARE, _PERF_COUNT_HW_INSTRUCTIONS = 0, 1
_INHERIT, _EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 1, 1 << 5, 1 << 6
_PERF_FLAG_FD_CLOEXEC = 1 << 3
_ATTR_SIZE_VER0 = 64


class InstructionCounter:
    """An open perf counter of user-space instructions of this process and what it starts later."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self) -> int | None:
        try:
            data = os.read(self._fd, 8)
        except OSError:
            return None
        return struct.unpack("Q", data)[0] if len(data) == 8 else None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_instruction_counter() -> tuple[InstructionCounter | None, str]:
    """A counter, or None and why the kernel refused it (one phrase, e.g. for a results line)."""
    nr = _PERF_SYSCALL.get(platform.machine())
    libc = _c()
    if nr is None or libc is None or not hasattr(libc, "syscall"):
        return None, f"perf_event_open is not available on {platform.system()} {platform.machine()}"
    # perf_event_attr, version 0: type, size, config, sample_period, sample_type, read_format, flags,
    # wakeup_events, bp_type, config1
    attr = struct.pack("IIQQQQQIIQ", _PERF_TYPE_HARDWARE, _ATTR_SIZE_VER0, _PERF_COUNT_HW_INSTRUCTIONS,
                       0, 0, 0, _INHERIT | _EXCLUDE_KERNEL | _EXCLUDE_HV, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, _ATTR_SIZE_VER0)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(ctypes.c_long(nr), buf, ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_int(-1),
                      ctypes.c_ulong(_PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        why = {2: "no hardware instruction counter (a VM without a virtual PMU?)",
               13: "not permitted (kernel.perf_event_paranoid or a container's seccomp profile)",
               1: "not permitted (kernel.perf_event_paranoid or a container's seccomp profile)",
               38: "perf_event_open is not implemented by this kernel"}.get(err, os.strerror(err))
        return None, f"perf_event_open refused: {why}"
    counter = InstructionCounter(int(fd))
    if counter.read() is None:
        counter.close()
        return None, "perf_event_open gave a counter that cannot be read"
    return counter, ""
