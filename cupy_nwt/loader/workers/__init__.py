"""Making batches away from the caller: the messages, the batch maker, the one serve loop, and the
worker kinds (processes, threads) that run it, chosen from one registry (``kinds``).

The messages are re-exported here because they pickle under this package's name (see ``messages``).
"""

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
