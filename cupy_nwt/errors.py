"""Every error cupy_nwt raises on purpose, under one base, ``CupyNwtError``.

Each class also keeps a builtin base (``ValueError``, ``TypeError``, ``KeyError``, ``RuntimeError``,
``MemoryError``, ``TimeoutError``), so a caller's ``except ValueError`` still catches bad data and
``except CupyNwtError`` catches everything of ours. Every class is defined here and only here; the
modules that raise them import them from this one, and users from ``cupy_nwt``.

Every class can be built from a message alone (``Cls("message")``) and survives a pickle round trip
with its type, message and fields (the default ``(type, args, __dict__)`` reduction), so an error
crosses a ``multiprocessing.Pool``, a Ray task or any harness that forwards exceptions as itself.

This module imports nothing heavy: ``cuda`` and the worker processes import it.
"""

from __future__ import annotations

import os
import pickle
import signal
from typing import Any


class CupyNwtError(Exception):
    """Base of every error cupy_nwt raises on purpose; ``except CupyNwtError`` catches them all."""


class ArgumentError(CupyNwtError, ValueError):
    """A bad argument: out of range, malformed, or (as its subclass ``ArgumentTypeError``) of the wrong type;
    raised by the checks in ``cupy_nwt._checks``. Catching it catches every bad argument."""


class NoGPUError(CupyNwtError, RuntimeError):
    """Raised by GPU-only entry points; its message is one sentence a user can act on."""


class LayoutError(CupyNwtError, ValueError):
    """A half-set or contradictory rank layout; the message names the variables involved."""


class BatchLayoutError(CupyNwtError, ValueError):
    """A sample or batch does not fit the batch layout; ``sample_index`` names the sample if known."""

    def __init__(self, message: str, sample_index: Any = None) -> None:
        super().__init__(message)
        self.sample_index = sample_index


class BatchTypeError(BatchLayoutError, TypeError):
    """A sample field no array can hold (None, a set, an object array): a ``TypeError`` too, the type
    torch's ``default_collate`` raises for it, so an ``except TypeError`` written for torch catches it."""


class BatchStructureError(BatchLayoutError, RuntimeError):
    """A sample shaped unlike the first (a list of another length, other keys): a ``RuntimeError`` too,
    as torch's ``default_collate`` raises for lists of unequal size."""


class DataError(CupyNwtError, ValueError):
    """The data itself is bad: the message names the file, archive member or sample and what is wrong."""


class CorruptImageError(DataError):
    """An image that Pillow cannot decode; the message names the file or archive member.

    ``sample_index`` is the dataset index of that image when the dataset knows it.
    """

    def __init__(self, message: str, sample_index: Any = None) -> None:
        super().__init__(message)
        self.sample_index = sample_index


class DamagedArchiveError(DataError):
    """A truncated or garbled archive: names the file and the byte offset where the damage starts.

    For a gzip archive ``offset`` counts bytes of the decompressed tar (or, for a truncated gzip
    stream, of the compressed file).
    """

    def __init__(self, path: str | os.PathLike, offset: int | None = None, problem: str | None = None) -> None:
        if offset is None and problem is None:  # built from a message alone: no fields known
            super().__init__(str(path))
            self.path, self.offset, self.problem = None, None, None
            return
        super().__init__(f"{path}: damaged archive at byte offset {offset}: {problem}")
        self.path, self.offset, self.problem = str(path), offset, problem


class TooManyBadSamplesError(DataError):
    """More samples failed to read or decode in one epoch than ``max_bad_samples`` allows: the epoch
    stops. The message says how many, the limit, and the last one's file and reason."""


class DataFileError(DataError):
    """A data file that cannot be read as what its name says: empty, cut short, not that format, or
    holding Python objects (which only unpickling could read). Names the file and what is wrong."""

    def __init__(self, path: str | os.PathLike, problem: str | None = None) -> None:
        if problem is None:  # built from a message alone: no fields known
            super().__init__(str(path))
            self.path, self.problem = None, None
            return
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = str(path), problem


