"""Instructions per sample of a pipeline, counted by callgrind: the figure a neighbour cannot move.

Clocks on a shared machine measure the neighbours as much as the pipeline; an instruction count of
the same code on the same inputs does not move at all. So a loader benchmark also counts, in one
process under valgrind's callgrind, the instructions of what a worker does per batch: the dataset's
``__getitem__`` (or ``__getitems__``), the collate and the ``batch_transform``, through the loader's own
``BatchMaker``, over the same samples every run (the first :data:`DEFAULT_COUNT_SAMPLES` indices in
order, in batches of the loader's ``batch_size``, each with the seed the loader gives that batch in
epoch 0 of seed 0).

What makes the count exact: ``PYTHONHASHSEED=0`` (str hashes, so set and dict orders), one BLAS and
OpenMP thread (an idle BLAS thread spins, and callgrind counts every thread), the same paths and
environment wherever the checkout lies and however pytest was started (:mod:`._count_view`: their
sizes move where memory lands), a warm-up batch
outside the counted region (lazy imports, first-use caches), a garbage collection just before it, and
callgrind collecting only inside the region (:mod:`cupy_nwt.pytest_plugin._count_child`), not the
interpreter's start-up and imports. The same run simulates the caches and logs the region's system
calls, and the region is made once more natively for its page faults (addresses fixed in both, so
they repeat): the components of the cost per sample (:mod:`cupy_nwt.pytest_plugin._cost`). What it
cannot see (I/O waits, the hand-over between processes, worker start-up) the wall clock judged
against the base revision in the same job covers (``--nwt-against``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ArgumentError, CallgrindError
from ._callgrind import callgrind_unavailable_reason, count_events, fixed_addresses
from ._cost import Cost, cost_of
from ._count_view import checkout_root, compile_checkout, count_environment, count_folder, count_interpreter, count_path

#: samples counted per benchmark: a fraction of a second of native work for a typical image
#: pipeline, ~50x that under callgrind, on top of ~5 s of CPU for the interpreter's start-up and imports.
DEFAULT_COUNT_SAMPLES = 1024
COUNT_TIMEOUT_S = 900.0
CHILD = Path(__file__).with_name("_count_child.py")
#: the child's region markers (:data:`._count_child.MARKERS`; the child is not imported here)
MARKERS = ("/nonexistent/cupy-nwt-count-region-begin", "/nonexistent/cupy-nwt-count-region-end")
_numba_caches: list[tempfile.TemporaryDirectory[str]] = []  # this run's own Numba cache, made at its first count


def numba_cache(root: Path) -> str:
    """Where the counts of checkout ``root`` keep Numba's compiled kernels in this run: a folder of the run's own,
    one per checkout (the base revision of ``--nwt-against`` compiles its kernels apart), so that what the
    checkout's ``__pycache__`` holds, present in one clone and not in another, never reaches a count. The first
    count compiles them (in its first native run, not measured); the others load them. A fixed length of path:
    it is in the counting process's environment."""
    if not _numba_caches:
        _numba_caches.append(tempfile.TemporaryDirectory(prefix="nwt-numba-", dir="/tmp"))
    return os.path.join(_numba_caches[0].name, hashlib.sha256(str(root).encode()).hexdigest()[:16])


def valgrind_options() -> str:
    """What callgrind is told beside the command (``VALGRIND_OPTS``): collect only the counted region."""
    if platform.machine().lower() in ("x86_64", "amd64"):  # the child's client requests (_count_child)
        return "--instr-atstart=no --collect-atstart=no"
    return "--collect-atstart=no --toggle-collect=PyRun_SimpleStringFlags"


@dataclass(frozen=True)
class InstructionCount:
    """``per_sample`` instructions over ``samples`` samples in ``batches`` batches; ``seconds`` under callgrind
    and natively. ``cost`` (:mod:`cupy_nwt.pytest_plugin._cost`) weighs in the region's cache misses,
    page faults and system calls; ``native_cpu_s_per_1k`` is the region's CPU natively (information)."""

    per_sample: float
    samples: int
    batches: int
    total: int
    seconds: float
    cost: Cost | None = None
    native_cpu_s_per_1k: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def count_args(count_samples: Any) -> int | None:
    if count_samples is None:
        return None
    if isinstance(count_samples, bool) or not isinstance(count_samples, int) or count_samples < 1:
        raise ArgumentError(f"count_samples must be an int >= 1 (or None for {DEFAULT_COUNT_SAMPLES}), "
                         f"got {count_samples!r}")
    return count_samples


