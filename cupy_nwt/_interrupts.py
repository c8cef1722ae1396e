"""Ctrl-C held back across the few steps where Python would lose it.

Python raises ``KeyboardInterrupt`` at the next bytecode of the main thread, wherever that is. Inside a
fork's at-fork hooks (``os.register_at_fork``, which logging and multiprocessing install) or inside a C
library's callback into Python (Numba compiling through llvmlite), that exception cannot propagate: it is
printed as "Exception ignored" and dropped, and the program runs on as if never interrupted (an
interrupted ``cupy-nwt tune`` finished and exited 0). A forked child interrupted before it sets its own
handler prints a traceback beside the parent's one line. So these steps run with SIGINT blocked in the
calling thread; a Ctrl-C sent meanwhile stays pending and is delivered as the step ends, where it raises as
usual. A child started inside inherits the blocked signal and unblocks it once its handler is set
(:func:`release_in_child`).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ctrl_c_held", "release_in_child"]

_CAN = hasattr(signal, "pthread_sigmask")


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """SIGINT blocked in this thread for the block (a fork, a compile); delivered, if it came, as it ends."""
    if not _CAN:
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def release_in_child() -> None:
    """In a child started under :func:`ctrl_c_held`, once its own SIGINT handler is set: unblock it."""
    if _CAN:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
