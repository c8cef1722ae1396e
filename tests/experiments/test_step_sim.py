"""The simulated training step's bookkeeping: idle fraction, timing window, warm-up, running dry."""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from cupy_nwt.experiments.step_sim import FeedResult, SimulatedStep, StepMarks, feed, feed_queued, idle_fraction


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
    assert r.take_seconds == pytest.approx(0.010)  # the host's 1 ms a batch over the 10 timed steps


class TimelineGpu:
    """One stream of fixed-length steps on a device timeline, driven by a ``FakeClock`` host.

    Called, a step is launched and waited for (the synced loop); enqueued, it starts when both the
    host has launched it and the previous step has ended, and the host goes on at once. Its marks
    are the device times it started and ended; ``in_flight`` records, at each launch, how many
    earlier steps had not yet ended.
    """

    LAUNCH_S = 20e-6

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds
        self.free_at = 0.0  # when the device finishes what is queued
        self.ends: list[float] = []
        self.in_flight: list[int] = []
        self.seen: list = []

    def enqueue(self, batch) -> StepMarks:
        self.seen.append(batch)
        self.clock.now += self.LAUNCH_S
        self.in_flight.append(sum(1 for e in self.ends if e > self.clock.now))
        start = max(self.free_at, self.clock.now)
        self.free_at = start + self.seconds
        self.ends.append(self.free_at)
        return StepMarks(start, self.free_at)

    def wait(self, marks: StepMarks) -> None:
        self.clock.now = max(self.clock.now, marks.end)

    def elapsed(self, start: float, end: float) -> float:
        self.clock.now = max(self.clock.now, end)
        return end - start

    def __call__(self, batch) -> float:
        marks = self.enqueue(batch)
        self.wait(marks)
        return self.elapsed(marks.start, marks.end)

    def sync(self) -> None:
        self.clock.now = max(self.clock.now, self.free_at)


def handing_over(clock: FakeClock, seconds: float, gpu: TimelineGpu | None = None):
    """Endless batches, each costing the host ``seconds``; with ``gpu``, after waiting for its queue
    (a blocking copy from pageable memory)."""
    for i in itertools.count():
        if gpu is not None:
            gpu.sync()
        clock.now += seconds
        yield i


def test_queued_step_hides_a_hand_over_shorter_than_the_step():
    clock = FakeClock()
    gpu = TimelineGpu(clock, 0.005)
    synced = feed(handing_over(clock, 0.0005), gpu, steps=50, warmup=5, batch_size=8, label="synced",
                  step_seconds=0.005, clock=clock)
    queued = feed_queued(handing_over(clock, 0.0005), gpu, steps=50, warmup=5, batch_size=8, label="queued",
                         step_seconds=0.005, clock=clock)
    assert synced.idle_fraction == pytest.approx((0.0005 + TimelineGpu.LAUNCH_S) / (0.0055 + TimelineGpu.LAUNCH_S))
    assert queued.idle_fraction == pytest.approx(0.0, abs=1e-9)
    assert queued.wall_seconds == pytest.approx(50 * 0.005) and queued.kernel_seconds == pytest.approx(50 * 0.005)
    assert queued.samples_per_second == pytest.approx(8 / 0.005)
    assert (queued.loop, queued.queue_depth, synced.loop) == ("queued", 2, "synced")
    assert queued.to_dict()["loop"] == "queued" and queued.startup_seconds == pytest.approx(0.0005)
    assert queued.take_seconds == pytest.approx(50 * 0.0005) and synced.take_seconds == pytest.approx(50 * 0.0005)


def test_queued_step_idles_by_what_the_hand_over_exceeds_the_step():
    clock = FakeClock()
    gpu = TimelineGpu(clock, 0.005)
    r = feed_queued(handing_over(clock, 0.008), gpu, steps=40, warmup=5, batch_size=8, label="slow loader",
                    step_seconds=0.005, clock=clock)
    assert r.idle_fraction == pytest.approx(0.003 / 0.008, rel=0.02)


def test_a_blocking_copy_makes_the_queued_loop_wait_as_the_synced_one_does():
    clock = FakeClock()
    gpu = TimelineGpu(clock, 0.005)
    r = feed_queued(handing_over(clock, 0.0005, gpu), gpu, steps=40, warmup=5, batch_size=8, label="blocking",
                    step_seconds=0.005, clock=clock)
    assert r.idle_fraction == pytest.approx(0.0005 / 0.0055, rel=0.05)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_queued_loop_keeps_at_most_depth_steps_in_flight_and_takes_batches_in_order(depth):
    clock = FakeClock()
    gpu = TimelineGpu(clock, 0.005)
    r = feed_queued(handing_over(clock, 0.0001), gpu, steps=20, warmup=3, batch_size=8, label="q",
                    step_seconds=0.005, depth=depth, clock=clock)
    assert gpu.seen == list(range(23))
    assert max(gpu.in_flight) == depth - 1  # the earlier steps unfinished when one more is launched
    assert r.queue_depth == depth and r.steps == 20
    assert clock.now >= gpu.free_at  # the loop returns with every step done


def test_queued_loop_checks_its_options_and_says_when_the_loader_runs_dry():
    gpu = TimelineGpu(FakeClock(), 0.001)
    with pytest.raises(ValueError, match="depth >= 1"):
        feed_queued(iter(range(9)), gpu, steps=2, warmup=0, batch_size=1, label="x", step_seconds=0.001, depth=0)
    with pytest.raises(ValueError, match="ran out of batches"):
        feed_queued(iter(range(3)), gpu, steps=5, warmup=0, batch_size=1, label="short", step_seconds=0.001)


