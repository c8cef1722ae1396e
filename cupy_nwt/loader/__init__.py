"""The data loader: batches made by workers into a shared-memory ring, delivered in order, on the host
or on the GPU. How a batch travels and how a slot lives: ``README.md`` beside this file.

Everything a user needs is here (and in ``cupy_nwt``); the modules with a leading underscore are the
machinery behind it.
"""

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

__all__ = ["Autotune", "BatchSampler", "DataLoader", "HostBatch", "IterableDataset", "Listener", "LoaderError",
           "LoaderParts", "LoaderStats", "LoaderTimeoutError", "MemoryGrowthWarning", "RankLayout", "RingMemoryError", "ShmSpaceError", "StageTimes", "Stall",
           "WorkerDiedError", "WorkerError", "WorkerInfo", "default_collate", "get_worker_info", "merge_states",
           "rank_layout"]
