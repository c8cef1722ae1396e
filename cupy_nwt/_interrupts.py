"""Ctrl-C held back across the few steps where Python would lose it.

Python raises ``KeyboardInterrupt`` in the main thread at its next bytecode, wherever that is. Inside a
fork's at-fork hooks (``os.register_at_fork``, which logging and multiprocessing install) or inside a C
library's callback into Python (Numba compiling through llvmlite), that exception cannot propagate: it is
printed as "Exception ignored" and dropped, and the program runs on as if never interrupted (an
interrupted ``cupy-nwt tune`` finished and exited 0). A forked child interrupted before it sets its own
handler prints a traceback beside the parent's one line. So, for these steps, the main thread's SIGINT
handler is one that only notes the signal, which the program's own handler then gets as the step ends;
and SIGINT is blocked in the calling thread, so that a child started there inherits it blocked and
unblocks it once it ignores it (:func:`release_in_child`). The kernel hands a signal sent to the process
to any thread that does not block it, so the mask alone would not do where the loader runs threads.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["ctrl_c_held", "release_in_child"]

_CAN_MASK = hasattr(signal, "pthread_sigmask")


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """A Ctrl-C during the block (a fork, a compile) reaches the program's SIGINT handler as the block ends.

    Whatever interrupts it, the mask and the handler are put back: both are read before anything changes.
    """
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ()) if _CAN_MASK else None
    handler = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    came: list[FrameType | None] = []
    try:
        if handler is not None:  # (None: not the main thread, or a handler set outside Python: left alone)
            signal.signal(signal.SIGINT, lambda signum, frame: came.append(frame))
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        yield
    finally:
        try:
            if mask is not None:  # first: a signal pending here now reaches the recorder, not the program
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        finally:
            if handler is not None:
                signal.signal(signal.SIGINT, handler)
                if came:
                    _deliver(handler, came[0])


def _deliver(handler: object, frame: FrameType | None) -> None:
    """A SIGINT held back, given to the handler the program had (the default one raises KeyboardInterrupt)."""
    if callable(handler):
        handler(signal.SIGINT, frame)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signal.SIGINT)


def release_in_child() -> None:
    """In a child started under :func:`ctrl_c_held`, once its own SIGINT handler is set: unblock it."""
    if _CAN_MASK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
