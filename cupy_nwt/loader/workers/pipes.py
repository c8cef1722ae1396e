"""Messages over a ``multiprocessing`` pipe at the cost of one pickle and one system call.

``Connection.send`` and ``recv`` wrap every message in checks, a ``BytesIO``, a ``ForkingPickler``
and one read for the length and another for the body; ``multiprocessing.connection.wait`` builds a
selector per call. On a batch's path (a task one way, a small answer the other) that wrapping costs
more than the message. This module speaks the same framing (a 4-byte big-endian length, or -1 and an
8-byte length past 2 GiB, then the pickle), so either end may still use a ``Connection`` on the same
pipe: ``send`` writes a message with one ``os.write``, an ``Inbox`` takes every whole message that has
arrived with one ``os.read``.
"""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

from ...errors import PipeClosedError

_SHORT = struct.Struct("!i")
_LONG = struct.Struct("!Q")
_READ = 1 << 16  # a pipe's default capacity


def send(fd: int, msg: Any) -> None:
    """Pickle ``msg`` and write it whole to the pipe ``fd`` (blocking, as ``Connection.send``)."""
    data = pickle.dumps(msg)
    n = len(data)
    head = _SHORT.pack(n) if n <= 0x7FFFFFFF else _SHORT.pack(-1) + _LONG.pack(n)
    buf = head + data
    done = os.write(fd, buf)
    if done < len(buf):  # a message past the pipe's capacity: the rest as the reader frees room
        view = memoryview(buf)[done:]
        while view:
            view = view[os.write(fd, view):]


class Inbox:
    """The receiving end of a pipe, read in bulk: ``take()`` (call it when ``fd`` is readable) returns the
    messages that arrived whole; one cut short by the pipe's capacity is read to its end first, as
    ``Connection.recv`` would. Raises ``EOFError`` once the writer is gone."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = b""

    def take(self) -> list[Any]:
        chunk = os.read(self.fd, _READ)
        if not chunk:
            raise PipeClosedError("the worker's pipe closed")
        buf = self._buf + chunk if self._buf else chunk
        out = []
        pos, end = 0, len(buf)
        while end - pos >= 4:
            (size,) = _SHORT.unpack_from(buf, pos)
            head = 4
            if size == -1:
                if end - pos < 12:
                    break
                (size,) = _LONG.unpack_from(buf, pos + 4)
                head = 12
            missing = pos + head + size - end
            if missing > 0:
                buf = buf[pos:] + self._exactly(missing)
                pos, end = 0, len(buf)
            out.append(pickle.loads(memoryview(buf)[pos + head:pos + head + size]))
            pos += head + size
        self._buf = buf[pos:]
        return out

    def _exactly(self, n: int) -> bytes:
        parts = []
        while n > 0:
            chunk = os.read(self.fd, n)
            if not chunk:
                raise PipeClosedError("the worker's pipe closed")
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)
