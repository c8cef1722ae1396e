"""Where a process ring's bytes live, and whether the machine can hold them before they are promised.

The ring of process workers is an anonymous shared file (``memfd_create``). It has no name in
/dev/shm, so neither a container's 64 MiB /dev/shm nor a read-only one bounds it, only memory does;
and the kernel frees it when its last descriptor and mapping go, however their processes ended
(a whole process group SIGKILLed, the resource tracker with it, included). The pool makes the file
before its workers start, so it travels with them: inherited under fork, and under forkserver and
spawn passed as a descriptor in the process object (``multiprocessing.reduction.DupFd``), the way
``multiprocessing`` passes its own pipes. Where ``memfd_create`` is missing (not Linux, a kernel
before 3.17, a seccomp filter that refuses it) the ring is a named /dev/shm segment
(``ring.Ring``), and a log line says so once per process.

Memory is checked before it is promised: the ring's bytes against ``system.memory_room`` (available
memory and the headroom under every cgroup limit of the process). Then
``posix_fallocate`` allocates the pages in the main process, on a thread beside the first batch (a page
a worker writes before the thread reaches it, the worker allocates), and a refusal is an error the pool
raises. Sizing with ``ftruncate`` alone only promises the pages:
the first write to each would allocate it in a worker, mid-batch, where the kernel's only answer is
the OOM killer. The size is then sealed (``F_SEAL_SHRINK | F_SEAL_GROW``): no holder can cut pages
from under another's mapping.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import secrets
from multiprocessing import reduction
from typing import Any

from ..._background import Background
from ...errors import RingMemoryError
from ...system import Room, memory_room

log = logging.getLogger("cupy_nwt.loader")

NAME_PREFIX = "cupy_nwt_"
MEMFD_LINK = "/memfd:"  # how /proc/<pid>/fd and /proc/<pid>/maps show an anonymous file
_SEALS = sum(getattr(fcntl, n, 0) for n in ("F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_SEAL"))  # Linux only, as memfd
_fallback_said = False


class RingFile:
    """One worker pool's anonymous shared file: made empty before the workers start, sized once (``reserve``).

    ``name`` is the memfd's, shown as ``/memfd:<name> (deleted)`` in ``/proc/<pid>/fd`` and ``maps``:
    ``cupy_nwt_<creator pid>_<random>``, as the /dev/shm segments are named.
    """

    def __init__(self, fd: int, name: str) -> None:
        self.fd, self.name = fd, name
        self._allocating: Background | None = None  # the thread allocating the pages
        self._refused: str | None = None
        self._nbytes = 0

    @classmethod
    def create(cls) -> RingFile | None:
        """A new empty file, or None where anonymous shared files are missing (said once)."""
        name = f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except AttributeError:
            _say_fallback("os.memfd_create is missing (not Linux, or Python built without it)")
            return None
        except OSError as exc:
            _say_fallback(f"memfd_create failed: {exc.strerror}")
            return None
        return cls(fd, name)

    def reserve(self, nbytes: int) -> None:
        """Check the memory and size the file now; allocate every page on a thread beside the caller, then seal
        the size (once: the seals refuse a second). The check is what refuses a ring the machine cannot hold,
        before the first batch; allocating the pages (time that grows with the ring: 32 slots of
        ImageNet's batches are 1.2 GB) need not hold that batch back, and a page a worker writes first it
        allocates itself. ``settle()`` waits for the allocation and raises the kernel's refusal, if any."""
        check_room(nbytes)
        try:
            os.ftruncate(self.fd, nbytes)
        except OSError as exc:
            raise RingMemoryError(_need(nbytes, memory_room(), f" ({exc.strerror})")) from None
        self._nbytes = nbytes
        self._allocating = Background(self._allocate, nbytes)

    def _allocate(self, nbytes: int) -> None:
        try:
            os.posix_fallocate(self.fd, 0, nbytes)
        except OSError as exc:
            self._refused = exc.strerror or str(exc)
            return
        with contextlib.suppress(AttributeError, OSError):  # a safeguard, not a need: the pages are there
            fcntl.fcntl(self.fd, getattr(fcntl, "F_ADD_SEALS"), _SEALS)

    def settle(self, *, wait: bool = True) -> None:
        """Wait for the pages' allocation (or, ``wait=False``, look whether it ended) and raise ``RingMemoryError``
        if the kernel refused it: memory went elsewhere between the check and the allocation."""
        running = self._allocating
        if running is None or not (running.wait() if wait else running.done()):
            return
        self._allocating = None
        if self._refused is not None:
            refused, self._refused = self._refused, None
            raise RingMemoryError(_need(self._nbytes, memory_room(), f" ({refused})"))

    @property
    def allocating(self) -> bool:
        return self._allocating is not None

    def map(self, nbytes: int) -> mmap.mmap:
        """A shared mapping of the file's first ``nbytes`` (a worker maps what the owner reserved)."""
        return mmap.mmap(self.fd, nbytes)

    def close(self) -> None:
        """Close this process's descriptor (mappings stay valid), once its pages are allocated. Idempotent."""
        with contextlib.suppress(RingMemoryError):
            self.settle()
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __reduce__(self) -> tuple[Any, ...]:
        # Under forkserver and spawn the descriptor rides with the process object (the popen being
        # started duplicates it for the child); under fork the object is not pickled: the child inherits it.
        return _rebuild, (reduction.DupFd(self.fd), self.name)


def _rebuild(dup: Any, name: str) -> RingFile:
    return RingFile(dup.detach(), name)


def _say_fallback(why: str) -> None:
    global _fallback_said
    if not _fallback_said:
        _fallback_said = True
        log.warning("%s: the loader's ring is a /dev/shm segment instead of anonymous shared memory, so /dev/shm's "
                    "free space bounds it and a SIGKILL to the whole process group leaves it behind", why)


def memfd_available() -> bool:
    """Whether this process can make an anonymous shared file (tried, not guessed)."""
    try:
        os.close(os.memfd_create("cupy_nwt_probe", os.MFD_CLOEXEC))
    except (AttributeError, OSError):
        return False
    return True


# ---------------------------------------------------------------- the memory check


def check_room(nbytes: int) -> None:
    """RingMemoryError, one line, when ``nbytes`` exceed what memory (or a cgroup's limit) has free."""
    room = memory_room()
    if nbytes > room.bytes:
        raise RingMemoryError(_need(nbytes, room, ""))


def _need(nbytes: int, room: Room, why: str) -> str:
    return (f"the loader's ring needs {nbytes / 2**20:.1f} MiB of shared memory ({nbytes} bytes) but only "
            f"{room.bytes / 2**20:.1f} MiB ({room.bytes} bytes) are free {room.bound}{why}; lower batch_size, "
            "num_workers or prefetch_factor, or give the machine or container more memory (docker --memory)")


# ---------------------------------------------------------------- finding rings (tests, leak checks)


def held_memfds(pid: int | None = None) -> dict[str, str]:
    """Anonymous ring files some process still holds or maps: ``memfd:<name>`` -> a /proc path to it.

    All cupy_nwt rings, or those created by process ``pid``. Reads every /proc/<pid>/fd and maps
    it may (a process's own, or all as root); the path (a /proc fd link) stats to the file's size.
    """
    prefix = f"{MEMFD_LINK}{NAME_PREFIX}" + ("" if pid is None else f"{pid}_")
    found: dict[str, str] = {}
    for proc in (p for p in _listdir("/proc") if p.isdigit()):
        fd_dir = f"/proc/{proc}/fd"
        for fd in _listdir(fd_dir):
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith(prefix):
                found.setdefault(_memfd_key(target), f"{fd_dir}/{fd}")
        try:
            with open(f"/proc/{proc}/maps", encoding="utf-8", errors="replace") as f:
                hits = [line.split(None, 5) for line in f if prefix in line]
        except OSError:
            continue
        for fields in hits:
            found.setdefault(_memfd_key(fields[-1].strip()), f"/proc/{proc}/map_files/{fields[0]}")
    return found


def _memfd_key(target: str) -> str:
    return "memfd:" + target[len(MEMFD_LINK):].split(" ")[0]


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
