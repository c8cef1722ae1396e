"""Loader worker processes: the loop that runs in each worker, and the pool that drives them.

Each worker has its own task pipe and result pipe (no lock shared between workers, so a worker
killed mid-message cannot wedge the others). The main process waits on the result pipes and the
workers' sentinels together, which is what turns a SIGKILLed worker into an error within one
wake-up rather than a hang. Only small messages travel: ``(batch, slot, rows)`` one way, indices and
a seed the other; batch payloads are written into the shared ring (see ``shm``).

Workers never touch CUDA: they import neither CuPy nor anything that does.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import random
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from . import cuda
from .collate import BatchLayoutError, collate_into, default_collate, flatten
from .errors import LoaderError, LoaderTimeoutError, WorkerDiedError, WorkerError  # noqa: F401 - old import paths
from .shm import Ring, SlotLayout


@dataclass(frozen=True)
class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker (``None`` in the main process)."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """This worker's id, the number of workers, its seed and its dataset copy; ``None`` outside."""
    return _worker_info


# ---------------------------------------------------------------- making one batch (worker or main)


class BatchMaker:
    """Fetch -> collate -> transform for one batch; remembers which sample it was fetching."""

    def __init__(self, dataset: Any, collate_fn: Callable | None, batch_transform: Callable | None) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.batch_transform = batch_transform
        self.current: int | None = None

    def fetch(self, indices: np.ndarray) -> list[Any]:
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            self.current = None
            samples = getitems(indices.tolist())
            if len(samples) != len(indices):
                raise ValueError(f"__getitems__ returned {len(samples)} samples for {len(indices)} indices")
            return list(samples)
        out = []
        for i in indices.tolist():
            self.current = i
            out.append(self.dataset[i])
        self.current = None
        return out

    def make(self, indices: np.ndarray, seed: int) -> Any:
        """A new batch in fresh arrays (the first batch, and ``num_workers=0`` on the CPU)."""
        samples = self.fetch(indices)
        batch = self.collate_fn(samples) if self.collate_fn is not None else default_collate(samples, indices)
        if self.batch_transform is not None:
            batch = self.batch_transform(batch, seed)
        return batch

    def make_checked(self, indices: np.ndarray, seed: int, layout: SlotLayout, batch_index: int) -> list[np.ndarray]:
        leaves, treedef = flatten(self.make(indices, seed))
        return layout.check(leaves, treedef, len(indices), batch_index)

    def fill(self, indices: np.ndarray, seed: int, layout: SlotLayout, out: Sequence[np.ndarray], batch_index: int) -> None:
        """Write the batch into ``out`` (a slot's field views); default collation writes in place."""
        if self.collate_fn is None and self.batch_transform is None:
            collate_into(self.fetch(indices), indices, layout.treedef, out)
            return
        for dst, src in zip(out, self.make_checked(indices, seed, layout, batch_index)):
            np.copyto(dst, src)

    def failed_index(self, exc: BaseException) -> int | None:
        if isinstance(exc, BatchLayoutError):
            return exc.sample_index
        return self.current


def error_report(exc: BaseException, sample_index: int | None) -> dict[str, Any]:
    """What travels back for an exception: type, message, traceback text, the exception if it pickles."""
    try:
        blob = pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - an unpicklable exception still reports its text
        blob = None
    return {
        "exc_type": type(exc).__qualname__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "sample_index": sample_index,
        "pickled": blob,
    }


def make_worker_error(report: dict[str, Any], *, worker_id: int | None, pid: int, batch_index: int | None) -> WorkerError:
    where = "the main process" if worker_id is None else f"loader worker {worker_id} (pid {pid})"
    what = f"batch {batch_index}" if batch_index is not None else "worker_init_fn"
    at = f" at sample index {report['sample_index']}" if report["sample_index"] is not None else ""
    msg = (f"{where} failed on {what}{at}: {report['exc_type']}: {report['message']}\n\n"
           f"Original traceback:\n{report['traceback']}")
    err = WorkerError(msg, worker_id=worker_id, pid=pid, batch_index=batch_index,
                      sample_index=report["sample_index"], exc_type=report["exc_type"],
                      traceback_text=report["traceback"])
    if report.get("pickled") is not None:
        try:
            err.__cause__ = pickle.loads(report["pickled"])
        except Exception:  # noqa: BLE001 - the text above is the contract, the object a bonus
            pass
    return err


# ---------------------------------------------------------------- the worker process


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: int
    num_workers: int
    seed: int
    dataset: Any
    collate_fn: Callable | None
    batch_transform: Callable | None
    worker_init_fn: Callable | None


def worker_seed(seed: int, worker_id: int) -> int:
    return int(np.random.SeedSequence([seed, 0x776B72, worker_id]).generate_state(1)[0])


