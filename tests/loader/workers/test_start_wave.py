"""Workers that start in waves (forkserver, spawn: one per usable CPU, the rest once one is up) make
the same batches as workers started together: each batch once, in order, by the worker torch's
dealing gives it, and a resumed stream's state reaches a worker that was not started yet.

Run as a user's script would be, in a process that may use one CPU (a one-CPU container), so the
first wave is one worker and the others start later."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from cupy_nwt.loader.workers.start import start_wave
from cupy_nwt.system import usable_cpus

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    from cupy_nwt import DataLoader, IterableDataset, get_worker_info

    class Owned:
        """Sample i and the worker that made it."""
        def __len__(self):
            return 60
        def __getitem__(self, i):
            return np.array([i, get_worker_info().id])

    class Counting(IterableDataset):
        """Worker w of k yields w, w+k, ... below 40; its state is how far it got."""
        def __init__(self):
            self.pos = self.start = 0
        def __iter__(self):
            info = get_worker_info()
            self.pos, self.start = self.start, 0
            while self.pos * info.num_workers + info.id < 40:
                self.pos += 1
                yield np.array([(self.pos - 1) * info.num_workers + info.id])
        def state_dict(self):
            return {"pos": self.pos}
        def load_state_dict(self, sd):
            self.start = sd["pos"]

    if __name__ == "__main__":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        method, out = sys.argv[1], {}
        with DataLoader(Owned(), batch_size=4, num_workers=3, multiprocessing_context=method) as dl:
            out["map"] = []
            for b in dl:
                out["map"].append(b.tolist())
                out["workers"] = len(dl.worker_pids())  # at the last batch: every worker is up
        def run(dl):
            return [b.ravel().tolist() for b in dl]
        out["full"] = run(DataLoader(Counting(), batch_size=3, num_workers=3, multiprocessing_context=method))
        with DataLoader(Counting(), batch_size=3, num_workers=3, multiprocessing_context=method) as dl:
            it = iter(dl)
            out["got"] = [next(it).ravel().tolist() for _ in range(2)]
            state = json.loads(json.dumps(dl.state_dict()))
            it.close()
        with DataLoader(Counting(), batch_size=3, num_workers=3, multiprocessing_context=method) as again:
            again.load_state_dict(state)
            out["rest"] = run(again)
        print(json.dumps(out))
''')


def test_fork_starts_every_worker_at_once_and_the_others_one_per_usable_cpu():
    assert start_wave("fork", 16) == 16
    for method in ("forkserver", "spawn"):
        assert start_wave(method, 16) == min(16, usable_cpus())
        assert start_wave(method, 1) == 1


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="os.sched_setaffinity is Linux's")
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_workers_started_in_waves_make_each_batch_once_in_order_by_its_own_worker(tmp_path, method):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    samples = [row[0] for batch in out["map"] for row in batch]
    assert samples == list(range(60))
    assert [{row[1] for row in batch} for batch in out["map"]] == [{b % 3} for b in range(15)]
    assert out["workers"] == 3
    flat = sorted(x for batch in out["full"] for x in batch)
    assert flat == list(range(40))
    assert out["got"] + out["rest"] == out["full"]


TORCH_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    from cupy_nwt import DataLoader

    class Noisy(torch.utils.data.Dataset):
        """A torch dataset drawing from the worker's seeded torch generator, as random augmentations do."""
        def __len__(self):
            return 48
        def __getitem__(self, i):
            return torch.rand(2) + i

    def draws(method):
        dl = DataLoader(Noisy(), batch_size=4, num_workers=3, multiprocessing_context=method,
                        generator=torch.Generator().manual_seed(7))
        out = []
        for k, batch in enumerate(dl):
            assert isinstance(batch, torch.Tensor), type(batch)
            out.append(batch.tolist())
            if k == 5:
                state = dl.state_dict()  # a break mid-epoch, as a trainer's checkpoint
                break
        again = DataLoader(Noisy(), batch_size=4, num_workers=3, multiprocessing_context=method,
                           generator=torch.Generator().manual_seed(7))
        again.load_state_dict(state)
        return out + [b.tolist() for b in again]

    if __name__ == "__main__":
        torch.set_num_threads(2)  # torch's intra-op pool in the parent, as a training script has it
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        print(json.dumps({m: draws(m) for m in ("fork", sys.argv[1])}))
''')


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="os.sched_setaffinity is Linux's")
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_torch_random_draws_do_not_change_when_workers_start_in_waves(tmp_path, method):
    """Which worker makes a batch decides what its ``torch.rand`` draws: a wave must not change it (fork
    starts every worker at once), nor a resume after a break."""
    pytest.importorskip("torch", reason="torch is a test extra")
    script = tmp_path / "train.py"
    script.write_text(TORCH_SCRIPT, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert len(out["fork"]) == 12  # 6 before the break, the 6 after it from the resumed loader
    assert out[method] == out["fork"]
    assert len({str(b) for b in out["fork"]}) == 12  # the draws differ batch to batch
