"""How worker processes start: fork where it is safe, forkserver where it cannot be made so.

fork copies the parent's memory but only the thread that forks: a lock another thread held (a native
thread pool's, a runtime's) stays locked in the child forever. Three answers, by who owns the threads:

* torch's intra-op OpenMP pool is made safe in the worker (``torch_workers``: one thread, as torch's own
  DataLoader does), so a script that trains a torch model keeps fork: scripts without an
  ``if __name__ == "__main__":`` guard and notebooks keep working, as they do under torch;
* JAX's CPU runtime keeps fork too: its threads' locks are XLA's own, which a worker that does not call
  JAX never takes (``forkserver_hazards``); torch's DataLoader forks after it as well;
* a runtime that cannot be tamed from the child (JAX on a GPU, TensorFlow, torch's CUDA) makes the
  default ``forkserver``, whose workers fork from a clean single-threaded server process (Python 3.14
  made it the default start method for this reason). The reason is logged once at INFO on
  ``cupy_nwt.loader``. A start method the user chose (``multiprocessing_context``) is always kept.

``stuck_hint`` is what a timeout or a stall says about a worker that does not answer: with fork,
the threads and runtimes the parent had when it forked; with forkserver or spawn, the re-import of
the main module. ``forkserver_preload`` keeps forkserver's per-worker cost down for torch users.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
from collections.abc import Sequence
from multiprocessing.context import BaseContext
from typing import Any

from ... import cuda
from ..._fork_safe_lock import ForkSafeLock
from ..._interrupts import ctrl_c_held
from ...errors import LoaderError, WorkerDiedError
from ...system import usable_cpus
from .torch_workers import PIPE_WALK_LOCK

_log = logging.getLogger("cupy_nwt.loader")
_said: set[str] = set()  # reasons already logged (once per process)


JAX_CPU = "JAX (its CPU runtime is multithreaded)"


def fork_hazards() -> list[str]:
    """The runtimes in this process whose threads a forked worker could inherit as a deadlock."""
    found = []
    if "jax" in sys.modules and _jax_started():
        found.append(JAX_CPU if _jax_platforms() <= {"cpu"} else "JAX on a GPU (its runtime holds a CUDA context)")
    if "tensorflow" in sys.modules:
        found.append("TensorFlow (its runtime is multithreaded)")
    torch = sys.modules.get("torch")
    torch_cuda = getattr(torch, "cuda", None)  # not this package's ``cuda``, which ``default_start_method`` asks
    try:
        if torch_cuda is not None and torch_cuda.is_initialized():
            found.append("torch's CUDA (initialised)")
    except Exception:  # noqa: BLE001, S110 - a broken torch is no hazard we can name
        pass
    return found


def _jax_started() -> bool:
    """Has JAX made its backends (its threads)? Asked of a private function; if it moved, assume yes."""
    try:
        from jax._src import xla_bridge  # noqa: PLC0415 - jax is imported already

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # noqa: BLE001 - a JAX without it: be safe
        return True


def _jax_platforms() -> set[str]:
    """The platforms of JAX's initialised backends ("cpu", "cuda", ...); a GPU's when it cannot say."""
    try:
        from jax._src import xla_bridge  # noqa: PLC0415 - jax is imported already

        return {str(name) for name in xla_bridge.backends()}
    except Exception:  # noqa: BLE001 - a JAX without it: be safe
        return {"gpu"}


def forkserver_hazards() -> list[str]:
    """The fork hazards that make ``forkserver`` the default: ``fork_hazards`` less JAX's CPU runtime.

    JAX's CPU threads hold only XLA's own locks, which a worker never takes unless it calls JAX, and
    glibc's malloc and CPython's own locks are made consistent across fork: a worker that fetches with
    NumPy, PIL or torch is safe, as under torch's DataLoader, which forks here too (JAX's tutorial, a
    script without a main guard, relies on it). A JAX GPU backend holds a CUDA context, and TensorFlow's
    and torch's CUDA runtimes are not ours to reason about: those keep forkserver.
    """
    hazards = [h for h in fork_hazards() if h != JAX_CPU]
    if not hazards and JAX_CPU in fork_hazards() and JAX_CPU not in _said:
        _said.add(JAX_CPU)
        _log.info("loader workers start by fork although %s runs in this process: the workers must not call JAX "
                  "(one could wait forever on a lock its threads held at the fork); multiprocessing_context="
                  "'forkserver' if they do", JAX_CPU)
    return hazards


def choose(cuda_live: bool) -> str:
    """The default start method: forkserver where fork is unsafe (CUDA, a threaded runtime other than
    JAX's on the CPU: ``forkserver_hazards``), else fork."""
    if "fork" not in mp.get_all_start_methods():
        return "spawn"
    if cuda_live:
        return "forkserver"
    hazards = forkserver_hazards()
    if not hazards:
        return "fork"
    reason = ", ".join(hazards)
    if reason not in _said:
        _said.add(reason)
        _log.info("loader workers start by forkserver, not fork: %s runs in this process, and a forked worker "
                  "could inherit its threads' locks as a deadlock. forkserver re-imports the main module and "
                  "pickles the dataset: guard the script with if __name__ == '__main__': and define the dataset "
                  "at module level (multiprocessing_context='fork' overrides this)", reason)
    return "forkserver"


def context_of(start_method: str | BaseContext) -> Any:
    """A concrete multiprocessing context (it has Process and Pipe) from a start method or a context."""
    return mp.get_context(start_method) if isinstance(start_method, str) else start_method


def start_method_of(context: BaseContext | None, device: str) -> str:
    """The start method of the given context, else the default for ``device``."""
    return context.get_start_method() if context is not None else default_start_method(device)


def default_start_method(device: str) -> str:
    """``forkserver`` when CUDA is (or will be) live in this process or a threaded runtime runs (``choose``), else ``fork``.

    A forked child of a process with a CUDA context must not use CUDA, and page-locked memory is
    mapped don't-fork; forkserver children come from a clean server process instead. The price is
    that the dataset and callables are pickled to each worker (their large arrays once, shared:
    ``shared_pickle``). Otherwise fork is the fastest to start and shares the dataset copy-on-write.
    """
    return choose(device == "cuda" or cuda.cuda_may_be_initialized())


def start_wave(method: str, num_workers: int) -> int:
    """How many workers start at once; the others start as soon as one of these is up (``messages.Started``).

    A forkserver or spawn worker's start is CPU work (a spawned one imports the script, torch with it,
    in a second or so; either unpickles the dataset, a Python list index in about as long): sixteen
    starting together on two CPUs share them and are all up only after eight seconds, batch 0's worker
    with them. One per usable CPU at first puts batch 0's worker up after one start's time, and the
    rest come up no later than together, as the CPUs were busy throughout. A fork costs the child
    nothing: all start at once.
    """
    if method == "fork":
        return num_workers
    return max(1, min(num_workers, usable_cpus()))


def forkserver_preload(objects: Sequence[Any] = (), modules: set[str] | None = None) -> list[str]:
    """What forkserver's server imports once, before forking any worker: the worker loop, torch when
    this process has it, and this package's modules that define ``objects`` (the dataset, collate_fn,
    batch_transform a worker unpickles), so a worker forks with them loaded instead of importing them
    again: otherwise each worker imports Numba (for ``cupy_nwt.data.transforms``) on its own, one after
    another as the server forks them. torch's import starts no thread; its pool starts with its first parallel op;
    this package's modules start none. Nothing else of the user's: a module may start a runtime.

    ``server_main`` imports the script in the server where this Python's forkserver does not (before
    3.13.8), so that the workers do not each run it. With ``modules`` (what a pickle of ``objects`` names: ``pickled_modules``) holding nothing of the
    script, the script is not imported: ``server_main`` stands in for it, and the server imports the
    modules the pickle names (already imported here, so importable, and imported by the script's import
    before) instead of the script and torch, which come only when named.
    """
    root = __name__.split(".")[0] + "."
    own = sorted({m for o in objects if isinstance(m := getattr(o, "__module__", None), str) and m.startswith(root)})
    if modules is None or modules & SCRIPT:
        return ["__main__", _STAND_IN, "cupy_nwt.loader.workers.process_main",
                *(["torch"] if "torch" in sys.modules else []), *own]
    named = sorted(m for m in modules if m in sys.modules and m not in sys.builtin_module_names)
    return [_STAND_IN, "cupy_nwt.loader.workers.process_main", *dict.fromkeys([*own, *named])]


SCRIPT = frozenset({"__main__", "__mp_main__"})  # the names a script's classes pickle by
_STAND_IN = "cupy_nwt.loader.workers.server_main"


class _Sink:
    def write(self, b: Any) -> int:
        return len(b)


class _Names(pickle.Pickler):
    """Pickles to nowhere, noting the module of every class and function the pickle names."""

    def __init__(self) -> None:
        super().__init__(_Sink(), 5, buffer_callback=lambda _: False)  # large buffers: not copied
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        owner = obj if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__") else type(obj)
        module = getattr(owner, "__module__", None)
        if isinstance(module, str):
            self.modules.add(module)
        return NotImplemented


def pickled_modules(objects: Sequence[Any]) -> set[str] | None:
    """The modules whose classes and functions a pickle of ``objects`` names; None where it cannot tell.

    A list of plain tuples costs the pickler only (its elements are not asked: ``reducer_override``),
    large arrays are not copied; anything that will not pickle here (a lock, a descriptor, which pickle
    only while a worker starts) answers None, and the server imports the script (``forkserver_preload``).
    """
    names = _Names()
    try:
        with PIPE_WALK_LOCK:  # else a pipe pickled during another thread's walk is torch's stub, naming nothing
            names.dump(list(objects))
    except Exception:  # noqa: BLE001 - any failure: the safe answer
        return None
    return names.modules


def names_script(objects: Sequence[Any]) -> bool:
    """Does a worker need the script to unpickle ``objects`` (or can that not be told)?"""
    modules = pickled_modules(objects)
    return modules is None or bool(modules & SCRIPT)


def script_path() -> str | None:
    """The script's path as multiprocessing hands it to a forkserver worker; None under ``-m`` or interactively."""
    from multiprocessing import spawn  # noqa: PLC0415

    data = spawn.get_preparation_data("cupy_nwt")
    path = data.get("init_main_from_path", data.get("main_path"))  # the key's name changed between versions
    return path if isinstance(path, str) else None


def other_threads() -> list[str]:
    """The Python threads of this process other than the calling one (native pools such as BLAS's, which
    guard fork themselves, are not counted)."""
    me = threading.current_thread()
    return [t.name for t in threading.enumerate() if t is not me]


def stuck_hint(method: str) -> str:
    """The likely causes of a worker that does not answer, as known when the workers started."""
    slow = "or the dataset is slow or blocked in __getitem__/__iter__"
    if method != "fork":
        return (f"workers started by {method} re-import the main module first (a script without "
                f"if __name__ == '__main__': runs again there), {slow}")
    hazards = fork_hazards()
    if hazards:
        return (f"likely fork after threads: the workers were forked while {', '.join(hazards)} ran in this "
                f"process, which can leave a worker deadlocked; use multiprocessing_context='forkserver' ({slow})")
    threads = other_threads()
    if threads:
        return (f"possibly fork after threads: {len(threads)} other thread(s) ran in this process when the workers "
                f"were forked ({', '.join(threads[:3])}), and a lock one held stays locked in a worker; "
                f"multiprocessing_context='forkserver' avoids that ({slow})")
    return slow.removeprefix("or ")


def interactive() -> bool:
    """Is ``__main__`` a notebook's, the REPL's or ``python -c``'s (no file): what it defines no worker can import?"""
    main = sys.modules.get("__main__")
    return main is not None and getattr(main, "__file__", None) is None


def exit_hint(method: str, code: int | None) -> str:
    """What a worker's exit code 1 most likely means under ``method``: its own error, printed above.

    A worker exits 1 only when an error escapes it before its loop (the dataset's own errors travel to
    the main process); under forkserver and spawn that is mostly the start itself, which re-imports the
    main module and unpickles the dataset.
    """
    if code != 1 or method == "fork":
        return ""
    if interactive():
        return (f" (its error is printed above: a {method} worker unpickles the dataset, and a class or function "
                "it holds that was defined interactively (a notebook cell, the REPL), even inside torch's "
                "random_split or ConcatDataset, cannot be imported there: move it into a .py module, use "
                "worker_type='thread', or pass multiprocessing_context='fork' at your own risk)")
    return (f" (its error is printed above: a {method} worker first re-imports the main module, and a script "
            "without if __name__ == '__main__': starts the loader again there, then unpickles the dataset, "
            "whose class must be importable by name)")


def death_error(worker_id: int, pid: int | None, code: int | None, method: str) -> WorkerDiedError:
    """A worker that ended unasked, in torch's words (scripts match them) and then ours, with the likely cause."""
    if code is not None and code < 0:
        try:
            how = f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
        torch_says = f"DataLoader worker (pid {pid}) is killed by signal: {signal.strsignal(-code) or -code}. "
        hint = " (SIGKILL often means the kernel's out-of-memory killer)" if code == -signal.SIGKILL else ""
    elif code is None:  # reaped by the system: this process ignores SIGCHLD, so waitpid cannot tell the code
        how, hint = "exited unexpectedly", " (its exit code is unknown: this process ignores SIGCHLD)"
        torch_says = f"DataLoader worker (pid {pid}) exited unexpectedly. "
    else:
        how, hint = f"exited unexpectedly with exit code {code}", exit_hint(method, code)
        torch_says = f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {code}. "
    return WorkerDiedError(f"{torch_says}cupy_nwt: loader worker {worker_id} (pid {pid}) {how}{hint}",
                           worker_id=worker_id, pid=pid, exitcode=code)


def check_importable(method: str, chosen_by_user: bool, objects: list[Any]) -> None:
    """forkserver chosen for the user: refuse what its workers cannot import, in one line, before starting.

    A class or function defined in an interactive ``__main__`` (a notebook, the REPL) pickles by a name
    that a forkserver or spawn worker cannot find; it would die at start with a traceback of its own.
    """
    if method == "fork" or chosen_by_user or not interactive():
        return
    for obj in objects:
        owner = obj if callable(obj) and hasattr(obj, "__qualname__") else type(obj)
        if obj is not None and getattr(owner, "__module__", None) == "__main__":
            raise LoaderError(
                f"workers must start by {method} here (fork is unsafe: {', '.join(forkserver_hazards()) or 'CUDA is in use'}), "
                f"and their start cannot import {getattr(owner, '__qualname__', owner)!r}, defined interactively: "
                "move it into a .py module, use worker_type='thread', or pass multiprocessing_context='fork' at your "
                "own risk")


_SERVER_STARTING = ForkSafeLock()
"""Held while a loader asks for the server: its preload and ``SCRIPT_ENV`` are the process's, so loaders
made at once in two threads would cross (the second would put back the first one's ``SCRIPT_ENV`` and leave
it to every process this one starts)."""


def _no_server_of_the_parents() -> None:
    """In a process forked from one whose forkserver runs (``os.fork``: a pre-forking server), that server is
    not this process's child: multiprocessing would ask it for workers and wait on it as its own, and fail
    (``ChildProcessError``). The child forgets it (closing its copy of the end that keeps it alive) and starts
    its own when a loader needs one. multiprocessing keeps this state in private fields, each reset only
    where this Python has it."""
    forkserver = sys.modules.get("multiprocessing.forkserver")  # loaded wherever a server was started
    server: Any = getattr(forkserver, "_forkserver", None)
    if getattr(server, "_forkserver_pid", None) is None:
        return
    alive = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(alive, int):
        with contextlib.suppress(OSError):
            os.close(alive)
    for field in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_forkserver_authkey"):
        if hasattr(server, field):
            setattr(server, field, None)
    if hasattr(server, "_lock"):
        server._lock = threading.Lock()  # held, maybe, by a thread of the parent's that is not here


os.register_at_fork(after_in_child=_no_server_of_the_parents)


def prestart_forkserver(context: BaseContext | None, method: str, objects: Sequence[Any]) -> bool:
    """Start forkserver's server and its preload now, in the background, when the loader's workers will fork from it.

    The server is one per process and outlives loaders; its start (a fresh interpreter importing
    ``__main__`` again, torch with it, and ``forkserver_preload``) is what a process's first forkserver
    loader waits for, seconds where ``__main__`` imports torch. Asked for at the loader's construction,
    it runs while the caller goes on (building a model, initialising CUDA, pickling the dataset for
    the first worker), and ``iter()`` finds it ready or nearer. Starting it spawns the server and
    returns (multiprocessing's ``forkserver.ensure_running`` does not wait for the preload), so a loader
    never iterated costs one idle process, which goes with this one. When nothing in ``objects``
    pickles from the script, the server does not import the script (``forkserver_preload``,
    ``server_main``). True when it was asked to start.
    """
    if method != "forkserver":
        return False
    with _SERVER_STARTING:
        return _prestart(context if context is not None else mp.get_context("forkserver"), objects)


def _prestart(ctx: BaseContext, objects: Sequence[Any]) -> bool:
    from multiprocessing import forkserver, resource_tracker  # noqa: PLC0415 - only where forkserver is used

    script = script_path() if getattr(forkserver._forkserver, "_forkserver_pid", 0) is None else None
    preload = forkserver_preload(objects, pickled_modules(objects) if script else None)
    ctx.set_forkserver_preload(preload)
    resource_tracker.ensure_running()  # first: its start unblocks SIGINT in this thread
    from .server_main import SCRIPT_ENV  # noqa: PLC0415

    before = os.environ.get(SCRIPT_ENV)
    if script is not None:  # read, and dropped, by server_main
        os.environ[SCRIPT_ENV] = f"{'name' if preload[0] == _STAND_IN else 'run'}:{script}"
    try:
        with ctrl_c_held():  # the server starts with Ctrl-C held back until it ignores it (server_main)
            forkserver.ensure_running()
    finally:
        if before is None:
            os.environ.pop(SCRIPT_ENV, None)
        else:
            os.environ[SCRIPT_ENV] = before
    return True
