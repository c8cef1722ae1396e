"""What the counting process sees: the same bytes wherever the checkout lies and however pytest started.

The counted region's cost follows the addresses its objects land at, and those follow every string the
interpreter allocated before it: the environment, ``sys.path``, each imported module's file name and
cached code, its working folder. A checkout deeper or a longer variable moved it; the base revision of
``--nwt-against``, run from a worktree elsewhere (without the checkout's cached code) and started as
``python -m pytest``, counted differently from the same code here
(``bench/studies/what_does_the_gate_see/paths.py``). So the counting process is given:

- a working folder of its own, a fixed length long (valgrind reads it: a longer one moved the cost
  with all else the same), holding a link to the checkout's root (git's top folder, else the current
  folder) and one to each entry of the caller's working folder (so that relative paths still open the
  same files);
- every folder of the checkout that the pipeline's modules were imported from as
  ``/proc/self/cwd/.nwt-checkout/<folder>`` (:data:`VIEW`): the same name in every checkout, in a
  worktree of another revision, and on both sides of ``--nwt-against`` at once, since each process
  reads its own working folder through it;
- the code of the checkout's modules compiled for the count under those names (:func:`compile_checkout`),
  never read from the checkout's ``__pycache__``, which holds the path it was compiled at (a fresh
  worktree holds none: its modules were compiled in the counting process, which moved its memory most);
- a path of only those folders (in ``sys.path``'s order), the caller's own ``PYTHONPATH``
  entries outside the checkout, and the folders outside it and outside the interpreter's own that
  modules were imported from (a ``conftest`` adding to ``sys.path``, a ``.pth`` file), each before or
  after the interpreter's own folders as here: not ``sys.path`` itself, whose
  first entries say how pytest was started. It goes in by a file (:func:`count_path`), not
  ``PYTHONPATH``, with the names of each folder's distributions' metadata: the counting process puts
  it on ``sys.path`` once its finders no longer list folders, so that no folder's listing (a saved
  baseline beside the test, pytest's caches) is ever held in it;
- the interpreter by one name however pytest was started (:func:`count_interpreter`);
- an environment of what decides how the code runs, not where it was started from
  (:func:`count_environment`).
"""

from __future__ import annotations

import os
import py_compile
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: the link to the checkout's root in the counting process's working folder
LINK = ".nwt-checkout"
#: the checkout's root as the counting process names it, through its own working folder
VIEW = f"/proc/self/cwd/{LINK}"
#: the counting process's working folder is made here: a fixed folder, so that its path is the same length
#: on every runner whatever TMPDIR says
COUNT_DIR = "/tmp"
#: the repeatability settings, set over whatever the caller has
EXACT_ENV = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
             "NUMEXPR_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
#: the counting process's PATH: the caller's moves with a venv's or a tool cache's folder (a venv's bin
#: twice moved the cost 0.08%); valgrind itself is found on the caller's
CANONICAL_PATH = "/usr/local/bin:/usr/bin:/bin"
#: kept by name: the user's home (libraries' caches and settings), locale and time zone, valgrind's own
KEPT_ENV = frozenset({"HOME", "LANG", "LANGUAGE", "TZ", "VALGRIND_LIB"})
#: kept by prefix or suffix: what the interpreter, NumPy, BLAS/OpenMP, the dynamic loader, CUDA and this
#: package read to decide how to run
KEPT_ENV_PREFIXES = ("LC_", "LD_", "PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "BLIS_", "NUMEXPR_",
                     "NUMBA_", "NPY_", "NUMPY_", "CUDA_", "CUPY_")
KEPT_ENV_SUFFIXES = ("_NUM_THREADS",)
#: never kept: this plugin's per-run socket and key for the base revision
DROPPED_ENV_PREFIXES = ("CUPY_NWT_AGAINST_",)
#: a comma-separated list of the caller's variables the pipeline itself reads, kept as they are
USER_ENV = "CUPY_NWT_COUNT_ENV"


def count_environment(pythonpath: str = "") -> dict[str, str]:
    """The counting process's environment: the caller's variables that decide how code runs, those named in
    :data:`USER_ENV`, then :data:`EXACT_ENV`, :data:`CANONICAL_PATH` and ``pythonpath``.

    Everything else (run ids, the shell's PWD and last command, a CI service's refs and tokens, a
    terminal's settings) is left out: its length moved the cost by up to 0.8% from one variable.
    """
    named = {n.strip() for n in os.environ.get(USER_ENV, "").split(",") if n.strip()}

    def kept(name: str) -> bool:
        if name in named:
            return True
        if name.startswith(DROPPED_ENV_PREFIXES):
            return False
        return name in KEPT_ENV or name.startswith(KEPT_ENV_PREFIXES) or name.endswith(KEPT_ENV_SUFFIXES)

    env = {k: v for k, v in os.environ.items() if kept(k)}
    env.update(EXACT_ENV, PATH=CANONICAL_PATH, PYTHONPATH=pythonpath)
    if not pythonpath:
        del env["PYTHONPATH"]
    return env


def count_interpreter() -> str:
    """The interpreter the counting process runs, by one name however pytest was started.

    ``pytest`` runs as its script's ``#!`` names it (a venv's ``bin/python3``), ``python -m pytest`` as
    ``bin/python``: the same interpreter, but its name is one more string the counting process holds, and
    one character moved the README's example by 0.06%. So it is run as ``pythonX.Y`` in the same folder
    (a venv stays a venv), where that is the same file.
    """
    exe = sys.executable
    named = os.path.join(os.path.dirname(exe), f"python{sys.version_info[0]}.{sys.version_info[1]}")
    try:
        return named if named != exe and os.path.samefile(named, exe) else exe
    except OSError:
        return exe