def plan(n: int, batch_size: int | None, samples: int | None) -> list[tuple[Any, int]]:
    """``[(indices, seed), ...]``: the first ``samples`` indices of ``n`` in batches, wrapping round past ``n``."""
    import numpy as np  # noqa: PLC0415

    from ..loader.plan.order import batch_seed  # noqa: PLC0415

    want = DEFAULT_COUNT_SAMPLES if samples is None else samples
    size = batch_size or 1
    batches = max(1, -(-want // size))
    return [(np.arange(b * size, (b + 1) * size, dtype=np.int64) % n, batch_seed(0, 0, b)) for b in range(batches)]


def count_pipeline(dataset: Any, *, batch_size: int | None, collate_fn: Any, batch_transform: Any,
                   samples: int | None = None, timeout: float = COUNT_TIMEOUT_S, cost: bool = True) -> InstructionCount:
    """Count the instructions per sample of making ``samples`` samples' batches; ``CallgrindError`` if it cannot.

    With ``cost`` the caches are simulated and the region's system calls counted under callgrind, and
    the region is run once natively for its page faults: the figures of :class:`~._cost.Cost`.
    """
    from ..loader.workers.maker import BatchMaker  # noqa: PLC0415

    reason = callgrind_unavailable_reason()
    if reason is not None:
        raise CallgrindError(reason)
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise CallgrindError("instructions are counted for map-style datasets (__len__ and __getitem__) only")
    n = len(dataset)
    if n < 1:
        raise CallgrindError("the dataset is empty: no instructions to count")
    maker = BatchMaker(dataset, collate_fn, batch_transform, batched=batch_size is not None, batch_size=batch_size)
    batches = plan(n, batch_size, samples)
    if batch_size is None:
        batches = [(indices[:1], seed) for indices, seed in batches]
    try:
        payload = pickle.dumps((maker, batches), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means: cannot count in another process
        raise CallgrindError(f"instructions not counted: the dataset, collate_fn or batch_transform does not "
                             f"pickle ({type(exc).__name__}: {exc})") from None
    root = checkout_root()
    with count_folder(root) as (cwd, view), tempfile.TemporaryDirectory(prefix="nwt-plan-", dir=cwd) as own:
        # the path goes in by file, not PYTHONPATH: the child puts it on sys.path once its imports list no folder
        env = {**count_environment(), "VALGRIND_OPTS": valgrind_options(), "NUMBA_CACHE_DIR": numba_cache(root)}
        path, child = os.path.join(own, "plan"), os.path.join(own, "child.py")
        with open(path, "wb") as f:
            f.write(payload)
        with open(os.path.join(own, "path.json"), "w", encoding="utf-8") as f:
            json.dump(count_path(root, view), f)
        shutil.copyfile(CHILD, child)
        compile_checkout(root, view, os.path.join(own, "pyc"))
        argv = [count_interpreter(), child, path]
        t0 = time.perf_counter()
        native = _native(argv, env, cwd, timeout) if cost else None
        events, syscalls = count_events(argv, env=env, cwd=cwd, timeout=timeout,
                                        cache_sim=cost, syscalls_between=MARKERS if cost else None)
        seconds = time.perf_counter() - t0
    counted = sum(len(indices) for indices, _ in batches)
    total = events["Ir"]
    if native is None or syscalls is None:
        return InstructionCount(total / counted, counted, len(batches), total, seconds)
    return InstructionCount(total / counted, counted, len(batches), total, seconds,
                            cost_of(events, int(native["minflt"]), syscalls, counted),
                            1000.0 * float(native["cpu_s"]) / counted)


def _native(argv: list[str], env: dict[str, str], cwd: str, timeout: float) -> dict[str, Any]:
    """The counted region run without valgrind: its page faults and CPU seconds (``_count_child --native``).

    It runs twice and the second run is measured; the callgrind count comes after both. A first run may fill
    what every later one finds on disk: Numba's kernels, compiled into this run's own cache (``numba_cache``),
    where the checkout's ``__pycache__`` held them or not (a fresh clone's does not: counted there, unchanged
    code could fail against a baseline saved where the tests had run).
    """
    import subprocess  # noqa: PLC0415

    result = os.path.join(os.path.dirname(argv[-1]), "native.json")
    native_env = {k: v for k, v in env.items() if k != "VALGRIND_OPTS"}
    for _ in range(2):
        try:
            done = subprocess.run([*argv, "--native", result], env=native_env, cwd=cwd,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout, check=False,
                                  preexec_fn=fixed_addresses)  # noqa: PLW1509 - one ctypes call
        except subprocess.TimeoutExpired:
            raise CallgrindError(f"the counted region run natively took more than {timeout:g} s") from None
        if done.returncode != 0:
            lines = [x for x in done.stderr.decode("utf-8", "replace").splitlines() if x.strip()]
            raise CallgrindError(f"the counted region failed natively (exit {done.returncode})"
                                 + (f": {lines[-1].strip()}" if lines else ""))
    try:
        with open(result, encoding="utf-8") as f:
            got = json.load(f)
    except (OSError, ValueError):
        got = None
    if not isinstance(got, dict) or not all(isinstance(got.get(k), (int, float)) for k in ("minflt", "cpu_s")):
        raise CallgrindError("the counted region's native run wrote no page-fault count")
    return got
