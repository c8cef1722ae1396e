"""Host facts (CPU model, cores, memory): the part of ``info`` that never needs a GPU."""

from __future__ import annotations

import os
import platform
import re
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

CACHE_ENV = "CUPY_NWT_CACHE_DIR"


def cache_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """Where cupy_nwt keeps what it builds or learns on this machine (synthetic data, tuned picks).

    ``path`` if given, else ``$CUPY_NWT_CACHE_DIR``, else the user cache dir (platformdirs). Without
    platformdirs (some GPU images lack it) the XDG rule it follows on Linux stands in:
    ``$XDG_CACHE_HOME/cupy_nwt``, else ``~/.cache/cupy_nwt``.
    """
    if path is not None:
        return Path(path)
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    try:
        import platformdirs  # noqa: PLC0415 - optional, and only needed when a cache is used
    except ImportError:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
        return base / "cupy_nwt"
    return Path(platformdirs.user_cache_dir("cupy_nwt"))


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, falling back to platform's guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cpus() -> int:
    """CPUs this process may really use: affinity mask, then any cgroup v2 CPU quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()
        if quota != "max":
            n = min(n, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


@dataclass(frozen=True)
class HostInfo:
    cpu_model: str
    logical_cpus: int
    physical_cpus: int | None
    usable_cpus: int
    memory_total_bytes: int
    memory_available_bytes: int
    python: str
    platform: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def host_info() -> HostInfo:
    vm = psutil.virtual_memory()
    return HostInfo(
        cpu_model=cpu_model(),
        logical_cpus=os.cpu_count() or 1,
        physical_cpus=psutil.cpu_count(logical=False),
        usable_cpus=usable_cpus(),
        memory_total_bytes=int(vm.total),
        memory_available_bytes=int(vm.available),
        python=platform.python_version(),
        platform=platform.platform(),
    )


def host_tag() -> str:
    """A file-name-safe label for result files: host name and usable CPUs, e.g. ``vm-2cpu``."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", socket.gethostname()).strip("-") or "host"
    return f"{name}-{usable_cpus()}cpu"
