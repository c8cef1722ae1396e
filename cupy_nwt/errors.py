"""Every error cupy_nwt raises on purpose, under one base, ``CupyNwtError``.

Each class also keeps the builtin base it always had (``ValueError``, ``RuntimeError``,
``MemoryError``, ``TimeoutError``), so a caller's ``except ValueError`` still catches bad data and
``except CupyNwtError`` catches everything of ours. The modules that raise them import them from
here (and keep the old names importable: ``cupy_nwt.loader.ring.collate.BatchLayoutError`` and so on).

This module imports nothing heavy: ``cuda`` and the worker processes import it.
"""

from __future__ import annotations

import os
import signal
from typing import Any


class CupyNwtError(Exception):
    """Base of every error cupy_nwt raises on purpose; ``except CupyNwtError`` catches them all."""


class ArgumentError(CupyNwtError, ValueError):
    """An argument has the wrong type or is out of range; raised by the checks in ``cupy_nwt._checks``."""


class NoGPUError(CupyNwtError, RuntimeError):
    """Raised by GPU-only entry points; its message is one sentence a user can act on."""


class LayoutError(CupyNwtError, ValueError):
    """A half-set or contradictory rank layout; the message names the variables involved."""


class BatchLayoutError(CupyNwtError, ValueError):
    """A sample or batch does not fit the batch layout; ``sample_index`` names the sample if known."""

    def __init__(self, message: str, sample_index: int | None = None) -> None:
        super().__init__(message)
        self.sample_index = sample_index

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.sample_index))


class DataError(CupyNwtError, ValueError):
    """The data itself is bad: the message names the file, archive member or sample and what is wrong."""


class CorruptImageError(DataError):
    """An image that Pillow cannot decode; the message names the file or archive member.

    ``sample_index`` is the dataset index of that image when the dataset knows it.
    """

    def __init__(self, message: str, sample_index: int | None = None) -> None:
        super().__init__(message)
        self.sample_index = sample_index

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.sample_index))


class DamagedArchiveError(DataError):
    """A truncated or garbled archive: names the file and the byte offset where the damage starts.

    For a gzip archive ``offset`` counts bytes of the decompressed tar (or, for a truncated gzip
    stream, of the compressed file).
    """

    def __init__(self, path: str | os.PathLike, offset: int, problem: str) -> None:
        super().__init__(f"{path}: damaged archive at byte offset {offset}: {problem}")
        self.path, self.offset, self.problem = str(path), offset, problem

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.offset, self.problem))


class DataFileError(DataError):
    """A data file that cannot be read as what its name says: empty, cut short, not that format, or
    holding Python objects (which only unpickling could read). Names the file and what is wrong."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = str(path), problem

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.problem))


class StateError(CupyNwtError, ValueError):
    """A saved loader state that cannot be resumed from: ``field`` names the first bad field, ``value`` is it.

    Raised by ``DataLoader.load_state_dict`` before anything changes, so the loader keeps its state.
    """

    def __init__(self, message: str, field: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.field, self.value = field, value

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.field, self.value))


class LoaderError(CupyNwtError, RuntimeError):
    """Base of the loader's own errors: raised when the loader itself is misused or cannot go on."""


class ShmSpaceError(LoaderError, MemoryError):
    """/dev/shm is missing or cannot hold the ring; the message names it, its free and the needed bytes."""


class WorkerError(LoaderError):
    """Loading a batch raised: in a worker (``worker_id`` >= 0) or in the main process (``None``).

    Carries the batch, the dataset index being fetched when it happened (``None`` when the error
    came from collate / transform or ``__getitems__``), the original exception type and the full
    traceback text from where it was raised. ``__cause__`` is the original exception when it could
    be pickled back.
    """

    def __init__(self, message: str, *, worker_id: int | None, pid: int, batch_index: int | None,
                 sample_index: int | None, exc_type: str, traceback_text: str) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid
        self.batch_index = batch_index
        self.sample_index = sample_index
        self.exc_type = exc_type
        self.traceback_text = traceback_text


class WorkerDiedError(LoaderError):
    """A worker process ended without being asked to (a signal, ``os._exit``, a native crash)."""

    def __init__(self, message: str, *, worker_id: int, pid: int, exitcode: int | None) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid
        self.exitcode = exitcode

    @property
    def signal_name(self) -> str | None:
        if self.exitcode is not None and self.exitcode < 0:
            try:
                return signal.Signals(-self.exitcode).name
            except ValueError:
                return f"signal {-self.exitcode}"
        return None


class LoaderTimeoutError(LoaderError, TimeoutError):
    """No batch arrived from the workers within ``timeout`` seconds."""


__all__ = [
    "ArgumentError", "BatchLayoutError", "CorruptImageError", "CupyNwtError", "DamagedArchiveError",
    "DataError", "DataFileError", "LayoutError", "LoaderError", "LoaderTimeoutError", "NoGPUError", "ShmSpaceError",
    "StateError", "WorkerDiedError", "WorkerError",
]


# Each keeps the builtin base Python (or PyTorch) would raise there, so a caller's ``except TypeError``
# (``IndexError``, ``KeyError``, ``FileNotFoundError``, ``ImportError``, ``RuntimeError``) still catches it.

class ArgumentTypeError(CupyNwtError, TypeError):
    """An argument of the wrong kind: the message names it, what it must be and what it got."""


class OutOfRangeError(CupyNwtError, IndexError):
    """An index past the end (a sample, a batch, a slot); an ``IndexError`` so sequence iteration ends on it."""


class UnknownKeyError(CupyNwtError, KeyError):
    """A lookup by name that has no entry; the message lists what there is."""


class MissingPathError(CupyNwtError, FileNotFoundError):
    """A file or folder the caller named (or a tool the package needs) is not there; the message names it."""


class MissingExtraError(CupyNwtError, ImportError):
    """An optional package is not installed; the message says which ``pip install`` brings it."""


class MisuseError(CupyNwtError, RuntimeError):
    """An object used out of order or without what it needs (started twice; ``auto`` with no tuner registered)."""


class RunError(CupyNwtError, RuntimeError):
    """A step the package runs itself (a child process) or an invariant of its own failed: not the caller's input."""


__all__ += ["ArgumentTypeError", "MissingExtraError", "MissingPathError", "MisuseError", "OutOfRangeError",
            "RunError", "UnknownKeyError"]
