"""A loader copied as scripts copy it: pickled to the processes of ``torch.multiprocessing.spawn`` (and of
Lightning's ``ddp_spawn``, in ``test_clients_lightning``), or ``copy.deepcopy``'d with the object that holds it.
torch's DataLoader pickles; so does this one: the copy has the settings, the epoch and a loaded state not
yet begun, and starts workers and rings of its own."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import DataLoader

pytestmark = pytest.mark.usefixtures("worker_type")

ROOT = Path(__file__).resolve().parents[2]
DATA = np.arange(24, dtype=np.int64)


def ids(loader: DataLoader) -> list[list[int]]:
    return [b.tolist() for b in loader]


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_copy_gives_the_batches_the_loader_gives_from_the_same_epoch(how, num_workers):
    loader = DataLoader(DATA, batch_size=5, shuffle=True, seed=1, num_workers=num_workers, device="cpu",
                        persistent_workers=num_workers > 0)
    ids(loader)  # an epoch run: the copy takes the epoch count
    twin = pickle.loads(pickle.dumps(loader)) if how == "pickle" else copy.deepcopy(loader)
    assert twin.epoch == loader.epoch == 1 and twin.worker_pids() == []
    assert ids(twin) == ids(loader)
    twin.close()
    assert len(sum(ids(loader), [])) == len(DATA)  # the original goes on, its workers its own
    loader.close()


def test_a_copy_carries_a_loaded_state_not_yet_begun():
    whole = ids(DataLoader(DATA, batch_size=5, shuffle=True, seed=1, device="cpu"))
    loader = DataLoader(DATA, batch_size=5, shuffle=True, seed=1, device="cpu")
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    fresh = DataLoader(DATA, batch_size=5, shuffle=True, seed=1, device="cpu")
    fresh.load_state_dict(state)
    assert ids(copy.deepcopy(fresh)) == whole[1:] == ids(fresh)


SPAWNED = """
import json, sys

import numpy as np
import torch.multiprocessing as mp

import cupy_nwt


def train(rank, loader, out):
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump([b.tolist() for b in loader], f)
    loader.close()


if __name__ == "__main__":
    loader = cupy_nwt.DataLoader(np.arange(24), batch_size=5, shuffle=True, seed=2, num_workers=2, device="cpu")
    mp.spawn(train, args=(loader, sys.argv[1]), nprocs=2)
    print(json.dumps([b.tolist() for b in loader]))
"""


def test_a_loader_handed_to_torch_multiprocessing_spawn_runs_in_each_process(tmp_path: Path):
    pytest.importorskip("torch", reason="torch.multiprocessing.spawn is the case")
    (tmp_path / "train.py").write_text(textwrap.dedent(SPAWNED))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "train.py", str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    here = json.loads(proc.stdout.strip().splitlines()[-1])
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == here  # no group: every sample, same order
    assert sorted(sum(here, [])) == list(range(24))
