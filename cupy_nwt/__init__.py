"""cupy_nwt: measure host-to-device transfer, feed GPUs with a shared-memory loader, tune its workers."""

from .cuda import NoGPUError, gpu_status
from .errors import (ArgumentError, BatchLayoutError, CorruptImageError, CupyNwtError, DamagedArchiveError, DataError,
                     LayoutError, ShmSpaceError)
from .loader import DataLoader, LoaderError, LoaderTimeoutError, WorkerDiedError, WorkerError
from .nwt import auto as _auto  # noqa: F401 - registers the tuner that num_workers="auto" runs
from .nwt.store import TuneResult
from .nwt.tune import tune_num_workers

__version__ = "0.1.0"

__all__ = ["NoGPUError", "gpu_status", "__version__",
           "ArgumentError", "BatchLayoutError", "CorruptImageError", "CupyNwtError", "DamagedArchiveError", "DataError",
           "LayoutError", "ShmSpaceError",
           "DataLoader", "LoaderError", "LoaderTimeoutError", "WorkerDiedError", "WorkerError",
           "TuneResult", "tune_num_workers"]
