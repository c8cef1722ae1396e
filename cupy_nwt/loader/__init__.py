"""The data loader: batches made by workers into a shared-memory ring, delivered in order, on the host
or on the GPU. How a batch travels and how a slot lives: ``README.md`` beside this file.

Everything a user needs is here (and in ``cupy_nwt``); the modules with a leading underscore are the
machinery behind it. The names load on first use, so that a worker process, which imports this
package on the way to its own modules (``workers.process_main``), does not import the main process's
side of the loader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .._worker_info import WorkerInfo, get_worker_info
    from ..data.contract import IterableDataset
    from ..errors import LoaderError, LoaderTimeoutError, RingMemoryError, ShmSpaceError, WorkerDiedError, WorkerError
    from ..ranks import RankLayout, rank_layout
    from ._dataloader import DataLoader
    from ._events import Listener, StageTimes, Stall
    from ._runtime import LoaderParts
    from ._stats import LoaderStats, MemoryGrowthWarning
    from .checkpoint.resume import merge_states
    from .plan.order import BatchSampler
    from .ring.collate import default_collate
    from .ring.slots import HostBatch
    from .tuning.online import Autotune

__getattr__ = lazy_names(__name__, {
    **dict.fromkeys(("WorkerInfo", "get_worker_info"), ".._worker_info"),
    "IterableDataset": "..data.contract",
    **dict.fromkeys(("LoaderError", "LoaderTimeoutError", "RingMemoryError", "ShmSpaceError", "WorkerDiedError",
                     "WorkerError"), "..errors"),
    **dict.fromkeys(("RankLayout", "rank_layout"), "..ranks"),
    "DataLoader": "._dataloader",
    **dict.fromkeys(("Listener", "StageTimes", "Stall"), "._events"),
    "LoaderParts": "._runtime",
    **dict.fromkeys(("LoaderStats", "MemoryGrowthWarning"), "._stats"),
    "merge_states": ".checkpoint.resume",
    "BatchSampler": ".plan.order",
    "default_collate": ".ring.collate",
    "HostBatch": ".ring.slots",
    "Autotune": ".tuning.online",
})

__all__ = ["Autotune", "BatchSampler", "DataLoader", "HostBatch", "IterableDataset", "Listener", "LoaderError",
           "LoaderParts", "LoaderStats", "LoaderTimeoutError", "MemoryGrowthWarning", "RankLayout", "RingMemoryError", "ShmSpaceError", "StageTimes", "Stall",
           "WorkerDiedError", "WorkerError", "WorkerInfo", "default_collate", "get_worker_info", "merge_states",
           "rank_layout"]


def __dir__() -> list[str]:
    return __all__
