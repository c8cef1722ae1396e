"""Every example runs as a user would run it, in a subprocess, so none of them can rot.

Host mode here: the NumPy loop always trains; the JAX step trains where jax is installed (it is
not a CI dependency); the CuPy step trains on a GPU (a ``gpu`` test, so a GPU run's ``pytest -m gpu`` runs it) and,
without one, must say why and exit 0. ``num_workers="auto"`` runs the tuner once per test against
a private ``CUPY_NWT_CACHE_DIR``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import DataLoader, cuda

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = ("--samples", "512", "--epochs", "3", "--batch-size", "64")


def run_example(name: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CUPY_NWT_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def epoch_losses(stdout: str) -> list[float]:
    return [float(m) for m in re.findall(r"^epoch \d+: mean loss ([0-9.]+) over 8 batches$", stdout, re.M)]


def assert_trained(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    losses = epoch_losses(result.stdout)
    assert len(losses) == 3, result.stdout
    assert losses[-1] < losses[0] - 0.1, f"the loss did not fall: {losses}"
    assert re.search(r"num_workers=\d+ \(picked by the tuner\)", result.stdout), result.stdout


def test_every_example_is_tested():
    tested = {"numpy_cpu_loop.py", "jax_dlpack_step.py", "cupy_train_step.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_numpy_cpu_loop_trains(tmp_path):
    result = run_example("numpy_cpu_loop.py", tmp_path, *SMALL)
    assert_trained(result)
    assert "numpy on the CPU" in result.stdout


def test_jax_step_trains_through_dlpack(tmp_path):
    pytest.importorskip("jax", reason="jax is not installed (an optional example, not a CI dependency)")
    result = run_example("jax_dlpack_step.py", tmp_path, *SMALL)
    assert_trained(result)
    assert "batches from the loader on" in result.stdout


@pytest.mark.gpu
def test_cupy_step_trains_on_the_gpu(tmp_path):
    result = run_example("cupy_train_step.py", tmp_path, *SMALL)
    assert_trained(result)
    assert "H2D from" in result.stdout


def test_cupy_step_says_why_it_needs_a_gpu(tmp_path):
    status = cuda.gpu_status()
    if status.available:
        pytest.skip("a GPU is here: test_cupy_step_trains_on_the_gpu runs the example")
    result = run_example("cupy_train_step.py", tmp_path, *SMALL)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"skipped: this example trains on a GPU and there is none usable here ({status.reason})")


def test_numpy_and_jax_examples_compute_the_same_losses(tmp_path):
    """Same data, seeds and model: the JAX step must reproduce the NumPy step's losses."""
    pytest.importorskip("jax", reason="jax is not installed (an optional example, not a CI dependency)")
    np_losses = epoch_losses(run_example("numpy_cpu_loop.py", tmp_path, *SMALL).stdout)
    jax_losses = epoch_losses(run_example("jax_dlpack_step.py", tmp_path, *SMALL).stdout)
    assert len(np_losses) == 3 and jax_losses == pytest.approx(np_losses, abs=2e-3)


# ---------------------------------------------------------------- a torch Dataset, as is


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_torch_dataset_goes_straight_into_the_loader(num_workers):
    torch = pytest.importorskip("torch")
    from torch.utils.data import TensorDataset  # noqa: PLC0415

    images = torch.arange(20 * 4 * 4 * 3, dtype=torch.int64).remainder(251).to(torch.uint8).reshape(20, 4, 4, 3)
    labels = torch.arange(20) % 10
    ds = TensorDataset(images, labels)
    with DataLoader(ds, batch_size=8, shuffle=True, seed=3, num_workers=num_workers, device="cpu") as loader:
        batches = list(loader)
    assert [len(x) for x, _ in batches] == [8, 8, 4]
    order = np.concatenate([y for _, y in batches])
    seen = np.concatenate([x for x, _ in batches])
    assert sorted(order.tolist()) == sorted(labels.tolist())
    # every image arrives intact with its own label, whatever the shuffle order
    index = {bytes(images[i].numpy()): int(labels[i]) for i in range(20)}
    assert [index[bytes(img)] for img in seen] == order.tolist()
    assert seen.dtype == np.uint8 and order.dtype == np.int64


def test_a_torch_dataset_subclass_with_numpy_samples():
    torch = pytest.importorskip("torch")

    class Squares(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int):
            return np.full((2, 2, 3), i * i, np.uint8), i

    with DataLoader(Squares(), batch_size=4, device="cpu") as loader:
        x, y = next(iter(loader))
    assert y.tolist() == [0, 1, 2, 3]
    assert x[:, 0, 0, 0].tolist() == [0, 1, 4, 9]
