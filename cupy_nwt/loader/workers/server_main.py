"""Imported by forkserver's server in place of the user's script, or to import it where Python does not.

Python's forkserver means to import the script (``__main__``) once in its server, so that the workers
it forks find the script's classes without running it each; before 3.13.8 it never did (the path
went by a key the server did not read: CPython gh-126631), so every worker ran the script again, the
imports at its top with it (JAX: seconds and 90 MiB a worker). The loader starts the server with
this module and the script's path in ``SCRIPT_ENV``:

* ``run:<path>``, when a worker needs the script (its dataset's class is defined there): the server
  imports the script as ``__mp_main__``, as a fixed Python does, unless it did already;
* ``name:<path>``, when nothing a worker unpickles comes from the script (``start.pickled_modules``):
  the server names its ``__main__`` after the script without running it, which tells each worker that
  the script is imported already, and marks it a stand-in. The server then imports neither the script
  nor what the script imports (torch). A later loader whose dataset does come from the script has its
  workers run the script once each (``import_script``).

Nothing in the package imports it at its top: the server imports it after the package, complete,
so the script's own imports of the package find it whole. It acts only in a process whose ``__main__`` has no file (the server's ``-c`` command) and only when
the loader set ``SCRIPT_ENV`` while the server started; anywhere else importing it does nothing.
"""

from __future__ import annotations

import os
import signal
import sys

from ..._interrupts import release_in_child

SCRIPT_ENV = "CUPY_NWT_FORKSERVER_SCRIPT"
STAND_IN = "__cupy_nwt_stand_in__"  # set on a __main__ that is named after the script but never ran it


def _stand_in() -> None:
    how, _, path = os.environ.pop(SCRIPT_ENV, "").partition(":")  # not passed on to the workers
    main = sys.modules.get("__main__")
    if not path or main is None or getattr(main, "__file__", None) is not None:
        return
    # A Ctrl-C in a terminal reaches the whole process group, the server too: it ignores SIGINT once its preload
    # is done, and its workers inherit that; in the seconds of the script's imports it printed a traceback. The
    # loader started it with SIGINT blocked (``_interrupts``): one sent since is dropped here, never raised.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    release_in_child()
    if how == "name":
        main.__file__ = path
        setattr(main, STAND_IN, True)
    elif how == "run":
        from multiprocessing import process, spawn  # noqa: PLC0415

        process.current_process()._inheriting = True  # type: ignore[attr-defined]  # as forkserver's own preload
        try:
            spawn.import_main_path(path)
        except Exception:  # noqa: BLE001, S110 - left to each worker, which runs the script and reports its error
            sys.modules["__main__"] = main
        finally:
            del process.current_process()._inheriting  # type: ignore[attr-defined]


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
