"""The registry of worker kinds: the one place a ``worker_type`` name is looked up.

A new kind is a module with its pool and its ``KIND`` (``pool.WorkerKind``), and one line here.
"""

from __future__ import annotations

from ...errors import ArgumentError
from . import process, thread
from .pool import WorkerKind

KINDS: dict[str, WorkerKind] = {k.name: k for k in (process.KIND, thread.KIND)}
WORKER_TYPES = tuple(KINDS)


def kind(name: object) -> WorkerKind:
    """The kind registered as ``name`` (a one-line ValueError for any other)."""
    found = KINDS.get(name) if isinstance(name, str) else None
    if found is None:
        raise ArgumentError(f"worker_type must be {' or '.join(repr(k) for k in KINDS)}, got {name!r}")
    return found


def check_worker_type(worker_type: object) -> str:
    """``worker_type`` as given, or a one-line ValueError."""
    return kind(worker_type).name