def worker_main(spec: WorkerSpec, tasks: Connection, results: Connection) -> None:
    """Serve tasks until told to stop (``None``), the task pipe closes or the parent dies."""
    global _worker_info
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    seed = worker_seed(spec.seed, spec.worker_id)
    random.seed(seed)
    np.random.seed(seed)
    _worker_info = WorkerInfo(spec.worker_id, spec.num_workers, seed, spec.dataset)
    maker = BatchMaker(spec.dataset, spec.collate_fn, spec.batch_transform)
    parent = mp.parent_process()
    watch: list[Any] = [tasks] if parent is None else [tasks, parent.sentinel]
    ring: Ring | None = None
    try:
        if spec.worker_init_fn is not None:
            try:
                spec.worker_init_fn(spec.worker_id)
            except Exception as exc:  # noqa: BLE001 - reported to the main process
                results.send(("init_error", error_report(exc, None)))
                return
        while True:
            if tasks not in wait(watch):
                return  # the parent is gone
            msg = tasks.recv()
            if msg is None:
                return
            if msg[0] == "ring":
                if ring is not None:
                    ring.close()
                _, name, layout, slots = msg
                ring = Ring.attach(name, layout, slots)
                continue
            _, gen, batch_index, slot, indices, tseed = msg
            if ring is None or ring.generation != gen:
                results.send(("skip", gen, batch_index, slot))
                continue
            try:
                maker.fill(indices, tseed, ring.layout, ring.slot_views(slot, len(indices)), batch_index)
            except Exception as exc:  # noqa: BLE001 - reported to the main process
                results.send(("error", gen, batch_index, slot, error_report(exc, maker.failed_index(exc))))
                continue
            results.send(("ok", gen, batch_index, slot, len(indices)))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the main process went away
    finally:
        if ring is not None:
            ring.close()


# ---------------------------------------------------------------- the pool, seen from the main process


@dataclass
class _Worker:
    id: int
    process: Any
    tasks: Connection
    results: Connection
    outstanding: int = 0


@dataclass(frozen=True)
class Done:
    """A batch a worker finished: it sits in ``slot`` with ``rows`` rows."""

    batch_index: int
    slot: int
    rows: int
    worker_id: int


@dataclass(frozen=True)
class Failed:
    batch_index: int
    error: WorkerError


_CLOSING = np.iinfo(np.int64).max
SHUTDOWN_GRACE_S = 1.0


