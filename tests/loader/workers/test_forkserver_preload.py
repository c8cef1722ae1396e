"""forkserver's server imports this package's modules that define what each worker unpickles.

Without it every worker imported Numba (the batch transforms' module) on its own after the fork; on
the H200 a 15-worker cupy_nwt loader took 6-8 s to its first batch against torch's 0.2-0.8 s.
"""

import sys

from cupy_nwt.data import ArrayDataset, CifarTrainTransform
from cupy_nwt.loader.workers.start import forkserver_preload


class UsersDataset:
    def __len__(self):
        return 1


def users_collate(batch):
    return batch


def test_the_modules_of_the_package_s_dataset_and_transform_are_preloaded():
    import numpy as np

    ds = ArrayDataset(np.zeros((4, 2), np.uint8), np.zeros(4, np.int64))
    mods = forkserver_preload([ds, None, CifarTrainTransform()])
    assert type(ds).__module__ in mods and CifarTrainTransform.__module__ in mods
    assert mods[:3] == ["__main__", "cupy_nwt.loader.workers.server_main", "cupy_nwt.loader.workers.process_main"]


def test_nothing_of_the_user_s_is_preloaded_beyond_the_main_module():
    mods = forkserver_preload([UsersDataset(), users_collate, None])
    assert __name__ not in mods
    assert mods == ["__main__", "cupy_nwt.loader.workers.server_main", "cupy_nwt.loader.workers.process_main", *(["torch"] if "torch" in sys.modules else [])]
