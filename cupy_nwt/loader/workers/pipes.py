"""Messages over a ``multiprocessing`` pipe at the cost of one pickle and one system call.

``Connection.send`` and ``recv`` wrap every message in checks, a ``BytesIO``, a ``ForkingPickler``
and one read for the length and another for the body; ``multiprocessing.connection.wait`` builds a
selector per call. On a batch's path (a task one way, a small answer the other) that wrapping costs
more than the message. This module speaks the same framing (a 4-byte big-endian length, or -1 and an
8-byte length past 2 GiB, then the pickle), so either end may still use a ``Connection`` on the same
pipe: ``send`` writes a message with one ``os.write``, an ``Inbox`` takes every whole message that has
arrived with one ``os.read``.

A message holding arrays larger than the pipe (a batch made before the ring exists: a 256-image batch
is tens of MB) would cross it 64 KiB at a time, each piece a turn of the scheduler for both ends, and
be copied five times on the way. ``send(spill=)`` writes those arrays into a fresh ``memfd`` instead,
hands its descriptor over a Unix socket (``SCM_RIGHTS``, as torch hands its shared tensors), and sends
the rest of the pickle with the arrays' sizes (a frame marked -2); the receiving ``Inbox`` maps the
file, closes its descriptor, and unpickles the arrays onto the mapping, without a copy. The file has
no name: it is freed with its last descriptor and mapping, whichever process dies.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import os
import pickle
import resource
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import LoaderError, PipeClosedError
from ..ring.frameworks import tensor_reduction

_SHORT = struct.Struct("!i")
_LONG = struct.Struct("!Q")
_SPILLED = -2  # a frame whose large buffers travel in a file: -2, the pickle's length, the buffers' count and sizes
_READ = 1 << 16  # a pipe's default capacity
SPILL_BYTES = _READ  # a buffer this large leaves the pipe, where ``send`` is given a socket to spill through
CAN_SPILL = hasattr(os, "memfd_create") and hasattr(socket, "send_fds")


class _Pickler(pickle.Pickler):
    """A pickler that sends a torch tensor torch's own pickle cannot load back as its bytes
    (``frameworks.tensor_reduction``): one inside an object a ``collate_fn`` returns, say."""

    def reducer_override(self, obj: Any) -> Any:
        return tensor_reduction(obj) or NotImplemented


def _dumps(msg: Any, buffer_callback: Callable[[pickle.PickleBuffer], bool] | None = None) -> bytes:
    """``msg`` pickled; with ``buffer_callback``, by protocol 5, whose buffers it may take out of band."""
    if "torch" in sys.modules:
        out = io.BytesIO()
        _Pickler(out, None if buffer_callback is None else 5, buffer_callback=buffer_callback).dump(msg)
        return out.getvalue()
    if buffer_callback is None:  # a task or an answer: every batch, keyword-free
        return pickle.dumps(msg)
    return pickle.dumps(msg, 5, buffer_callback=buffer_callback)


def out_of_files(what: str, remedy: str) -> LoaderError:
    """This process at its open-files limit (RLIMIT_NOFILE): torch's words first, then what failed and the limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return LoaderError(f"Too many open files: {what} (this process holds its limit of {soft} open files, "
                       f"RLIMIT_NOFILE): raise it (ulimit -n, resource.setrlimit) or {remedy}")


def send(fd: int, msg: Any, spill: socket.socket | None = None) -> None:
    """Pickle ``msg`` and write it whole to the pipe ``fd`` (blocking, as ``Connection.send``); with ``spill``,
    its buffers of ``SPILL_BYTES`` or more go through a file handed over that socket."""
    big: list[pickle.PickleBuffer] = []
    data = _dumps(msg) if spill is None else _dumps(msg, lambda b: _keep(b, big))
    if big:
        assert spill is not None
        frame = _spill(data, big, spill)
        if frame is not None:
            _write(fd, frame)
            return
        data = _dumps(msg)  # no file to be had: every buffer in the pipe
    n = len(data)
    frame = (_SHORT.pack(n) if n <= 0x7FFFFFFF else _SHORT.pack(-1) + _LONG.pack(n)) + data
    done = os.write(fd, frame)
    if done < len(frame):
        _write(fd, frame, done)


def _keep(buffer: pickle.PickleBuffer, big: list[pickle.PickleBuffer]) -> bool:
    """In the pickle (True), or out of it into ``big``: a contiguous buffer of ``SPILL_BYTES`` or more."""
    try:
        raw = buffer.raw()
    except BufferError:  # not contiguous: numpy pickles a copy in-band
        return True
    if raw.nbytes < SPILL_BYTES:
        return True
    big.append(buffer)
    return False


