"""PyTorch's own DataLoader cases on order, samplers and seeds, on both loaders (see test_parity_torch_suite.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest
from parity_backends import is_torch

torch = pytest.importorskip("torch", reason="these cases mirror torch's own tests")
import torch.utils.data as tud  # noqa: E402
from torch_suite_data import (  # noqa: E402
    Counting,
    as_list,
    items,
    worker_info,
)

pytestmark = pytest.mark.usefixtures("worker_type")


# -- order, samplers and seeds


class InfoSeeds(tud.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        return i, worker_info().seed


def test_torch_manual_seed_makes_a_shuffled_epoch_and_worker_seeds_repeat(backend):
    """torch: IntegrationTestDataLoaderDataPipe.test_shuffler_iterdatapipe ("Same seeds": a loader
    given no generator draws from torch's global generator, so ``torch.manual_seed`` repeats a run)."""
    def run(seed):
        torch.manual_seed(seed)
        loader = backend(InfoSeeds(), batch_size=2, shuffle=True, num_workers=2)
        order, seeds = [], set()
        for index, seed_of_worker in loader:
            order += as_list(index)
            seeds |= set(as_list(seed_of_worker))
        return order, seeds

    first = run(11)
    assert run(11) == first
    assert run(12) != first


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_seeded_generator_gives_one_shuffle_whatever_the_worker_count(backend, num_workers):
    """torch: TestDataLoader.test_shuffle_reproducibility."""
    def order(workers):
        return items(backend(Counting(12), batch_size=3, shuffle=True, num_workers=workers,
                             generator=torch.Generator().manual_seed(42)))

    got = order(num_workers)
    assert sorted(got) == list(range(12)) and got == order(num_workers) == order(0)


def test_workers_get_distinct_seeds_and_a_seeded_generator_repeats_them(backend):
    """torch: TestDataLoader.test_worker_seed and test_worker_seed_reproducibility."""
    def seeds():
        loader = backend(InfoSeeds(), batch_size=1, num_workers=2, generator=torch.Generator().manual_seed(42))
        return {int(as_list(s)[0]) for _, s in loader}

    first = seeds()
    assert len(first) == 2 and seeds() == first


class TorchSeed(tud.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return torch.initial_seed()


def reseed_torch(worker_id):
    torch.manual_seed(12345)


def test_a_worker_init_fn_may_reseed_torch(backend):
    """torch: TestDataLoader.test_worker_init_fn."""
    got = items(backend(TorchSeed(), batch_size=2, num_workers=2, worker_init_fn=reseed_torch))
    assert got == [12345] * 4


SEED_IN_INIT = """
import sys
import {module} as loader_module

class TorchSeed:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return sys.modules["torch"].initial_seed()

def reseed(worker_id):
    import torch  # first imported here, in the worker: the script never imported it
    torch.manual_seed(12345)

if __name__ == "__main__":
    kw = {{"device": "cpu"}} if "{module}" == "cupy_nwt" else {{}}
    loader = loader_module.DataLoader(TorchSeed(), batch_size=2, num_workers=2, worker_init_fn=reseed, **kw)
    print(sorted({{int(x) for b in loader for x in b}}))
"""


@pytest.mark.process_only("torch's generator is one per process: threads have no worker-own seed")
def test_a_worker_init_fn_that_first_imports_torch_keeps_its_seed(backend):
    """torch: TestDataLoader.test_worker_init_fn, in a script that imports torch only in its
    ``worker_init_fn``: the seed set there is the one ``__getitem__`` sees."""
    module = "torch.utils.data" if is_torch(backend) else "cupy_nwt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(SEED_IN_INIT.format(module=module))],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[12345]"


@pytest.mark.parametrize("kwargs", [dict(replacement=True, num_samples=15), dict(replacement=False, num_samples=15),
                                    dict(replacement=False, num_samples=7)], ids=str)
def test_a_random_sampler_s_num_samples_sets_len_and_content(backend, kwargs):
    """torch: TestDataLoader.test_random_sampler and test_random_sampler_len_{with,without}_replacement."""
    sampler = tud.RandomSampler(Counting(10), generator=torch.Generator().manual_seed(3), **kwargs)
    loader = backend(Counting(10), batch_size=4, sampler=sampler, num_workers=2)
    got = items(loader)
    assert len(loader) == math.ceil(kwargs["num_samples"] / 4) and len(got) == kwargs["num_samples"]
    assert set(got) <= set(range(10))
    if not kwargs["replacement"]:
        counts = Counter(got)
        assert max(counts.values()) - min(counts.values()) <= 1 and len(counts) == min(10, kwargs["num_samples"])


def test_distributed_samplers_with_drop_last_never_repeat_a_sample(backend):
    """torch: TestDataLoader.test_duplicating_data_with_drop_last."""
    seen = []
    for rank in range(4):
        sampler = tud.distributed.DistributedSampler(Counting(9), num_replicas=4, rank=rank)
        seen += items(backend(Counting(9), batch_size=2, drop_last=True, sampler=sampler))
    assert len(seen) == len(set(seen)) == 8


def test_len_follows_a_growing_dataset(backend):
    """torch: TestDataLoader.test_growing_dataset."""
    data = [np.ones(4) for _ in range(4)]
    plain, shuffled = backend(data, shuffle=False), backend(data, shuffle=True)
    data.append(np.ones(4))
    assert len(plain) == len(shuffled) == 5
    assert len(list(plain)) == len(list(shuffled)) == 5


