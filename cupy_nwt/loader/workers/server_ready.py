"""Imported last by forkserver's server: Ctrl-C may reach it again, now that its preload is done.

The loader starts the server while the user's script goes on (``start.prestart_forkserver``), with
SIGINT blocked, because the server sits in the script's process group: a Ctrl-C at the terminal, or a
notebook's Interrupt, which signals the whole group, would otherwise end it in the middle of importing
the script or torch, printing a traceback of its own into the user's output, while the script caught its
KeyboardInterrupt and went on to a loader with no server. Python's forkserver ignores SIGINT itself, but
only once its preload is imported. Here, the preload done, an interrupt held off meanwhile is dropped
(it was the script's, which got it too) and SIGINT is let through again, so that the workers the server
forks get Python's usual handling back. Anywhere SIGINT was not blocked, importing this does nothing.
"""

from __future__ import annotations

import signal


def _let_interrupts_through() -> None:
    if not hasattr(signal, "pthread_sigmask") or signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        return
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a pending SIGINT is dropped, not delivered
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    finally:
        signal.signal(signal.SIGINT, handler)


_let_interrupts_through()