def checkout_root(cwd: Path | None = None) -> Path:
    """git's top folder of ``cwd`` (this process's by default), resolved; else ``cwd`` itself."""
    here = (cwd or Path.cwd()).resolve()
    try:
        done = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return here
    top = done.stdout.strip()
    return Path(top).resolve() if done.returncode == 0 and top else here


def _interpreters_own() -> list[Path]:
    """The folders the counting interpreter searches by itself: its standard library and site-packages."""
    paths = sysconfig.get_paths()
    found = {*(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)),
             *site.getsitepackages()}
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    return [Path(p).resolve() for p in [*found, *([user] if user else [])]]


def _under(path: Path, folders: list[Path]) -> bool:
    return any(path == f or f in path.parents for f in folders)


def import_roots() -> list[Path]:
    """The folders (resolved) that this process's modules were imported from, the top of each package."""
    roots: list[Path] = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or name in ("__main__", "__mp_main__") or not os.path.isabs(file):
            continue
        path = Path(file).resolve()
        spec = getattr(getattr(module, "__spec__", None), "name", None)  # the name it was found by: an alias
        found = spec if isinstance(spec, str) else name  # (pytest's "py.error") has its module's, not its key's
        depth = found.count(".") + (path.name.split(".")[0] == "__init__")
        if depth < len(path.parents):
            roots.append(path.parents[depth])
    return list(dict.fromkeys(roots))


@contextmanager
def count_folder(root: Path) -> Iterator[tuple[str, str]]:
    """(the counting process's working folder, the checkout's root as that process names it); removed after.

    The folder links :data:`LINK` to ``root`` and each entry of this process's working folder to itself.
    """
    tmp = tempfile.mkdtemp(prefix="nwt-count-", dir=COUNT_DIR if os.access(COUNT_DIR, os.W_OK) else None)
    try:
        os.symlink(root, os.path.join(tmp, LINK))
        here = os.getcwd()
        try:
            names = os.listdir(here)
        except OSError:
            names = []
        for name in names:
            if name != LINK:
                try:
                    os.symlink(os.path.join(here, name), os.path.join(tmp, name))
                except OSError:
                    continue
        yield tmp, VIEW if os.path.isdir("/proc/self/cwd") else os.path.join(tmp, LINK)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def view_path(path: str | Path, root: Path, view: str) -> str:
    """``path`` as the counting process names it: under ``view`` where it lies in ``root``."""
    real = Path(path).resolve()
    if real == root:
        return view
    if root in real.parents:
        return f"{view}/{real.relative_to(root).as_posix()}"
    return str(path)


def count_sys_path(root: Path, view: str) -> tuple[list[str], list[str]]:
    """The folders the counting process searches besides its interpreter's own (see the module's docstring),
    the same on both sides of ``--nwt-against`` and in every checkout of the same code: those to search
    before the interpreter's own, and those after them, as here (a folder a ``.pth`` file or a conftest's
    ``sys.path.append`` added comes after site-packages: searched first, its copy of a package that
    site-packages also holds would be counted instead of the one the pipeline ran)."""
    own = _interpreters_own()
    roots = [r for r in import_roots() if not _under(r, own)]
    order: dict[Path, int] = {}
    for i, p in enumerate(sys.path):
        if p:
            order.setdefault(Path(p).resolve(), i)
    first_own = min((i for p, i in order.items() if _under(p, own)), default=len(sys.path))
    ordered = sorted(roots, key=lambda r: (order.get(r, len(sys.path)), str(r)))
    inside = [view_path(r, root, view) for r in ordered if _under(r, [root])]
    given = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not _under(Path(p).resolve(), [root])]
    outside = [r for r in ordered if not _under(r, [root])]
    before = [*inside, *given, *(str(r) for r in outside if order.get(r, len(sys.path)) < first_own)]
    after = [str(r) for r in outside if order.get(r, len(sys.path)) >= first_own]
    before = list(dict.fromkeys(before))
    return before, [p for p in dict.fromkeys(after) if p not in before]


#: what ``importlib.metadata`` keeps of a folder's listing (its ``Lookup``): the distributions' metadata
METADATA_SUFFIXES = (".dist-info", ".egg-info")


def metadata_names(folder: str) -> list[str]:
    """The names in ``folder`` that ``importlib.metadata`` reads when it looks for a distribution there."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(n for n in names if n.lower().endswith(METADATA_SUFFIXES) or n.lower() == "egg-info")


def count_path(root: Path, view: str) -> dict[str, Any]:
    """What the counting process puts on ``sys.path`` (:func:`count_sys_path`'s folders, in order: ``path``
    before its own folders, ``after`` them) and, for each, the names of its listing that ``importlib.metadata``
    reads: given, so that the counting process lists none of these folders (:func:`._count_child.checkout_code`)."""
    before, after = count_sys_path(root, view)

    def real(entry: str) -> str:
        return str(root) + entry[len(view):] if entry == view or entry.startswith(view + "/") else entry

    return {"path": before, "after": after, "metadata": {p: metadata_names(real(p)) for p in [*before, *after]}}


def compile_checkout(root: Path, view: str, into: str) -> None:
    """Compile the source of each module this process imported from ``root`` into ``into`` (the same relative
    path, ``.pyc``) under its name in the counting process, which imports them from there
    (:func:`._count_child.checkout_code`): the same bytes in every checkout and on both sides of
    ``--nwt-against``. Modules that fail to compile are left to the counting process's own compile."""
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file or not file.endswith(".py"):
            continue
        path = Path(file).resolve()
        if root not in path.parents:
            continue
        rel = path.relative_to(root).as_posix()
        try:
            py_compile.compile(str(path), cfile=os.path.join(into, f"{rel}c"), dfile=f"{view}/{rel}", doraise=True)
        except (py_compile.PyCompileError, OSError):
            continue
