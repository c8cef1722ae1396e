"""PyTorch users' own datasets and loops, unchanged, in worker processes: on both loaders, as test_parity.

A torch model trained in the loop does not hang the next epoch's workers (fork after threads),
``torch.rand`` in ``__getitem__`` draws differently in each worker and epoch, and
``torch.utils.data.get_worker_info()`` answers, so a torch ``IterableDataset`` sharding itself as
torch's documentation shows yields each sample once. Thread workers refuse what they cannot honour. The JAX cases are in test_start_method.py.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import cupy_nwt
from cupy_nwt.errors import CupyNwtError

torch = pytest.importorskip("torch", reason="these cases are about PyTorch users' code")
tud = pytest.importorskip("torch.utils.data", reason="these cases are about PyTorch users' code")

ROOT = Path(__file__).resolve().parents[3]
LOADERS = ["cupy_nwt", "torch"]


def make_loader(which: str, dataset, **kw):
    if which == "cupy_nwt":
        return cupy_nwt.DataLoader(dataset, device="cpu", **kw)
    return tud.DataLoader(dataset, **kw)


def run_script(tmp_path: Path, body: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=timeout)


# ------------------------------------------------------------ fork after threads (torch's thread pool)

TRAIN = """
import sys
import torch
import torch.nn as nn
import torch.utils.data as tud
import cupy_nwt

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

