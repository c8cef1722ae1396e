"""What a worker does for PyTorch when the user's code uses it, as ``torch.utils.data.DataLoader`` does.

Never imports torch: each step runs only when ``torch`` is already in ``sys.modules`` (the dataset or
the script imported it), so a loader without torch never pays for it.

* One intra-op thread per worker (``torch.set_num_threads(1)``): a worker forked from a process whose
  OpenMP pool had run would otherwise hang in its first parallel torch op (fork copies the pool's
  state, not its threads), and N workers x N threads oversubscribe the CPUs anyway.
* torch's global generator seeded with the worker's seed, so ``torch.rand`` in ``__getitem__`` draws
  differently in each worker and each epoch (every torchvision random transform draws there).
* ``torch.utils.data.get_worker_info()`` answers, so a torch ``IterableDataset`` that shards itself
  by it, as torch's documentation shows, reads its own share. torch keeps that answer in a private
  module global (``torch.utils.data._utils.worker._worker_info``); setting it is wrapped, and a torch
  that moved it leaves the worker as it was, with a debug line.

Thread workers cannot do the last two: torch's generator and its worker info are one per process.
``refuse_for_threads`` turns the silent duplication that would follow into an error.
"""

from __future__ import annotations

import dis
import logging
import sys
from typing import Any

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
        root: Any = None  # what the attribute chain being looked up started from
        for ins in dis.get_instructions(code):
            if ins.opname == "LOAD_GLOBAL":
                root = scope.get(str(ins.argval))
                if ins.argval == "get_worker_info" and _is_torch(root):
                    return True
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                if ins.argval == "get_worker_info" and _is_torch(root):
                    return True
            elif ins.opname not in ("CACHE", "EXTENDED_ARG"):
                root = None
    return any(_calls_torch_info(c, scope) for c in code.co_consts if hasattr(c, "co_names"))


def _is_torch(obj: Any) -> bool:
    where = obj.__name__ if isinstance(obj, type(sys)) else getattr(obj, "__module__", None)
    return isinstance(where, str) and (where == "torch" or where.startswith("torch."))


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