def _spill(data: bytes, big: list[pickle.PickleBuffer], spill: socket.socket) -> bytes | None:
    """Write ``big`` into a new memfd, hand it over ``spill``, and return the frame that announces it; None
    where no file could be made (descriptors or memory short, a seccomp filter): the pipe takes it all."""
    sizes = [b.raw().nbytes for b in big]
    try:
        fd = os.memfd_create("cupy_nwt-batch", os.MFD_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            for b in big:
                view = b.raw()
                while view:
                    view = view[os.write(fd, view):]
        except OSError:
            return None
        socket.send_fds(spill, [b"\0"], [fd])
    finally:
        os.close(fd)
    return (_SHORT.pack(_SPILLED) + _LONG.pack(len(data)) + _SHORT.pack(len(sizes))
            + struct.pack(f"!{len(sizes)}Q", *sizes) + data)


def _map(fd: int, total: int) -> memoryview:
    """The file's first ``total`` bytes, mapped without holding a descriptor: a caller may keep many batches,
    and one descriptor each would run into the open-files limit (torch's ``file_descriptor`` strategy does)."""
    if sys.version_info >= (3, 13):
        return memoryview(mmap.mmap(fd, total, trackfd=False))
    return _Mapping.of(fd, total)


class _Mapping:
    """A shared mapping made with libc's ``mmap`` (before Python 3.13 ``mmap.mmap`` keeps a duplicate of the
    descriptor while it lives), unmapped when the last view of it goes: the views hold the ctypes array
    that holds this object. Where libc's ``mmap`` fails, the file is read into memory instead."""

    libc: Any = None

    def __init__(self, address: int, size: int) -> None:
        self.address, self.size = address, size

    @classmethod
    def of(cls, fd: int, size: int) -> memoryview:
        if cls.libc is None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            cls.libc = libc
        address = cls.libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return _read(fd, size)
        array = (ctypes.c_char * size).from_address(address)
        array.mapping = cls(address, size)  # type: ignore[attr-defined]
        return memoryview(array).cast("B")

    def __del__(self) -> None:
        self.libc.munmap(self.address, self.size)


def _read(fd: int, total: int) -> memoryview:
    """The file's first ``total`` bytes in a new buffer (``np.empty``: ``bytearray()`` writes every page first)."""
    whole = np.empty(total, np.uint8).data
    done = 0
    while done < total:
        n = os.preadv(fd, [whole[done:]], done)
        if n == 0:
            raise PipeClosedError("a worker's spilled file was shorter than its message said")
        done += n
    return whole


def _write(fd: int, buf: bytes, done: int = 0) -> None:
    """``buf`` from byte ``done`` on; a message past the pipe's capacity goes as the reader frees room."""
    view = memoryview(buf)[done:]
    while view:
        view = view[os.write(fd, view):]


class Inbox:
    """The receiving end of a pipe, read in bulk: ``take()`` (call it when ``fd`` is readable) returns the
    messages that arrived whole; one cut short by the pipe's capacity is read to its end first, as
    ``Connection.recv`` would. Raises ``EOFError`` once the writer is gone. ``spill``: the socket a
    sender's large buffers arrive through (``send(spill=)``)."""

    def __init__(self, fd: int, spill: socket.socket | None = None) -> None:
        self.fd, self.spill = fd, spill
        self._buf = b""

    def take(self) -> list[Any]:
        chunk = os.read(self.fd, _READ)
        if not chunk:
            raise PipeClosedError("the worker's pipe closed")
        buf = self._buf + chunk if self._buf else chunk
        out = []
        pos, end = 0, len(buf)
        while end - pos >= 4:
            (size,) = marker = _SHORT.unpack_from(buf, pos)
            head, sizes = 4, None
            if size in (-1, _SPILLED):
                if end - pos < 16:
                    buf = buf[pos:] + self._exactly(16 - (end - pos))
                    pos, end = 0, len(buf)
                (size,) = _LONG.unpack_from(buf, pos + 4)
                head = 12
                if marker[0] == _SPILLED:
                    (count,) = _SHORT.unpack_from(buf, pos + 12)
                    head = 16 + 8 * count
                    if end - pos < head:
                        buf = buf[pos:] + self._exactly(head - (end - pos))
                        pos, end = 0, len(buf)
                    sizes = struct.unpack_from(f"!{count}Q", buf, pos + 16)
            missing = pos + head + size - end
            if missing > 0:
                buf = buf[pos:] + self._exactly(missing)
                pos, end = 0, len(buf)
            body = memoryview(buf)[pos + head:pos + head + size]
            out.append(pickle.loads(body) if sizes is None else pickle.loads(body, buffers=self._spilled(sizes)))
            pos += head + size
        self._buf = buf[pos:]
        return out

    def _spilled(self, sizes: tuple[int, ...]) -> list[memoryview]:
        """The spilled buffers, from the file that came over ``spill``: mapped where the mapping need not keep
        a descriptor open (Python 3.13's ``trackfd``; a caller may keep many batches), else read in one call."""
        if self.spill is None:
            raise PipeClosedError("a worker spilled a message where no socket takes it")
        _, fds, flags, _ = socket.recv_fds(self.spill, 1, 1)
        if not fds and flags & socket.MSG_CTRUNC:  # the kernel dropped the file: this process is out of descriptors
            raise out_of_files("a batch's file from a worker could not be received, and the batch is lost",
                               "close files the program keeps open")
        if not fds:
            raise PipeClosedError("the worker's spill socket closed")
        total = sum(sizes)
        try:
            whole = _map(fds[0], total)
        finally:
            for fd in fds:
                os.close(fd)
        views, at = [], 0
        for n in sizes:
            views.append(whole[at:at + n])
            at += n
        return views

    def _exactly(self, n: int) -> bytes:
        parts = []
        while n > 0:
            chunk = os.read(self.fd, n)
            if not chunk:
                raise PipeClosedError("the worker's pipe closed")
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)
