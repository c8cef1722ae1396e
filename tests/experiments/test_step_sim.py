"""The simulated training step's bookkeeping: idle fraction, timing window, warm-up, running dry."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from cupy_nwt.experiments.step_sim import FeedResult, SimulatedStep, feed, idle_fraction


def test_idle_fraction():
    assert idle_fraction(0.95, 1.0) == pytest.approx(0.05)
    assert idle_fraction(1.0, 1.0) == 0.0
    assert idle_fraction(1.2, 1.0) == 0.0  # event and host clocks disagree slightly: never negative
    with pytest.raises(ValueError):
        idle_fraction(1.0, 0.0)


class FakeClock:
    """Host time that moves only when the fake loader or step says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_feed_times_only_the_steps_after_warmup_and_counts_the_wait():
    clock = FakeClock()
    seen = []

    def loader():
        for i in itertools.count():
            clock.now += 0.001  # 1 ms waiting for each batch
            yield i

    def step(batch):
        seen.append(batch)
        clock.now += 0.004  # a 4 ms step, all of it on the device
        return 0.004

    r = feed(loader(), step, steps=10, warmup=3, batch_size=128, label="fake", step_seconds=0.004, clock=clock)
    assert seen == list(range(13))
    assert r.wall_seconds == pytest.approx(0.050) and r.kernel_seconds == pytest.approx(0.040)
    assert r.idle_fraction == pytest.approx(0.2)
    assert r.samples_per_second == pytest.approx(10 * 128 / 0.050)
    assert r.to_dict()["idle_fraction"] == pytest.approx(0.2)


def test_feed_says_when_the_loader_runs_dry():
    with pytest.raises(ValueError, match="ran out of batches"):
        feed(iter(range(5)), lambda b: 0.001, steps=10, warmup=0, batch_size=1, label="short", step_seconds=0.001)
    with pytest.raises(ValueError, match="steps >= 1"):
        feed(iter(()), lambda b: 0.0, steps=0, warmup=0, batch_size=1, label="x", step_seconds=0.001)


def test_result_is_a_frozen_record():
    r = FeedResult("m", 2, 4, 1.0, 0.5, 0.25)
    with pytest.raises(AttributeError):
        r.steps = 3  # type: ignore[misc]


def test_gpu_feed_without_gpu_is_one_line_and_exit_3():
    root = Path(__file__).resolve().parents[2]
    script = root / "bench" / "studies" / "does_the_gpu_wait_for_batches" / "gpu_feed.py"
    env = {"CUPY_NWT_DISABLE_GPU": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 3
    assert proc.stderr.strip().count("\n") == 0 and "GPU" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.gpu
def test_simulated_step_lasts_what_it_was_asked():
    from cupy_nwt import cuda

    step = SimulatedStep(0.002)
    batch = cuda.device_empty((4, 4))
    took = sorted(step(batch) for _ in range(9))[4]
    assert took == pytest.approx(0.002, rel=0.25)


@pytest.mark.gpu
def test_a_5ms_step_lasts_5ms_by_cuda_events_even_from_idle_clocks():
    """No warm-up of the GPU first: a cycle-counted spin would run long or short while clocks ramp."""
    from cupy_nwt import cuda

    step = SimulatedStep(0.005)
    batch = cuda.device_empty(16)
    took = [step(batch) for _ in range(5)]
    assert all(0.0045 <= t <= 0.0055 for t in took), took


def test_feed_keeps_the_loaders_start_up_out_of_the_steady_state():
    """Workers started by forkserver take most of a second: that wait is start-up, not GPU idle a step."""
    clock = FakeClock()

    def loader():
        clock.now += 0.8  # the workers start
        for i in itertools.count():
            clock.now += 0.0005
            yield i

    def step(batch):
        clock.now += 0.005
        return 0.005

    for warmup in (0, 2):
        r = feed(loader(), step, steps=20, warmup=warmup, batch_size=8, label="slow start", step_seconds=0.005,
                 clock=clock)
        assert r.startup_seconds == pytest.approx(0.8005)
        assert r.idle_fraction < 0.1  # 0.5 ms waits around 5 ms steps, whatever the start-up took
        assert r.to_dict()["startup_seconds"] == pytest.approx(0.8005)


@pytest.mark.parametrize("mode", ["cupy_nwt", "cupy_nwt-noprefetch", "torch", "torch-nopin"])
def test_gpu_feed_loaders_keep_their_workers_across_epochs(mode, tmp_path, monkeypatch):
    """Restarting workers at each epoch boundary (0.8 s by forkserver) would read as GPU idle time."""
    study = Path(__file__).resolve().parents[2] / "bench" / "studies" / "does_the_gpu_wait_for_batches"
    monkeypatch.syspath_prepend(str(study))
    if mode.startswith("torch"):
        pytest.importorskip("torch", reason="the torch modes need torch")
    from cupy_nwt import cuda

    if mode == "cupy_nwt" and not cuda.gpu_status().available:
        pytest.skip(f"a loader with device='cuda' needs a GPU: {cuda.gpu_status().reason}")
    import gpu_feed
    import loader_compare

    workload = next(w for w in loader_compare.make_workloads(tmp_path, decode_images=8, array_images=64)
                    if w.name == "numba-array")
    loader, stream = gpu_feed.batches(mode, workload, 2, 16, seed=0)
    try:
        assert loader.persistent_workers is True and loader.num_workers == 2
    finally:
        stream.close()
        if hasattr(loader, "close"):
            loader.close()
    loader, stream = gpu_feed.batches(mode, workload, 0, 16, seed=0)  # no workers: nothing to keep
    stream.close()
    assert loader.persistent_workers is False