class WorkerPool:
    """``num_workers`` processes, the ring they write into and the bookkeeping of its slots."""

    def __init__(self, *, dataset: Any, num_workers: int, prefetch_factor: int, seed: int,
                 collate_fn: Callable | None, batch_transform: Callable | None,
                 worker_init_fn: Callable | None, start_method: str) -> None:
        self.prefetch_factor = prefetch_factor
        self.ring: Ring | None = None
        self._free: deque[int] = deque()
        self._generation = 0
        self._rr = 0
        self._closed = False
        self._workers: list[_Worker] = []
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload(["__main__", "cupy_nwt.worker"])
        try:
            for w in range(num_workers):
                spec = WorkerSpec(w, num_workers, seed, dataset, collate_fn, batch_transform, worker_init_fn)
                task_r, task_w = ctx.Pipe(duplex=False)
                res_r, res_w = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=worker_main, args=(spec, task_r, res_w), name=f"cupy_nwt-worker-{w}", daemon=True)
                try:
                    proc.start()
                except (pickle.PicklingError, AttributeError, TypeError) as exc:
                    for c in (task_r, task_w, res_r, res_w):
                        c.close()
                    raise LoaderError(
                        f"start_method={start_method!r} sends the dataset, collate_fn, batch_transform and "
                        f"worker_init_fn to each worker by pickling, and that failed: {exc}. Define them at module "
                        "level, or use start_method='fork' where CUDA is not initialised in this process"
                    ) from exc
                task_r.close()
                res_w.close()
                self._workers.append(_Worker(w, proc, task_w, res_r))
        except BaseException:
            self.shutdown()
            raise

    # -- ring and slots

    def set_ring(self, ring: Ring) -> None:
        """Hand the workers a (new) ring; all its slots start free."""
        self.ring = ring
        ring.generation = self._generation
        self._free = deque(range(ring.slots))
        for w in self._workers:
            self._send(w, ("ring", ring.name, ring.layout, ring.slots))

    def take_slot(self) -> int:
        return self._free.popleft()

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def new_generation(self) -> int:
        """Start a new epoch: tasks still queued from an abandoned one are skipped by the workers."""
        self._generation += 1
        if self.ring is not None:
            self.ring.generation = self._generation
        return self._generation

    # -- tasks and results

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process.is_alive()]

    def submit(self, batch_index: int, indices: np.ndarray, tseed: int) -> bool:
        """Queue a batch on the least busy worker; False when no slot or worker capacity is free."""
        if not self._free or not self._workers:
            return False
        n = len(self._workers)
        order = [self._workers[(self._rr + k) % n] for k in range(n)]
        w = min(order, key=lambda x: x.outstanding)
        if w.outstanding >= self.prefetch_factor:
            return False
        self._rr = (w.id + 1) % n
        slot = self._free.popleft()
        try:
            self._send(w, ("task", self._generation, batch_index, slot, indices, tseed))
        except LoaderError:
            self._free.appendleft(slot)
            raise
        w.outstanding += 1
        return True

    def _send(self, w: _Worker, msg: Any) -> None:
        try:
            w.tasks.send(msg)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._raise_if_dead(timeout=1.0)
            raise LoaderError(f"could not reach loader worker {w.id} (pid {w.process.pid})") from None

    def collect(self, timeout: float | None) -> list[Done | Failed]:
        """Wait up to ``timeout`` s for results; raise at once if a worker died or failed to start."""
        conns = [w.results for w in self._workers]
        sentinels = [w.process.sentinel for w in self._workers]
        wait(conns + sentinels, timeout)
        out: list[Done | Failed] = []
        for w in self._workers:
            while True:
                try:
                    if not w.results.poll():
                        break
                    msg = w.results.recv()
                except (EOFError, OSError):
                    break
                item = self._absorb(w, msg)
                if item is not None:
                    out.append(item)
        self._raise_if_dead(timeout=0.0)
        return out

    def _absorb(self, w: _Worker, msg: tuple) -> Done | Failed | None:
        kind = msg[0]
        if kind == "init_error":
            raise make_worker_error(msg[1], worker_id=w.id, pid=w.process.pid, batch_index=None)
        gen, batch_index, slot = msg[1], msg[2], msg[3]
        w.outstanding -= 1
        current = gen == self._generation
        if kind == "ok" and current:
            return Done(batch_index, slot, msg[4], w.id)
        self._free.append(slot)
        if kind == "error" and current:
            return Failed(batch_index, make_worker_error(msg[4], worker_id=w.id, pid=w.process.pid, batch_index=batch_index))
        return None

    def _raise_if_dead(self, timeout: float) -> None:
        for w in self._workers:
            if w.process.is_alive():
                continue
            w.process.join(timeout if timeout > 0 else 1.0)  # reap it so the exit code is known
            self._raise_init_error(w)
            code = w.process.exitcode
            if code is not None and code < 0:
                try:
                    how = f"was killed by signal {signal.Signals(-code).name}"
                except ValueError:
                    how = f"was killed by signal {-code}"
                hint = " (SIGKILL often means the kernel's out-of-memory killer)" if code == -signal.SIGKILL else ""
            else:
                how, hint = f"exited unexpectedly with exit code {code}", ""
            raise WorkerDiedError(f"loader worker {w.id} (pid {w.process.pid}) {how}{hint}",
                                  worker_id=w.id, pid=w.process.pid, exitcode=code)

    def _raise_init_error(self, w: _Worker) -> None:
        """A worker whose worker_init_fn failed reported why before exiting: prefer that reason."""
        try:
            while w.results.poll():
                msg = w.results.recv()
                if msg[0] == "init_error":
                    raise make_worker_error(msg[1], worker_id=w.id, pid=w.process.pid, batch_index=None)
        except (EOFError, OSError):
            pass

    # -- shutdown

    def shutdown(self) -> None:
        """Stop every worker: ask, wait up to SHUTDOWN_GRACE_S, then SIGTERM, then SIGKILL. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.ring is not None and not self.ring.closed:
            self.ring.generation = _CLOSING  # queued tasks are skipped, not computed
        for w in self._workers:
            try:
                w.tasks.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for w in self._workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in self._workers:
            if w.process.is_alive():
                w.process.terminate()
        for w in self._workers:
            w.process.join(1.0)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
        for w in self._workers:
            w.tasks.close()
            w.results.close()
            w.process.close()
        self._workers = []
        self.ring = None

    @property
    def closed(self) -> bool:
        return self._closed


def default_start_method(device: str) -> str:
    """``forkserver`` when CUDA is (or will be) live in this process, else ``fork``.

    A forked child of a process with a CUDA context must not use CUDA, and page-locked memory is
    mapped don't-fork; forkserver children come from a clean server process instead. The price is
    that the dataset and callables are pickled to each worker. Without CUDA, fork is the fastest to
    start and shares the dataset copy-on-write.
    """
    if device == "cuda" or cuda.cuda_may_be_initialized():
        return "forkserver"
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"

