"""Torch's wording where users match on it: each of cupy_nwt's messages holds torch's sentence first,
then what cupy_nwt says beyond it. The same case runs on both loaders (as ``test_parity.py`` does)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from parity_backends import is_torch

import cupy_nwt

pytestmark = pytest.mark.usefixtures("worker_type")

try:
    import torch
    import torch.utils.data as tud
except ImportError:
    torch = tud = None

class Slow:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        time.sleep(1.0)
        return i


class Plain(Slow):
    def __getitem__(self, i: int) -> int:
        return i


class KilledAt2(Slow):
    def __getitem__(self, i: int) -> int:
        if i == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


class Nested(Slow):
    def __getitem__(self, i: int):
        return torch.nested.nested_tensor([torch.ones(i + 1), torch.ones(2)])


def test_a_timeout(backend):
    with pytest.raises(RuntimeError) as ei:
        list(backend(Slow(), batch_size=2, num_workers=1, timeout=0.2))
    assert str(ei.value).startswith("DataLoader timed out after 0.2 seconds")
    if not is_torch(backend):
        assert isinstance(ei.value, cupy_nwt.LoaderTimeoutError) and "cupy_nwt: no batch from the workers" in str(ei.value)


def test_a_negative_num_workers(backend):
    with pytest.raises(ValueError) as ei:
        backend(Plain(), num_workers=-1)
    assert str(ei.value).startswith("num_workers option should be non-negative; use num_workers=0 to disable "
                                    "multiprocessing.")
    if not is_torch(backend):
        assert isinstance(ei.value, cupy_nwt.ArgumentError) and "cupy_nwt: got -1" in str(ei.value)


def test_too_many_workers(backend, worker_type):
    many = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) + 1
    with pytest.warns(UserWarning) as caught:
        loader = backend(Plain(), batch_size=2, num_workers=many)
        next(iter(loader))  # torch warns as its workers start, cupy_nwt when built
    said = [str(w.message) for w in caught if "excessive worker creation" in str(w.message)]
    assert said and said[0].startswith(f"This DataLoader will create {many} worker processes in total.")
    assert "excessive worker creation might get DataLoader running slow or even freeze" in said[0]
    if not is_torch(backend):
        kind = "threads" if worker_type == "thread" else "processes"
        assert f"cupy_nwt: its {many} worker {kind} will share the {many - 1} CPUs this process may use" in said[0]


@pytest.mark.skipif(torch is None, reason="nested tensors are torch's")
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("num_workers", [0, 1])
def test_nested_tensors_in_the_default_collate(backend, num_workers):
    with pytest.raises(RuntimeError) as ei:
        next(iter(backend(Nested(), batch_size=2, num_workers=num_workers)))
    sentence = ("Batches of nested tensors are not currently supported by the default collate_fn; please provide a "
                "custom collate_fn to handle them appropriately.")
    assert sentence in str(ei.value)
    if not is_torch(backend):
        assert f"{sentence} cupy_nwt: sample index 0 holds a nested tensor" in str(ei.value)


TORCH_KILLED = """
import torch.multiprocessing, torch.utils.data as tud, test_parity_messages as t
torch.multiprocessing.set_sharing_strategy("file_system")
try:
    list(tud.DataLoader(t.KilledAt2(), batch_size=1, num_workers=1))
except RuntimeError as exc:
    print(exc)
"""


@pytest.mark.process_only("a thread cannot be killed apart from its process")
def test_a_worker_killed_by_a_signal(backend):
    if is_torch(backend):  # in a child: torch's SIGCHLD handler would raise again later in this session
        # torch hands each batch over a socket to the worker when sharing by file descriptor; a worker killed
        # before that exchange ends gives ConnectionResetError instead of the message under test
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
        run = subprocess.run([sys.executable, "-c", TORCH_KILLED], capture_output=True, text=True, env=env, timeout=120)
        text = run.stdout + run.stderr  # torch's handler may raise outside the try: its traceback then
    else:
        with pytest.raises(RuntimeError) as ei:
            list(backend(KilledAt2(), batch_size=1, num_workers=1))
        text = str(ei.value)
    found = re.match(r"DataLoader worker \(pid (\d+)\) is killed by signal: Killed\.", text)
    if is_torch(backend):  # torch's SIGCHLD handler says it, unless its periodic check of the workers comes first
        assert re.search(r"DataLoader worker \(pid(\(s\))? \d+\) (is killed by signal: Killed\.|exited unexpectedly)",
                         text), text
        return
    assert found is not None, text
    if not is_torch(backend):
        err = ei.value
        assert isinstance(err, cupy_nwt.WorkerDiedError) and int(found.group(1)) == err.pid
        assert "cupy_nwt: loader worker 0" in text and err.signal_name == "SIGKILL"
        assert np.asarray(err.exitcode) == -signal.SIGKILL
