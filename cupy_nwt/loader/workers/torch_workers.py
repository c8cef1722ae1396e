"""What a worker does for PyTorch when the user's code uses it, as ``torch.utils.data.DataLoader`` does.

Never imports torch: each step runs only when ``torch`` is already in ``sys.modules`` (the dataset or
the script imported it), so a loader without torch never pays for it.

* One intra-op thread per worker (``torch.set_num_threads(1)``): a worker forked from a process whose
  OpenMP pool had run would otherwise hang in its first parallel torch op (fork copies the pool's
  state, not its threads), and N workers x N threads oversubscribe the CPUs anyway.
* torch's global generator seeded with the worker's seed, so ``torch.rand`` in ``__getitem__`` draws
  differently in each worker and each epoch (every torchvision random transform draws there).
* In a worker that starts without torch, it is adopted the moment its import finishes
  (``TorchAdoption``), wherever that happens: a ``worker_init_fn`` that imports torch and seeds
  it keeps its seed, as under torch's loader, which seeds before ``worker_init_fn`` runs.
* ``torch.utils.data.get_worker_info()`` answers, so a torch ``IterableDataset`` that shards itself
  by it, as torch's documentation shows, reads its own share. torch keeps that answer in a private
  module global (``torch.utils.data._utils.worker._worker_info``); setting it is wrapped, and a torch
  that moved it leaves the worker as it was, with a debug line.

Thread workers cannot do the last two: torch's generator and its worker info are one per process.
``refuse_for_threads`` turns the silent duplication that would follow into an error.

A torch ``IterDataPipe`` (``torch.utils.data.datapipes``) gets what torch's loader gives it: the
loader's ``shuffle`` applied to its shufflers at construction (``with_shuffle_settings``), and before
each epoch's stream opens, in whichever process or thread reads it, its ``sharding_filter`` set to
this reader's share (worker-major over ranks, as torch numbers them) and its shufflers seeded with
one seed per epoch shared by every reader, so each element comes once (``prepare_datapipe``; one reader
walks its graph at a time, as torch walks it through a hook set process-wide). Without
``seed`` or ``generator`` that seed is drawn from torch's default generator at each ``iter()``, as
torch's loader draws it (``torch_shared_seed``).
"""

from __future__ import annotations

import dis
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..._fork_safe_lock import ForkSafeLock
from ..._worker_info import get_worker_info
from ...data.contract import dataset_style
from ...errors import LoaderError

_log = logging.getLogger("cupy_nwt.loader")


