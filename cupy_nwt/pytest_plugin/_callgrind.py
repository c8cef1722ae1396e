"""Count a command's instructions with valgrind's callgrind: a figure no neighbour on the machine can move.

Where ``perf_event_open`` is refused (most VMs and CI containers) callgrind still counts every
instruction the program executes, on a simulated CPU, so the same code on the same inputs gives the
same count whatever else the host is doing. It runs some 50x slower than native, so what is counted
must be a few seconds of native work.

Only the process started from ``argv`` is counted: processes it forks write their own output files,
which are ignored and removed with the rest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence

from ..errors import CallgrindError

_TOTAL = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.MULTILINE)



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
    if not argv:
        raise CallgrindError("count_instructions needs a command to run, got an empty argv")
    reason = callgrind_unavailable_reason()
    if reason is not None:
        raise CallgrindError(reason)
    with tempfile.TemporaryDirectory(prefix="nwt-callgrind-") as tmp:
        out_pattern = os.path.join(tmp, "callgrind.out.%p")
        cmd = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out_pattern}",
            "--log-file=" + os.path.join(tmp, "valgrind.log.%p"),  # its own report, apart from the program's
            *argv,
        ]
        try:
            proc = subprocess.Popen(
                cmd,
                env=None if env is None else dict(env),
                cwd=cwd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
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
        found = _TOTAL.search(_read(os.path.join(tmp, f"callgrind.out.{proc.pid}")))
        if found is None:
            raise CallgrindError(f"callgrind wrote no summary or totals line for {argv[0]}")
        return int(found.group(1))


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""
