"""What the package does as the interpreter exits: end every loader's open epochs, then close the loaders.

Registered as ``cupy_nwt`` is imported, so the exit functions a script registers after its imports (a final
evaluation over a loader, a checkpoint's ``state_dict()``) run first, with their loaders whole, as they do
with torch's; and registered after ``multiprocessing.util``'s, so that it runs before that one terminates
the daemon processes (``loader._runtime.close_at_exit``). The loader's modules load on first use: what they
left open is found through ``sys.modules``, and a program that never made a loader imports nothing here.
"""

from __future__ import annotations

import atexit
import multiprocessing.util  # noqa: F401 - its exit function must be registered first, to run after this one
import sys


def end_loaders() -> None:
    epoch = sys.modules.get("cupy_nwt.loader.epoch.epoch")
    if epoch is not None:
        epoch.end_at_exit()
    runtime = sys.modules.get("cupy_nwt.loader._runtime")
    if runtime is not None:
        runtime.close_at_exit()


atexit.register(end_loaders)