def adopt_in_worker(worker_id: int, num_workers: int, seed: int, dataset: Any) -> bool:
    """In a worker process: torch's threads, seed and worker info, if torch is imported. True if it was."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "manual_seed"):
        return False  # absent, or only half imported (an import in progress elsewhere)
    try:
        torch.set_num_threads(1)
        torch.manual_seed(seed)
    except Exception as exc:  # noqa: BLE001 - a broken torch must not cost the worker
        _log.debug("loader worker %d: could not set torch's threads or seed: %s", worker_id, exc)
    try:
        from torch.utils.data._utils import worker as torch_worker  # noqa: PLC0415 - torch is imported already

        torch_worker._worker_info = torch_worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                                            dataset=dataset)
    except Exception as exc:  # noqa: BLE001 - a private API: a torch without it keeps get_worker_info() None
        _log.debug("loader worker %d: could not set torch.utils.data.get_worker_info(): %s", worker_id, exc)
    return True


class _WhenImported(importlib.abc.MetaPathFinder):
    """Runs ``then`` right after ``torch`` is imported, once; finds nothing itself."""

    def __init__(self, then: Callable[[], object]) -> None:
        self.then = then

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # torch is imported once a process
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module: Any) -> None:
            run(module)
            then()

        setattr(spec.loader, "exec_module", exec_module)  # this spec's loader only
        return spec


class TorchAdoption:
    """A worker process's adoption of torch (``adopt_in_worker``), once: at the start if torch is
    imported, else the moment its import finishes, at the latest before a task (a torch that was only
    half imported at the start)."""

    def __init__(self, worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
        self.args = (worker_id, num_workers, seed, dataset)
        self.done = False
        if not self.before_task():
            sys.meta_path.insert(0, _WhenImported(self.before_task))

    def before_task(self) -> bool:
        self.done = self.done or adopt_in_worker(*self.args)
        return self.done


def reads_torch_worker_info(dataset: Any) -> bool:
    """Does a method of the dataset's class call torch's ``get_worker_info`` itself? Read from its bytecode:
    a global that is torch's function, or ``get_worker_info`` looked up on a chain of attributes rooted at a
    global that is torch or one of its modules (nested functions and generators included). A call to
    ``cupy_nwt.get_worker_info()`` is never mistaken for it, whatever else of torch the method uses."""
    for klass in type(dataset).__mro__:
        if klass is object:
            continue
        for fn in vars(klass).values():
            fn = getattr(fn, "__func__", fn)
            code = getattr(fn, "__code__", None)
            if code is not None and _calls_torch_info(code, getattr(fn, "__globals__", {})):
                return True
    return False


def _calls_torch_info(code: Any, scope: dict[str, Any]) -> bool:
    if "get_worker_info" in code.co_names:
        rooted = False  # whether the attribute chain being looked up started from torch or one of its modules
        imported: str | None = None  # the module the last import statement named
        torch_locals: set[str] = set()  # names an ``import torch...`` inside the function bound (read by name:
        for ins in dis.get_instructions(code):  # torch may not be imported yet)
            op, arg = ins.opname, ins.argval
            if op == "IMPORT_NAME":
                imported, rooted = str(arg), False
            elif op == "IMPORT_FROM":
                if arg == "get_worker_info" and _is_torch_module(imported):
                    return True
            elif op.startswith("STORE_"):
                if _is_torch_module(imported):
                    torch_locals.add(str(arg))
                imported, rooted = None, False
            elif op == "LOAD_GLOBAL":
                rooted = _is_torch(scope.get(str(arg)))
                if arg == "get_worker_info" and rooted:
                    return True
            elif op.startswith(("LOAD_FAST", "LOAD_DEREF")):
                rooted = (arg[-1] if isinstance(arg, tuple) else arg) in torch_locals
            elif op in ("LOAD_ATTR", "LOAD_METHOD"):
                if arg == "get_worker_info" and rooted:
                    return True
            elif op not in ("CACHE", "EXTENDED_ARG"):
                rooted = False
    return any(_calls_torch_info(c, scope) for c in code.co_consts if hasattr(c, "co_names"))


def _is_torch_module(name: str | None) -> bool:
    return name is not None and (name == "torch" or name.startswith("torch."))


def _is_torch(obj: Any) -> bool:
    where = obj.__name__ if isinstance(obj, type(sys)) else getattr(obj, "__module__", None)
    return isinstance(where, str) and _is_torch_module(where)


def refuse_for_threads(dataset: Any, num_workers: int) -> None:
    """With several thread workers, refuse a stream that shards itself by torch's worker info.

    torch's ``get_worker_info()`` is one value for the whole process: every thread would see None
    and read the whole stream, so each sample would come ``num_workers`` times. The rule: an
    iterable-style dataset whose class's methods call torch's ``get_worker_info`` themselves
    (``reads_torch_worker_info``; a call hidden in a helper outside the class is not seen) is
    refused with more than one thread worker. One that shards by ``cupy_nwt.get_worker_info()``,
    torch ``IterableDataset`` or not, is served.
    """
    if num_workers < 2 or dataset_style(dataset) != "iterable" or not reads_torch_worker_info(dataset):
        return
    raise LoaderError(
        f"{type(dataset).__name__} shards itself by torch.utils.data.get_worker_info(), which is one value for the "
        f"whole process, so each of {num_workers} thread workers would read all of it: use worker_type='process', "
        "or shard by cupy_nwt.get_worker_info(), which thread workers answer")


PIPE_WALK_LOCK = ForkSafeLock()
"""Held while torch's pipe classes may hold the hooks of a walk: torch walks a pipe's graph through hooks
set on those classes, one for the whole process, so thread workers walking their copies at once would
cross (one fails, or walks without the hook and misses its sharding filter), and a pipe copied meanwhile
(its pickling goes through them) would be a stub."""


def is_iter_datapipe(dataset: Any) -> bool:
    """Is the dataset a torch ``IterDataPipe``? (Only when torch's datapipes are imported: then it may be.)"""
    module = sys.modules.get("torch.utils.data.datapipes.datapipe")
    return module is not None and isinstance(dataset, module.IterDataPipe)


def with_shuffle_settings(dataset: Any, shuffle: bool) -> Any:
    """torch's ``shuffle=`` for an ``IterDataPipe``: its shufflers on or off (one added at the end where
    ``shuffle=True`` finds none, with torch's warning); the graph to load from."""
    from torch.utils.data import graph_settings  # noqa: PLC0415 - torch is imported: the dataset is its

    with PIPE_WALK_LOCK:
        return graph_settings.apply_shuffle_settings(dataset, shuffle=bool(shuffle))


def pipe_seed(seed: int, epoch: int, follows_torch: bool) -> int:
    """The seed every reader's shufflers get this epoch. ``follows_torch``: the loader's seed was drawn
    from torch's default generator at this ``iter()``, as torch's loader draws its shared seed, so the
    same ``torch.manual_seed`` before two epochs gives the same order (the epoch is not mixed in)."""
    words = [seed, _PIPE_TAG] if follows_torch else [seed, epoch, _PIPE_TAG]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> 1)


def torch_shared_seed() -> int | None:
    """A seed drawn from torch's default generator, as torch's loader draws its base seed at each
    ``iter()`` (None when torch is not imported)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "empty"):
        return None
    return int(torch.empty((), dtype=torch.int64).random_().item()) & (2**63 - 1)


def prepare_datapipe(dataset: Any, shared: int, rank: int, world_size: int) -> None:
    """Before an epoch of an ``IterDataPipe`` opens here: its share and its shufflers' seed (see above)."""
    import torch  # noqa: PLC0415 - imported already: the dataset is torch's
    from torch.utils.data import graph_settings  # noqa: PLC0415

    info = get_worker_info()
    shards, shard = (world_size, rank) if info is None else (info.num_workers * world_size, info.id * world_size + rank)
    with PIPE_WALK_LOCK:
        graph_settings.apply_sharding(dataset, shards, shard)
        graph_settings.apply_random_seed(dataset, torch.Generator().manual_seed(shared))


_PIPE_TAG = 0x70697065  # keeps the datapipe's shuffle seeds apart from the loader's other seeds
