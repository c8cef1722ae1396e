"""What a command's end says: its exit code and one line on stderr, for every failure a user can cause or meet.

Bad input, no GPU, bad data, a dead worker: each ends as one line and its own code (``EXIT_CODES``), never a
traceback unless ``--debug`` (or ``CUPY_NWT_DEBUG=1``) asks for one.
"""

from __future__ import annotations

import argparse

from ..errors import (
    BatchLayoutError,
    CupyNwtError,
    DataError,
    LoaderError,
    LoaderTimeoutError,
    NoGPUError,
    RunError,
    WorkerDiedError,
    WorkerError,
)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_GPU = 3
EXIT_BAD_DATA = 4
EXIT_WORKER = 5
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command whose reader went away
DEBUG_ENV = "CUPY_NWT_DEBUG"

EXIT_CODES = f"""exit codes:
  0    done
  1    a run's own check failed, or an unexpected error
  2    bad input: options, paths, arguments
  3    no usable GPU for a command that needs one
  4    bad data: a file, archive member or sample that cannot be read or does not fit
  5    the loader failed: a worker died or stopped delivering, or memory (or /dev/shm) has no room for its ring
  130  interrupted
  141  the output's reader went away (a closed pipe, as `| head` closes it): stopped quietly

Errors are one line on stderr; --debug (or {DEBUG_ENV}=1) adds the full traceback."""



def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _loading_failure(exc: BaseException, args: argparse.Namespace) -> str:
    """One line for a batch that failed to load: the file, member or sample, and what is wrong."""
    from ..data.datasets import sample_source  # noqa: PLC0415 - only on the error path

    cause = exc.__cause__
    index = getattr(cause, "sample_index", None)
    index = getattr(exc, "sample_index", None) if index is None else index
    where = getattr(args, "dataset", None) or "the dataset"
    if isinstance(cause, DataError):
        what = _first_line(cause)
    elif isinstance(cause, BatchLayoutError):
        if index is not None:
            where = sample_source(getattr(args, "opened_dataset", None), index)
        what = f"{where}: {_first_line(cause)}"
    else:
        at = f"sample {index}" if index is not None else f"batch {getattr(exc, 'batch_index', '?')}"
        kind = getattr(exc, "exc_type", None) or type(cause).__name__
        detail = _first_line(cause) if cause is not None else _first_line(exc).partition(f"{kind}: ")[2]
        what = f"{where}, {at}: {kind}: {detail or _first_line(exc)}"
    return _with_index(what, index)


def _with_index(what: str, index: int | None) -> str:
    if index is None or f"sample {index}" in what or f"sample index {index}" in what:
        return what
    return f"{what} (sample {index})"


def failure(exc: BaseException, args: argparse.Namespace) -> tuple[int, str]:
    """The exit code and the one line for the error a command ended with: a message of several lines
    (a user's module may raise one) is joined into one."""
    code, text = _failure(exc, args)
    return code, " ".join(text.split()) or type(exc).__name__


def _failure(exc: BaseException, args: argparse.Namespace) -> tuple[int, str]:
    if isinstance(exc, NoGPUError):
        return EXIT_NO_GPU, str(exc)
    if isinstance(exc, WorkerError):  # before DataError: it may be one too (the dataset's own type)
        return EXIT_BAD_DATA, f"bad data: {_loading_failure(exc, args)}"
    if isinstance(exc, DataError):
        return EXIT_BAD_DATA, f"bad data: {_with_index(_first_line(exc), getattr(exc, 'sample_index', None))}"
    if isinstance(exc, (WorkerDiedError, LoaderTimeoutError)):
        return EXIT_WORKER, f"loader worker failed: {_first_line(exc)}"
    if isinstance(exc, LoaderError):  # e.g. RingMemoryError: no room in memory for the ring
        return EXIT_WORKER, f"loader failed: {_first_line(exc)}"
    if isinstance(exc, FileNotFoundError) or (isinstance(exc, CupyNwtError) and isinstance(exc, (ValueError, ImportError))):
        return EXIT_USAGE, str(exc)  # ours only: another library's ValueError says nothing about the user's input
    if isinstance(exc, RunError):  # a run that could not go on, e.g. the user's --step raised: it says which
        return EXIT_FAILED, f"{_first_line(exc)} (--debug shows where)"
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, f"interrupted {_first_line(exc)}" if str(exc) else "interrupted"
    return EXIT_FAILED, f"unexpected error: {type(exc).__name__}: {_first_line(exc)} (--debug shows where)"

