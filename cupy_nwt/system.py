"""Host facts (CPU model, cores, memory): the part of ``info`` that never needs a GPU.

What this process may really use, not what the machine has: CPUs under its affinity mask and cgroup
quota, and bytes under available memory and every cgroup limit. Anything about to hold many bytes (the
loader's ring, a synthetic set being built, a data file read whole, an open search growing a loader)
asks ``memory_room`` first, so a container's limit bounds it as the machine's memory does: past a
cgroup's ``memory.max`` the kernel's only answer is the OOM killer.
"""

from __future__ import annotations

import os
import platform
import re
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from .errors import ArgumentError

CACHE_ENV = "CUPY_NWT_CACHE_DIR"
UNLIMITED = 1 << 60  # a cgroup v1 "limit" at or above this is none (the kernel writes 2**63 less a page)


def cache_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """Where cupy_nwt keeps what it builds or learns on this machine (synthetic data, tuned picks).

    ``path`` if given, else ``$CUPY_NWT_CACHE_DIR`` (a leading ``~`` is the home folder), else the user cache
    dir (platformdirs). Without platformdirs (some GPU images lack it) the XDG rule it follows on Linux
    stands in: ``$XDG_CACHE_HOME/cupy_nwt``, else ``~/.cache/cupy_nwt``. A relative ``$CUPY_NWT_CACHE_DIR``
    is refused (``ArgumentError``): it would follow the working folder, and a job run from another one, or
    a launcher that moves each run into a folder of its own (Hydra's), would miss every saved pick.
    """
    if path is not None:
        return Path(path)
    env = os.environ.get(CACHE_ENV)
    if env:  # a "~" that no shell expanded (a quoted value, a service's environment file) is the user's home
        folder = Path(env).expanduser()
        if not folder.is_absolute():
            raise ArgumentError(f"{CACHE_ENV} must be an absolute folder (or start with ~), got {env!r}: a relative "
                                f"one follows the working folder; try {CACHE_ENV}={Path(env).absolute()}")
        return folder
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


#: CPU figures the kernel counts as busy (guest time is already inside user on Linux; steal, a host
#: taking the CPU, is time this machine could not have)
_BUSY = ("user", "nice", "system", "irq", "softirq", "steal")


def affinity_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity mask; every CPU where there is none)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def busy_cpu_seconds(cpus: frozenset[int]) -> float | None:
    """Seconds the CPUs ``cpus`` have spent busy since boot, summed: read on this process's CPUs, other
    work's load is what competes with it (in a container pinned to a few CPUs of a big host, the
    machine's total is the host's). None where the kernel does not say.

    Args:
        cpus: CPU numbers (:func:`affinity_cpus`).
    """
    try:
        per_cpu = psutil.cpu_times(percpu=True)
    except (psutil.Error, OSError, NotImplementedError):
        return None
    seen = [per_cpu[i] for i in sorted(cpus) if i < len(per_cpu)]
    return sum(getattr(t, f, 0.0) for t in seen for f in _BUSY) if seen else None


def usable_cpus(root: str = "/") -> int:
    """CPUs this process may really use: its affinity mask, then the CPU quota of its cgroup and every
    ancestor (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), rounded down, at least one: a container given
    half a core, or a SLURM job given two of a node's 64, must not be searched at 64 workers.

    ``root`` prefixes every path read (/proc, /sys): tests hand it a made-up tree.
    """
    n = len(affinity_cpus())
    for folder, v2 in _cgroup_folders(root, "cpu"):
        quota = _cpu_quota_at(folder, v2)
        if quota is not None:
            n = min(n, max(1, int(quota)))
    return max(1, n)


def _cpu_quota_at(folder: str, v2: bool) -> float | None:
    """The CPUs a cgroup's quota allows per period; None where it sets none."""
    if v2:
        try:
            with open(os.path.join(folder, "cpu.max"), encoding="ascii") as f:
                text, every = f.read().split()[:2]
            return None if text == "max" else int(text) / int(every)
        except (OSError, ValueError, ZeroDivisionError):
            return None
    quota_us = _read_int(os.path.join(folder, "cpu.cfs_quota_us"))  # -1 (no quota) reads as None
    period_us = _read_int(os.path.join(folder, "cpu.cfs_period_us"))
    return quota_us / period_us if quota_us is not None and period_us else None


@dataclass(frozen=True)
class Room:
    """How many bytes may still be taken, and what bounds them (for an error message)."""

    bytes: int
    bound: str


def memory_room(root: str = "/") -> Room:
    """The smaller of available memory (MemAvailable) and the headroom under every cgroup limit.

    ``root`` prefixes every path read (/proc, /sys): tests hand it a made-up tree.
    """
    best = Room(available_memory(root), "in available memory (MemAvailable)")
    for room in cgroup_rooms(root):
        if room.bytes < best.bytes:
            best = room
    return best


