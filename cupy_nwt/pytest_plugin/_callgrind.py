"""Count a command's work with valgrind's callgrind: figures no neighbour on the machine can move.

Where ``perf_event_open`` is refused (most VMs and CI containers) callgrind still counts every
instruction the program executes, on a simulated CPU, so the same code on the same inputs gives the
same count whatever else the host is doing. It runs some 50x slower than native, so what is counted
must be a few seconds of native work.

With ``cache_sim`` callgrind also simulates a two-level cache (:data:`CACHE_OPTIONS`, a fixed
geometry, so that a count does not depend on the runner's own caches) and reports its misses, and
with ``syscalls_between`` it logs every system call the program makes (``--trace-syscalls``) and the
calls between two marker paths the program ``stat``s are counted: a program's system calls are the
same under valgrind as natively (valgrind forwards or emulates each one), so the count is exact.

Only the process started from ``argv`` is counted: processes it forks write their own output files,
which are ignored and removed with the rest.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence

from ..errors import CallgrindError

_TOTAL = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.MULTILINE)
_TOTALS = re.compile(rb"^(?:summary|totals):\s+([\d ]+)$", re.MULTILINE)
_EVENTS = re.compile(rb"^events:\s+([\w ]+)$", re.MULTILINE)
#: a system call's first line in valgrind's --trace-syscalls log (an async call's completion line has "...")
_SYSCALL = re.compile(rb"^SYSCALL\[\d+,\d+\]\(\d+\) (?!\.\.\.)", re.MULTILINE)
#: the simulated caches (size, associativity, line bytes): L1 as on most x86-64 cores; a last level of
#: 2 MiB, about one core's share of a server's L3 (a CI job shares it with its neighbours). Fixed, so a
#: count is the same on every runner; callgrind's default copies the host's, which differs between runners.
CACHE_OPTIONS = ("--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=2097152,16,64")


#: personality(2)'s flag that turns address-space randomisation off for the program it then executes
ADDR_NO_RANDOMIZE = 0x0040000


def fixed_addresses() -> None:
    """Run in a child before ``exec`` (``preexec_fn``): no address-space randomisation for the program.

    With random addresses the same code on the same samples meets different page and cache-line
    boundaries each run, and its page faults move by some 5% (NumPy arrays straddling another page);
    with fixed ones they repeat exactly. Where the kernel refuses, addresses stay random.
    """
    import ctypes  # noqa: PLC0415

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        current = libc.personality(0xFFFFFFFF)
        if current != -1:
            libc.personality(current | ADDR_NO_RANDOMIZE)
    except (OSError, AttributeError):
        pass


def callgrind_unavailable_reason() -> str | None:
    """One line saying why instructions cannot be counted here, or None when valgrind runs."""
    exe = shutil.which("valgrind")
    if exe is None:
        return "valgrind is not installed (apt-get install valgrind), so instructions cannot be counted"
    try:
        done = subprocess.run([exe, "--version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"valgrind ({exe}) does not run: {exc}"
    if done.returncode != 0:
        return f"valgrind ({exe}) does not run: --version exited with {done.returncode}"
    return None


@functools.cache
def valgrind_version() -> str:
    """``valgrind --version``'s line ("" where it does not run): recorded beside its counts, which it decides."""
    exe = shutil.which("valgrind")
    try:
        done = subprocess.run([exe or "valgrind", "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def count_instructions(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
) -> int:
    """Run ``argv`` under callgrind and return the instructions (Ir) its process executed.

    Raises ``CallgrindError`` with one line when valgrind is missing, the command exits non-zero or
    outlives ``timeout`` seconds, or callgrind writes no total.
    """
    return count_events(argv, env=env, cwd=cwd, timeout=timeout)[0]["Ir"]


def count_events(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
    cache_sim: bool = False,
    syscalls_between: tuple[str, str] | None = None,
) -> tuple[dict[str, int], int | None]:
    """Run ``argv`` under callgrind: ``({event: total}, system calls)``.

    The events are callgrind's (``Ir``; with ``cache_sim`` also ``Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw``).
    The system calls are those made after the program ``stat``s the path ``syscalls_between[0]``
    and before it ``stat``s ``syscalls_between[1]`` (None when not asked for). Raises ``CallgrindError``
    as :func:`count_instructions` does, and when a marker is missing from the log.
    """
    if not argv:
        raise CallgrindError("count_instructions needs a command to run, got an empty argv")
    reason = callgrind_unavailable_reason()
    if reason is not None:
        raise CallgrindError(reason)
    with tempfile.TemporaryDirectory(prefix="nwt-callgrind-") as tmp:
        out_pattern = os.path.join(tmp, "callgrind.out.%p")
        cmd = [
            shutil.which("valgrind") or "valgrind",  # found on this process's PATH, not on the one given to argv
            "--tool=callgrind",
            f"--callgrind-out-file={out_pattern}",
            "--log-file=" + os.path.join(tmp, "valgrind.log.%p"),  # its own report, apart from the program's
            *(CACHE_OPTIONS if cache_sim else ()),
            *(("--trace-syscalls=yes",) if syscalls_between else ()),
            *argv,
        ]
        try:
            proc = subprocess.Popen(
                cmd,
                env=None if env is None else dict(env),
                cwd=cwd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                preexec_fn=fixed_addresses,  # noqa: PLW1509 - one ctypes call, no locks taken
            )
        except OSError as exc:
            raise CallgrindError(f"cannot start valgrind for {argv[0]}: {exc}") from None
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise CallgrindError(f"{argv[0]} under callgrind ran past {timeout:g} s and was stopped") from None
        if proc.returncode != 0:
            last = _last_line(err)
            raise CallgrindError(
                f"{argv[0]} under callgrind exited with {proc.returncode}" + (f": {last}" if last else "")
            )
        out = _read(os.path.join(tmp, f"callgrind.out.{proc.pid}"))
        names, totals = _EVENTS.search(out), _TOTALS.search(out)
        if names is None or totals is None:
            raise CallgrindError(f"callgrind wrote no summary or totals line for {argv[0]}")
        events = dict(zip(names.group(1).decode().split(), (int(x) for x in totals.group(1).split())))
        if "Ir" not in events:
            raise CallgrindError(f"callgrind counted no instructions (Ir) for {argv[0]}")
        syscalls = None
        if syscalls_between:
            syscalls = syscalls_in(_read(os.path.join(tmp, f"valgrind.log.{proc.pid}")), syscalls_between)
        return events, syscalls


def syscalls_in(log: bytes, markers: tuple[str, str]) -> int:
    """System calls in a ``--trace-syscalls`` log between the two markers' lines (neither counted)."""
    begin, end = (log.find(m.encode()) for m in markers)
    if begin < 0 or end < begin:
        raise CallgrindError("the program's system calls were not counted: its region markers are missing "
                             "from valgrind's log")
    start = log.rfind(b"\n", 0, begin) + 1  # the begin marker's own line
    stop = log.rfind(b"\n", 0, end) + 1
    return max(0, len(_SYSCALL.findall(log, start, stop)) - 1)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""