class Images(tud.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        x = torch.rand(3, 224, 224, generator=torch.Generator().manual_seed(i))
        return (x - MEAN) / STD, i % 10

Loader = tud.DataLoader if sys.argv[1] == "torch" else cupy_nwt.DataLoader
loader = Loader(Images(), batch_size=8, num_workers=2, timeout=60)
model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    for images, labels in loader:
        loss = nn.functional.cross_entropy(model(torch.as_tensor(images)), torch.as_tensor(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("epoch", epoch, "done", flush=True)
"""


@pytest.mark.parametrize("which", LOADERS)
def test_a_torch_training_script_without_main_guard_runs_its_second_epoch(tmp_path, which):
    """The parent's training step runs torch's OpenMP pool; the next epoch's forked workers must not hang in it."""
    proc = run_script(tmp_path, TRAIN, which)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["epoch 0 done", "epoch 1 done"]


def test_torch_in_the_parent_keeps_fork():
    """torch imported (and its threads run) is no reason to leave fork: workers set one thread instead."""
    torch.ones(256, 256) @ torch.ones(256, 256)
    assert cupy_nwt.DataLoader(list(range(4)), num_workers=2, device="cpu").start_method == "fork"


# ------------------------------------------------------------ torch's generator, reseeded per worker and epoch

class Draws(tud.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.rand(1).item()


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("which", LOADERS)
def test_torch_rand_in_getitem_differs_across_workers_and_epochs(which, persistent):
    loader = make_loader(which, Draws(), batch_size=8, num_workers=2, persistent_workers=persistent)
    epochs = [[float(x) for batch in loader for x in batch] for _ in range(2)]
    assert [len(set(e)) for e in epochs] == [64, 64]
    assert not set(epochs[0]) & set(epochs[1])


class GlobalDraws(tud.Dataset):
    """Python's and NumPy's global generators, which both loaders seed per worker too.

    The generator is named, not held: a held ``random.random`` is a bound method that forkserver and
    spawn would pickle with its generator's state, a copy no worker seeding reaches."""

    def __init__(self, draw: str) -> None:
        self.draw = draw

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return random.random() if self.draw == "random" else float(np.random.random())


@pytest.mark.parametrize("draw", ["random", "numpy"])
@pytest.mark.parametrize("which", LOADERS)
def test_python_and_numpy_global_draws_differ_across_workers_and_epochs_as_torchs_do(which, draw):
    loader = make_loader(which, GlobalDraws(draw), batch_size=8, num_workers=2)
    epochs = [[float(x) for batch in loader for x in batch] for _ in range(2)]
    assert [len(set(e)) for e in epochs] == [64, 64]
    assert not set(epochs[0]) & set(epochs[1])


class Seeds(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = tud.get_worker_info()
        return info.id, info.num_workers, info.seed, torch.initial_seed()


@pytest.mark.parametrize("which", LOADERS)
def test_torch_worker_info_answers_and_names_the_seed_torch_was_given(which):
    rows = [tuple(int(v) for v in row) for b in make_loader(which, Seeds(), batch_size=2, num_workers=2)
            for row in zip(*b)]
    assert {r[:2] for r in rows} == {(0, 2), (1, 2)}
    assert all(r[2] == r[3] for r in rows)
    seeds = {r[0]: r[2] for r in rows}
    assert seeds[1] == seeds[0] + 1  # base seed + worker id, as torch's


# ------------------------------------------------------------ a torch IterableDataset that shards itself

class Range(tud.IterableDataset):
    """torch's documentation's example: each worker reads its contiguous part of [start, end)."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self):
        worker_info = torch.utils.data.get_worker_info()
        if worker_info is None:
            lo, hi = self.start, self.end
        else:
            per_worker = int(math.ceil((self.end - self.start) / float(worker_info.num_workers)))
            lo = self.start + worker_info.id * per_worker
            hi = min(lo + per_worker, self.end)
        return iter(range(lo, hi))


@pytest.mark.parametrize("which", LOADERS)
def test_a_torch_iterable_dataset_sharding_itself_yields_each_sample_once(which):
    got = [int(x) for batch in make_loader(which, Range(3, 40), batch_size=4, num_workers=2) for x in batch]
    assert sorted(got) == list(range(3, 40))


def test_thread_workers_refuse_a_stream_sharded_by_torchs_worker_info():
    loader = cupy_nwt.DataLoader(Range(0, 8), batch_size=2, num_workers=2, worker_type="thread", device="cpu")
    with pytest.raises(CupyNwtError, match="torch.utils.data.get_worker_info") as err:
        list(loader)
    assert "\n" not in str(err.value)


class ImportsTorchInside(tud.IterableDataset):
    """Shards by torch's worker info through a torch imported inside the method, as Hugging Face datasets'
    ``IterableDataset`` does (``import torch.utils.data`` in ``__iter__``), under one of three spellings."""

    def __init__(self, spelling: str) -> None:
        self.spelling = spelling

    def __iter__(self):
        if self.spelling == "module":
            import torch.utils.data

            info = torch.utils.data.get_worker_info()
        elif self.spelling == "alias":
            import torch.utils.data as data

            info = data.get_worker_info()
        else:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
        yield from range(8) if info is None else range(info.id, 8, info.num_workers)


@pytest.mark.parametrize("spelling", ["module", "alias", "from"])
def test_thread_workers_refuse_a_stream_that_imports_torch_inside_to_shard(spelling):
    """Each thread would read the whole stream through torch's None (every sample twice): refused in one line."""
    loader = cupy_nwt.DataLoader(ImportsTorchInside(spelling), batch_size=2, num_workers=2, worker_type="thread",
                                 device="cpu")
    with pytest.raises(CupyNwtError, match="torch.utils.data.get_worker_info") as err:
        list(loader)
    assert "\n" not in str(err.value)
    got = [int(x) for b in cupy_nwt.DataLoader(ImportsTorchInside(spelling), batch_size=2, num_workers=2,
                                               worker_type="process", device="cpu") for x in b]
    assert sorted(got) == list(range(8))


class CupyNwtSharded(tud.IterableDataset):
    """Shards by cupy_nwt's worker info, and uses torch in the same method: served by threads."""

    def __iter__(self):
        info = cupy_nwt.get_worker_info()
        for i in range(info.id, 8, info.num_workers) if info is not None else range(8):
            yield int(torch.tensor(i))


def test_thread_workers_serve_a_torch_stream_sharded_by_cupy_nwts_worker_info():
    for workers in (1, 2):  # one thread reads the whole stream through torch's None, correctly
        got = [int(x) for b in cupy_nwt.DataLoader(Range(0, 8) if workers == 1 else CupyNwtSharded(), batch_size=2,
                                                   num_workers=workers, worker_type="thread", device="cpu") for x in b]
        assert sorted(got) == list(range(8))


def test_a_stream_importing_torch_inside_is_seen_before_torch_is_imported(tmp_path):
    """A program that never imported torch itself (Hugging Face datasets imports it inside ``__iter__``): the
    check reads the method's import by name, so threads still refuse the stream."""
    (tmp_path / "lazy_stream.py").write_text(
        "class Lazy:\n"
        "    def __iter__(self):\n"
        "        import torch.utils.data\n"
        "        info = torch.utils.data.get_worker_info()\n"
        "        yield from range(8) if info is None else range(info.id, 8, info.num_workers)\n")
    code = ("import sys; from lazy_stream import Lazy\n"
            "from cupy_nwt.loader.workers.torch_workers import reads_torch_worker_info\n"
            "assert 'torch' not in sys.modules\n"
            "print(reads_torch_worker_info(Lazy()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])})
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]
