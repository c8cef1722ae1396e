"""Making batches away from the caller: the messages, the batch maker, the one serve loop, and the
worker kinds (processes, threads) that run it, chosen from one registry (``kinds``).

The messages are re-exported here because they pickle under this package's name (see ``messages``).

A forkserver or spawn worker imports this package while its process object is being unpickled,
after the script's imports: torch's million objects, which each collection that our modules' imports
set off would walk again (most of the import's time: ``worker_import.py`` in the start study). So in
a process being started that way, what exists now is frozen out of the collector first, as
``worker_main`` freezes it anyway.
"""

import gc as _gc
import multiprocessing as _mp

if getattr(_mp.current_process(), "_inheriting", False):  # multiprocessing's own mark of that unpickling
    _gc.freeze()

from .messages import (
    BadSamples,
    ErrorReport,
    Exhausted,
    InitFailed,
    Ok,
    Raised,
    Restore,
    RingMsg,
    Skipped,
    Started,
    Stop,
    StreamState,
    Task,
    Whole,
)

__all__ = ["BadSamples", "Raised", "ErrorReport", "Exhausted", "InitFailed", "Ok", "Restore", "RingMsg", "Skipped", "Started", "Stop",
           "StreamState", "Task", "Whole"]