def available_memory(root: str = "/") -> int:
    """MemAvailable of /proc/meminfo (free pages and reclaimable cache), or the free pages where it is missing."""
    try:
        with open(os.path.join(root, "proc/meminfo"), encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def cgroup_rooms(root: str = "/") -> list[Room]:
    """The headroom under each memory limit of this process's cgroups (v2 and v1) and their ancestors.

    v2: ``memory.max`` less ``memory.current``; v1: ``memory.limit_in_bytes`` less ``memory.usage_in_bytes``;
    each less the group's page cache (``memory.stat``), which the kernel reclaims before it refuses.
    """
    return [room for folder, v2 in _cgroup_folders(root, "memory") if (room := _limit_at(folder, v2)) is not None]


def memory_limit(root: str = "/") -> int | None:
    """The smallest memory limit among this process's cgroups and their ancestors; None where none is set."""
    limits = [_read_int(os.path.join(folder, "memory.max" if v2 else "memory.limit_in_bytes"))
              for folder, v2 in _cgroup_folders(root, "memory")]
    return min((v for v in limits if v is not None and v < UNLIMITED), default=None)


def _cgroup_folders(root: str, controller: str) -> list[tuple[str, bool]]:
    """The folders of this process's cgroups that ``controller`` governs (v2's unified tree and v1's), each
    from the group up to its mount, and whether each is v2's."""
    try:
        with open(os.path.join(root, "proc/self/cgroup"), encoding="utf-8") as f:
            groups = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
        with open(os.path.join(root, "proc/self/mountinfo"), encoding="utf-8") as f:
            mounts = [_mount(line) for line in f]
    except OSError:
        return []
    folders = []
    for _, controllers, path in groups:
        v2 = controllers == ""
        if not v2 and controller not in controllers.split(","):
            continue
        for fstype, opts, mount_root, point in (m for m in mounts if m is not None):
            if fstype == "cgroup2" if v2 else fstype == "cgroup" and controller in opts.split(","):
                mount = os.path.join(root, point.lstrip("/"))
                folders += [(folder, v2) for folder in _up_to(mount, _relative(path, mount_root))]
    return folders


def _mount(line: str) -> tuple[str, str, str, str] | None:
    """(fstype, super options, mount root, mount point) of one /proc/self/mountinfo line."""
    left, sep, right = line.partition(" - ")
    fields, tail = left.split(), right.split()
    if not sep or len(fields) < 5 or len(tail) < 3:
        return None
    return tail[0], tail[2], fields[3], fields[4]


def _relative(path: str, mount_root: str) -> str:
    """The cgroup's path below the mount (a cgroup namespace's mount shows its own root as /)."""
    path, mount_root = path.rstrip("/") or "/", mount_root.rstrip("/") or "/"
    if mount_root == "/":
        return path.lstrip("/")
    if path == mount_root or path.startswith(mount_root + "/"):
        return path[len(mount_root):].lstrip("/")
    return ""


def _up_to(mount: str, rel: str) -> list[str]:
    """The cgroup's folder and each ancestor up to the mount (a missing folder: the mount's)."""
    mount = os.path.normpath(mount)
    folder = os.path.normpath(os.path.join(mount, rel))
    if not os.path.isdir(folder):
        folder = mount
    folders = [folder]
    while len(folder) > len(mount):
        folder = os.path.dirname(folder)
        folders.append(folder)
    return folders


def _limit_at(folder: str, v2: bool) -> Room | None:
    names = ("memory.max", "memory.current", "active_file", "inactive_file") if v2 else (
        "memory.limit_in_bytes", "memory.usage_in_bytes", "total_active_file", "total_inactive_file")
    limit, usage = _read_int(os.path.join(folder, names[0])), _read_int(os.path.join(folder, names[1]))
    if limit is None or usage is None or limit >= UNLIMITED:
        return None
    stat = _read_stat(os.path.join(folder, "memory.stat"))
    cache = stat.get(names[2], 0) + stat.get(names[3], 0)
    free = max(0, limit - max(0, usage - cache))
    return Room(free, f"under the cgroup memory limit {os.path.join(folder, names[0])} "
                      f"({limit / 2**20:.1f} MiB, {usage / 2**20:.1f} MiB in use)")


def _read_int(path: str) -> int | None:
    """An integer file; ``max`` (v2's "no limit") and a missing or odd file are None."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def _read_stat(path: str) -> dict[str, int]:
    try:
        with open(path, encoding="ascii") as f:
            pairs = [line.split() for line in f]
    except (OSError, UnicodeDecodeError):
        return {}
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


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
    """This machine as this process sees it: inside a container, its cgroup's CPU quota and memory limit."""
    vm = psutil.virtual_memory()
    limit = memory_limit()
    return HostInfo(
        cpu_model=cpu_model(),
        logical_cpus=os.cpu_count() or 1,
        physical_cpus=psutil.cpu_count(logical=False),
        usable_cpus=usable_cpus(),
        memory_total_bytes=int(vm.total) if limit is None else min(int(vm.total), limit),
        memory_available_bytes=min(int(vm.available), memory_room().bytes),
        python=platform.python_version(),
        platform=platform.platform(),
    )


def host_tag() -> str:
    """A file-name-safe label for result files: host name and usable CPUs, e.g. ``vm-2cpu``."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", socket.gethostname()).strip("-") or "host"
    return f"{name}-{usable_cpus()}cpu"