class StateError(CupyNwtError, ValueError):
    """A loader state that cannot be resumed from (``field`` names the first bad field, ``value`` is it), or
    cannot be saved (a dataset's own state that raises, does not pickle, or is too large).

    Raised by ``DataLoader.load_state_dict`` before anything changes, so the loader keeps its state, and by
    ``DataLoader.state_dict``, which leaves iteration as it was.
    """

    def __init__(self, message: str, field: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.field, self.value = field, value


class LoaderError(CupyNwtError, RuntimeError):
    """Base of the loader's own errors: raised when the loader itself is misused or cannot go on."""


class ShmSpaceError(LoaderError, MemoryError):
    """The ring does not fit where it would live: /dev/shm is missing or too small (this class), or memory is
    (``RingMemoryError``); the one-line message names the place, its free and the needed bytes, and what to lower."""


class RingMemoryError(ShmSpaceError):
    """Memory (available, or under a cgroup's limit) cannot hold the ring of anonymous shared memory.

    A subclass of ``ShmSpaceError`` so that code written for the /dev/shm ring still catches it.
    """


class WorkerError(LoaderError):
    """Loading a batch raised: in a worker (``worker_id`` >= 0) or in the main process (``None``).

    Carries the batch, the dataset index being fetched when it happened (``None`` when the error
    came from collate / transform or ``__getitems__``), the original exception type and the full
    traceback text from where it was raised. ``__cause__`` is the original exception when it could
    be pickled back. The loader raises it as the original type too where that type can be built
    from a message (``as_worker_error``): ``except KeyError`` catches it, as with PyTorch.
    """

    def __init__(self, message: str, *, worker_id: int | None = None, pid: int | None = None,
                 batch_index: int | None = None, sample_index: Any = None, exc_type: str = "",
                 traceback_text: str = "") -> None:
        super().__init__(message)
        _fill(self, worker_id=worker_id, pid=pid, batch_index=batch_index, sample_index=sample_index,
              exc_type=exc_type, traceback_text=traceback_text)


def _fill(err: BaseException, **fields: Any) -> None:
    for name, value in fields.items():
        setattr(err, name, value)


class _KeyErrorMessage(str):
    """A ``KeyError`` prints ``repr`` of its argument; this text prints as itself (multi-line, unquoted)."""

    def __repr__(self) -> str:
        return str(self)


# Raising these from ``__next__`` would end the caller's loop instead of reporting the failure.
_NEVER_AS = (StopIteration, StopAsyncIteration)
_DUAL: dict[type, type] = {}


def _dual_class(original: type) -> type | None:
    """A subclass of both ``original`` and ``WorkerError`` (one per original type), or None where
    the two cannot be combined (an incompatible layout, or a type that must not be raised this way)."""
    if (not isinstance(original, type) or not issubclass(original, Exception) or issubclass(original, WorkerError)
            or issubclass(original, _NEVER_AS)):
        return None
    if original not in _DUAL:
        try:
            dual = type(original.__name__, (original, WorkerError), {"__reduce__": _reduce_dual,
                                                                     "__module__": original.__module__})
            dual.__qualname__ = original.__qualname__
        except TypeError:
            return None
        _DUAL[original] = dual
    return _DUAL[original]


def as_worker_error(original: type | None, message: str, **fields: Any) -> WorkerError:
    """A ``WorkerError`` for a failed batch that is also an instance of ``original`` (the dataset's own
    exception type) when that type can be built from ``message`` alone, as PyTorch requires of it
    too; a plain ``WorkerError`` otherwise. ``fields`` are ``WorkerError``'s."""
    dual = _dual_class(original) if original is not None else None
    if dual is not None:
        try:
            err = dual(_KeyErrorMessage(message) if issubclass(dual, KeyError) else message)
        except Exception:  # noqa: BLE001 - its __init__ wants more than a message: the plain type
            err = None
        if err is not None:
            _fill(err, **fields)
            return err
    return WorkerError(message, **fields)


def _rebuild_worker_error(original: type | None, message: str) -> WorkerError:
    return as_worker_error(original, message)


def _reduce_dual(self: WorkerError) -> tuple[Any, ...]:
    """Pickled as (original type, message) and rebuilt the same way; as a plain ``WorkerError`` where the
    original type cannot be pickled by reference (a class defined inside a function)."""
    original: type | None = next(c for c in type(self).__mro__[1:] if c in _DUAL)
    try:
        pickle.dumps(original)
    except Exception:  # noqa: BLE001 - only a reference to an importable class travels
        original = None
    message = str(self.args[0]) if self.args else str(self)
    return (_rebuild_worker_error, (original, message), dict(vars(self)))


class WorkerDiedError(LoaderError):
    """A worker process ended without being asked to (a signal, ``os._exit``, a native crash)."""

    def __init__(self, message: str, *, worker_id: int | None = None, pid: int | None = None,
                 exitcode: int | None = None) -> None:
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


class LoaderClosedError(LoaderError):
    """The loader was closed (by another thread, or a signal handler) while this thread waited in ``next()``.

    A wait cut short is an error, not the epoch's end: a background thread reading the loader must not take
    a close for a finished epoch. A ``next()`` begun after the close ends the iteration, as on one thread.
    """


__all__ = [
    "ArgumentError", "BatchLayoutError", "BatchStructureError", "BatchTypeError", "CorruptImageError", "CupyNwtError", "DamagedArchiveError",
    "DataError", "DataFileError", "LayoutError", "LoaderClosedError", "LoaderError", "LoaderTimeoutError", "NoGPUError", "RingMemoryError", "ShmSpaceError",
    "StateError", "WorkerDiedError", "WorkerError",
]


# Each keeps the builtin base Python (or PyTorch) would raise there, so a caller's ``except TypeError``
# (``IndexError``, ``KeyError``, ``FileNotFoundError``, ``ImportError``, ``RuntimeError``) still catches it.

class ArgumentTypeError(ArgumentError, TypeError):
    """A bad argument of the wrong type, also a ``TypeError`` where PyTorch raises one: the message names it,
    what it must be and what it got."""


class OutOfRangeError(CupyNwtError, IndexError):
    """An index past the end (a sample, a batch, a slot); an ``IndexError`` so sequence iteration ends on it."""


class UnknownKeyError(CupyNwtError, KeyError):
    """A lookup by name that has no entry; the message lists what there is."""

    def __str__(self) -> str:
        return Exception.__str__(self)  # KeyError's own str() would quote the message like a key


class MissingPathError(CupyNwtError, FileNotFoundError):
    """A file or folder the caller named (or a tool the package needs) is not there; the message names it."""


class MissingExtraError(CupyNwtError, ImportError):
    """An optional package is not installed; the message says which ``pip install`` brings it."""


class MisuseError(CupyNwtError, RuntimeError):
    """An object used out of order or without what it needs (started twice; ``auto`` with no tuner registered)."""


class RunError(CupyNwtError, RuntimeError):
    """A step the package runs itself (a child process) or an invariant of its own failed: not the caller's input."""


class PipeClosedError(CupyNwtError, EOFError):
    """The other end of a worker's pipe is gone (an ``EOFError``, as ``Connection.recv`` raises): the
    loader reads it as that worker's end, never shows it to a caller."""


__all__ += ["ArgumentTypeError", "MissingExtraError", "MissingPathError", "MisuseError", "OutOfRangeError",
            "RunError", "UnknownKeyError"]


class SavedPickError(CupyNwtError, ValueError):
    """A saved pick (or the store holding it) cannot be read or does not validate; the message says why."""


class AgainstError(CupyNwtError, RuntimeError):
    """The base revision could not be checked out or measured; the message says which step and why."""


class CallgrindError(CupyNwtError, RuntimeError):
    """Counting under callgrind failed: valgrind missing, the command failed or timed out, or no total."""


class BaselineError(CupyNwtError, ValueError):
    """A throughput-gate baseline (a ``--nwt-baseline`` file, or a run ``--benchmark-compare`` selected) that
    cannot be read or does not check out; the message names the file, the benchmark and the field."""


__all__ += ["AgainstError", "BaselineError", "CallgrindError", "SavedPickError", "TooManyBadSamplesError"]
