"""Imported by forkserver's server in place of the user's script, when no worker needs anything of it.

Python's forkserver imports the script (``__main__``) in its server so that the workers it forks find
the script's classes without running it each: a script that imports torch costs the server, and so a
process's first forkserver loader, the seconds of that import again. When nothing a worker unpickles
comes from the script (``start.pickled_modules``), the server imports this instead: it names the
server's ``__main__`` after the script (``__file__``), which tells each worker forked from it that the
script is imported already, and marks it a stand-in. A later loader whose dataset does come from the
script has its workers run the script once each (``import_script``), as under spawn.

It acts only in a process whose ``__main__`` has no file (the server's ``-c`` command) and only when
the loader named the script in ``SCRIPT_ENV`` while the server started; anywhere else importing it
does nothing.
"""

from __future__ import annotations

import os
import sys

SCRIPT_ENV = "CUPY_NWT_FORKSERVER_SCRIPT"
STAND_IN = "__cupy_nwt_stand_in__"  # set on a __main__ that is named after the script but never ran it


def _stand_in() -> None:
    path = os.environ.pop(SCRIPT_ENV, None)  # not passed on to the workers
    main = sys.modules.get("__main__")
    if path and main is not None and getattr(main, "__file__", None) is None:
        main.__file__ = path
        setattr(main, STAND_IN, True)


def import_script(path: str | None) -> None:
    """In a worker: run the script as forkserver would have (as ``__mp_main__``) when the server's
    ``__main__`` is only its stand-in, so that what the worker unpickles from it resolves."""
    main = sys.modules.get("__main__")
    if not path or main is None or not getattr(main, STAND_IN, False):
        return
    from multiprocessing import spawn  # noqa: PLC0415 - only in a worker that needs the script

    del main.__file__  # else multiprocessing takes the script for imported already
    delattr(main, STAND_IN)
    spawn.import_main_path(path)


_stand_in()
