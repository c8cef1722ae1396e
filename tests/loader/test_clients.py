"""Clients as their users write them, with only the DataLoader class swapped: a torch loop over NumPy
samples and Python numbers, Hugging Face ``datasets`` in its "numpy" and "torch" formats, and JAX's
tutorial "Training a Simple Neural Network, with PyTorch Data Loading" (a script without a main guard,
two workers, JAX in the parent). Each skips with the reason where its package is absent.

The rule under test (``ring.frameworks.joined_output``): a program that has imported torch when it makes
the loader gets what torch's DataLoader gives from the default collate, tensors for NumPy arrays and
Python numbers; a program without torch gets NumPy; ``output=`` decides when given.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cupy_nwt

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "bench" / "studies" / "does_the_jax_tutorial_keep_pace" / "jax_tutorial.py"


class NumpySamples:
    """What a NumPy pipeline returns: an array, a Python int, a float and a str in a dict."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int):
        return {"x": np.full(3, i, np.float32), "label": i, "weight": i / 2, "name": f"s{i}"}


def same_batches(ours: list, theirs: list, torch) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(b[k], torch.Tensor):
                assert isinstance(a[k], torch.Tensor), k
                assert a[k].dtype == b[k].dtype and torch.equal(a[k].cpu(), b[k]), k
            else:
                assert a[k] == b[k], k


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_torch_program_gets_tensors_from_numpy_samples_and_numbers(num_workers: int) -> None:
    torch = pytest.importorskip("torch", reason="torch is a test-only extra")
    theirs = list(torch.utils.data.DataLoader(NumpySamples(), batch_size=4, num_workers=num_workers))
    ours = list(cupy_nwt.DataLoader(NumpySamples(), batch_size=4, num_workers=num_workers))
    same_batches(ours, theirs, torch)
    unbatched = next(iter(cupy_nwt.DataLoader(NumpySamples(), batch_size=None)))
    assert isinstance(unbatched["x"], torch.Tensor) and unbatched["label"] == 0  # torch's default_convert
    kept = next(iter(cupy_nwt.DataLoader(NumpySamples(), batch_size=4, output="numpy", device="cpu")))
    assert isinstance(kept["x"], np.ndarray)  # output= still decides
    own = next(iter(cupy_nwt.DataLoader(NumpySamples(), batch_size=4, collate_fn=lambda s: np.stack([x["x"] for x in s]))))
    assert isinstance(own, np.ndarray)  # a collate_fn of one's own returns what it returns, as under torch


def test_a_program_without_torch_gets_numpy() -> None:
    code = ("import sys, numpy as np, cupy_nwt\n"
            "class D:\n"
            "    def __len__(self): return 8\n"
            "    def __getitem__(self, i): return np.full(2, i), i\n"
            "x, y = next(iter(cupy_nwt.DataLoader(D(), batch_size=4, num_workers=2)))\n"
            "assert type(x) is np.ndarray and type(y) is np.ndarray and 'torch' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("fmt", ["numpy", "torch"])
def test_hugging_face_datasets_in_a_torch_loop(fmt: str) -> None:
    torch = pytest.importorskip("torch", reason="torch is a test-only extra")
    datasets = pytest.importorskip("datasets", reason="Hugging Face datasets is a test-only extra")
    ds = datasets.Dataset.from_dict({"pixels": [[float(i)] * 4 for i in range(12)], "label": list(range(12)),
                                     "text": [f"t{i}" for i in range(12)]}).with_format(fmt)
    theirs = list(torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False))
    ours = list(cupy_nwt.DataLoader(ds, batch_size=4, shuffle=False, num_workers=2))
    same_batches(ours, theirs, torch)
    model = torch.nn.Linear(4, 2)
    for batch in ours:  # the loop as a torch user writes it
        loss = model(batch["pixels"].to("cpu").float()).sum() + batch["label"].to("cpu").sum()
        loss.backward()


@pytest.mark.parametrize("persistent", [False, True])
def test_a_hugging_face_stream_left_to_the_loader_gives_every_sample_once_in_a_new_order_each_epoch(persistent):
    """The loop calls no ``set_epoch``: the loader tells the stream. Its epoch lives in memory the workers share,
    and epochs ran 0, 1, 1, 2 (the workers' set went back to the main process and was taken for the loop's)."""
    pytest.importorskip("torch", reason="Hugging Face's streams are torch IterableDatasets")
    datasets = pytest.importorskip("datasets", reason="Hugging Face datasets is a test-only extra")
    ds = datasets.Dataset.from_dict({"x": list(range(32))}).to_iterable_dataset(num_shards=4)
    ds = ds.shuffle(seed=0, buffer_size=4)
    loader = cupy_nwt.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=persistent)
    orders = [[x for b in loader for x in b["x"].tolist()] for _ in range(4)]
    loader.close()
    assert all(sorted(order) == list(range(32)) for order in orders)
    assert len({tuple(order) for order in orders}) == 4, orders


def test_jax_tutorial_runs_unchanged_with_its_workers(tmp_path: Path) -> None:
    pytest.importorskip("jax", reason="JAX is a test-only extra")
    pytest.importorskip("torch", reason="the tutorial loads with torch.utils.data")
    pytest.importorskip("PIL", reason="the tutorial's samples are PIL images")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EPOCHS": "2", "N_TRAIN": "1024", "N_TEST": "256"}
    proc = subprocess.run([sys.executable, str(TUTORIAL)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split(" in ")[0] for line in lines if line.startswith("Epoch")] == ["Epoch 0", "Epoch 1"]
    accuracy = [float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("Training set accuracy")]
    assert len(accuracy) == 2 and all(0 <= a <= 1 for a in accuracy)
    assert "Traceback" not in proc.stderr