def study(monkeypatch):
    """The gpu_feed study's module (its folder put on sys.path)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench" / "studies"
                                    / "does_the_gpu_wait_for_batches"))
    import gpu_feed

    return gpu_feed


def test_gpu_feed_runs_both_loops_on_one_loader_and_puts_them_side_by_side(monkeypatch):
    gpu_feed = study(monkeypatch)
    clock = FakeClock()
    gpu = TimelineGpu(clock, 0.005)
    got = gpu_feed.measure(handing_over(clock, 0.0005), gpu, ["synced", "queued"], steps=30, warmup=4, depth=2,
                           batch_size=16, label="cupy_nwt", step_seconds=0.005, clock=clock)
    assert list(got) == ["synced", "queued"]
    assert gpu.seen == list(range(2 * 34))  # one loader, the queued loop going on where the synced one ended
    assert got["queued"].idle_fraction < 0.01 < got["synced"].idle_fraction
    row = {"workload": "numba-array", "num_workers": 4, "mode": "cupy_nwt", "startup_seconds": 1.5,
           "loops": {k: r.to_dict() for k, r in got.items()}}
    cells = gpu_feed.row_cells(row, list(got))
    assert cells[:3] == ["numba-array", 4, "cupy_nwt"] and cells[-1] == 1.5
    assert cells[4] == f"{got['synced'].idle_fraction:.1%}" and cells[7] == "0.0%"
    assert cells[5] == cells[8] == "0.50"  # the host's 0.5 ms a take, in both loops
    with pytest.raises(ValueError, match="unknown loop"):
        gpu_feed.measure(iter(()), gpu, ["eager"], steps=1, warmup=0, depth=2, batch_size=1, label="x",
                         step_seconds=0.005)


def test_gpu_feed_main_writes_both_loops_of_every_mode_side_by_side(tmp_path, monkeypatch, capsys):
    """The whole script on stand-ins: a timeline for the GPU, a fixed hand-over for each mode's loader."""
    gpu_feed = study(monkeypatch)
    clock = FakeClock()
    closed = []

    def batches(mode, workload, workers, batch_size, seed):
        stream = handing_over(clock, 0.001 if mode == "cupy_nwt" else 0.002)
        return types.SimpleNamespace(close=lambda: closed.append(mode)), stream

    measure = gpu_feed.measure
    monkeypatch.setattr(gpu_feed, "measure", functools.partial(measure, clock=clock))
    monkeypatch.setattr(gpu_feed, "batches", batches)
    monkeypatch.setattr(gpu_feed, "make_workloads", lambda root, **kw: [types.SimpleNamespace(name="numba-array")])
    monkeypatch.setattr(gpu_feed, "SimulatedStep", lambda seconds: TimelineGpu(clock, seconds))
    monkeypatch.setattr(gpu_feed, "first_loader_seconds", lambda workload, batch_size: 4.5)
    monkeypatch.setattr(gpu_feed, "torch_cuda_reason", lambda: "torch has no usable CUDA")
    monkeypatch.setattr(gpu_feed.cuda, "require_gpu", lambda: None)
    monkeypatch.setattr(gpu_feed.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(gpu_feed.cuda, "device_info", lambda i: {"index": i, "name": "stand-in"})
    assert gpu_feed.main(["--workers", "4", "--steps", "20", "--warmup", "3", "--out-dir", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("gpu_feed-*.json")).read_text())
    assert doc["first_loader_seconds"] == 4.5
    assert doc["skipped"] == {"torch": "torch has no usable CUDA", "torch-nopin": "torch has no usable CUDA"}
    assert [r["mode"] for r in doc["results"]] == ["cupy_nwt", "cupy_nwt-noprefetch"] == closed
    for row in doc["results"]:
        synced, queued = row["loops"]["synced"], row["loops"]["queued"]
        assert (synced["loop"], queued["loop"], queued["queue_depth"]) == ("synced", "queued", 2)
        assert synced["steps"] == queued["steps"] == 20 and row["startup_seconds"] == synced["startup_seconds"]
        assert queued["idle_fraction"] == pytest.approx(0.0, abs=1e-9) and synced["idle_fraction"] > 0.1
        assert queued["take_seconds"] == pytest.approx(20 * (0.001 if row["mode"] == "cupy_nwt" else 0.002))
    out = capsys.readouterr().out
    assert "GPU idle synced" in out and "GPU idle queued" in out and "0.0%" in out
    assert "take ms queued" in out and "1.00" in out and "2.00" in out  # the host's ms a batch, per mode


def test_gpu_feed_refuses_bad_loops_in_one_line():
    root = Path(__file__).resolve().parents[2]
    script = root / "bench" / "studies" / "does_the_gpu_wait_for_batches" / "gpu_feed.py"
    env = {"CUPY_NWT_DISABLE_GPU": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}
    for bad in (["--loops", "eager"], ["--queue-depth", "0"]):
        proc = subprocess.run([sys.executable, str(script), *bad], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


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


@pytest.mark.gpu
def test_enqueued_steps_return_at_once_and_their_events_time_the_step():
    from cupy_nwt import cuda

    step = SimulatedStep(0.02)
    batch = cuda.device_empty(16)
    marks = step.enqueue(batch)
    assert not marks.end.done  # 20 ms of spinning cannot be over when the launch returns
    step.wait(marks)
    assert marks.end.done and step.elapsed(marks.start, marks.end) == pytest.approx(0.02, rel=0.25)
    r = feed_queued(itertools.repeat(batch), SimulatedStep(0.002), steps=20, warmup=2, batch_size=1, label="gpu",
                    step_seconds=0.002)
    assert r.kernel_seconds == pytest.approx(20 * 0.002, rel=0.25) and r.wall_seconds >= r.kernel_seconds


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

    from bench import workloads as loader_compare

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
