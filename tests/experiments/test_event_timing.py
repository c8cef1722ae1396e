"""The one CUDA-event window (``timing.event_seconds``) and its users, against a fake CuPy.

Without a GPU the event code never runs; the fake logs every event, wait and sync, with the stream
it went to, and keeps a device clock that only the work moves. So these tests pin what a GPU run
would do: which events are recorded on which streams, in what order, and that the end event is
waited for before its time is read.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_fake import FakeArray, FakeCupy

from cupy_nwt import cuda
from cupy_nwt.experiments import overlap, timing
from cupy_nwt.experiments.step_sim import SimulatedStep


class FakeStream:
    def __init__(self, fake: TimedFakeCupy, name: str) -> None:
        self.fake, self.name = fake, name

    def wait_event(self, event: FakeEvent) -> None:
        self.fake.log.append(("wait", self.name, event.name))

    def synchronize(self) -> None:
        self.fake.log.append(("sync stream", self.name))


class FakeEvent:
    """Stamped with the fake device clock when recorded, as if every stream were already idle."""

    def __init__(self, fake: TimedFakeCupy, timing: bool) -> None:
        self.fake, self.timing = fake, timing
        self.name = f"e{len(fake.made)}"
        self.at: float | None = None
        self.done = False
        fake.made.append(self)

    def record(self, stream: FakeStream) -> None:
        self.at = self.fake.now_ms
        self.fake.log.append(("record", self.name, stream.name))

    def synchronize(self) -> None:
        self.done = True
        self.fake.log.append(("sync event", self.name))


class TimedFakeCupy(FakeCupy):
    """FakeCupy plus streams, events, elapsed time, and a spin kernel that moves the device clock."""

    def __init__(self) -> None:
        super().__init__()
        self.now_ms = 0.0
        self.log: list[tuple] = []
        self.made: list[FakeEvent] = []
        self.current_stream = FakeStream(self, "current")
        self.cuda.Event = lambda disable_timing=False: FakeEvent(self, not disable_timing)
        self.cuda.get_current_stream = lambda: self.current_stream
        self.cuda.get_elapsed_time = self._elapsed

    def _elapsed(self, start: FakeEvent, end: FakeEvent) -> float:
        assert start.timing and end.timing, "elapsed time of an event made with timing disabled"
        assert end.done, "CUDA answers cudaErrorNotReady until the end event has completed"
        self.log.append(("elapsed", start.name, end.name))
        return end.at - start.at

    def work(self, label: str, ms: float):
        def run(*_stream) -> None:
            self.log.append(("work", label))
            self.now_ms += ms

        return run

    def RawKernel(self, source, name):
        def launch(grid, block, args):
            self.log.append(("spin", int(args[1])))
            self.now_ms += int(args[1]) / 1e6

        return launch


@pytest.fixture
def fake(monkeypatch) -> TimedFakeCupy:
    f = TimedFakeCupy()
    monkeypatch.setattr(cuda, "_cupy", lambda: f)
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 1))
    return f


def test_one_stream_window_brackets_the_work_and_waits_for_its_end(fake):
    s = FakeStream(fake, "s")
    assert timing.event_seconds(fake.work("copy", 3.0), s) == pytest.approx(0.003)
    assert fake.log == [("record", "e0", "s"), ("work", "copy"), ("record", "e1", "s"), ("sync event", "e1"),
                        ("elapsed", "e0", "e1")]


def test_joined_streams_wait_for_the_start_and_the_end_waits_for_them(fake):
    main, a, b = (FakeStream(fake, n) for n in ("main", "a", "b"))
    seconds = timing.event_seconds(fake.work("chunks", 5.0), main, [main, a, b])  # main itself is not joined
    assert seconds == pytest.approx(0.005)
    assert fake.log == [
        ("record", "e0", "main"), ("wait", "a", "e0"), ("wait", "b", "e0"),
        ("work", "chunks"),
        ("record", "e2", "a"), ("wait", "main", "e2"), ("record", "e3", "b"), ("wait", "main", "e3"),
        ("record", "e1", "main"), ("sync event", "e1"), ("elapsed", "e0", "e1"),
    ]
    assert [e.timing for e in fake.made] == [True, True, False, False]  # the join events take no timestamps


def test_a_window_can_also_give_each_joined_streams_own_end(fake):
    main, a, b = (FakeStream(fake, n) for n in ("main", "a", "b"))
    total, each = timing.event_seconds_each(fake.work("both", 4.0), main, [main, a, b])
    assert total == pytest.approx(0.004) and each == pytest.approx((0.004, 0.004))  # main's own end is the window's
    assert [e.timing for e in fake.made] == [True, True, True, True]
    assert ("sync event", "e1") in fake.log and fake.log.index(("sync event", "e1")) < fake.log.index(
        ("elapsed", "e0", "e2"))  # the stream ends are read once the window has ended
    assert [x for x in fake.log if x[0] == "elapsed"] == [("elapsed", "e0", "e1"), ("elapsed", "e0", "e2"),
                                                         ("elapsed", "e0", "e3")]


def test_device_time_warms_up_syncs_then_gives_each_call_its_own_window(fake):
    s = FakeStream(fake, "s")
    took = iter([1.0, 1.0, 2.0, 4.0, 8.0])
    calls = []

    def fn(stream):
        calls.append(stream)
        fake.log.append(("work",))
        fake.now_ms += next(took)

    assert timing.device_time(fn, repeats=3, warmup=2, stream=s) == pytest.approx([0.002, 0.004, 0.008])
    assert calls == [s] * 5
    expected = [("work",), ("work",), ("sync stream", "s")]
    for start, end in (("e0", "e1"), ("e2", "e3"), ("e4", "e5")):
        expected += [("record", start, "s"), ("work",), ("record", end, "s"), ("sync event", end),
                     ("elapsed", start, end)]
    assert fake.log == expected


def test_device_time_defaults_to_the_current_stream(fake):
    timing.device_time(fake.work("w", 1.0), repeats=1, warmup=0)
    assert ("sync stream", "current") in fake.log and ("record", "e0", "current") in fake.log


def test_overlap_run_starts_from_zeros_and_joins_only_the_async_streams(fake):
    main, a, b = (FakeStream(fake, n) for n in ("main", "a", "b"))
    host = np.full(8, 7.0, np.float32)
    seen = []

    def work() -> None:
        seen.append(host.copy())
        fake.now_ms += 2.0

    assert overlap._timed_run(work, host, main, [main])[0] == pytest.approx(0.002)  # sequential: one stream
    assert not any(e[0] == "wait" for e in fake.log)
    fake.log.clear()
    assert overlap._timed_run(work, host, main, [a, b])[0] == pytest.approx(0.002)  # async: one stream per chunk
    assert [e for e in fake.log if e[0] == "wait"] == [("wait", "a", "e2"), ("wait", "b", "e2"),
                                                       ("wait", "main", "e4"), ("wait", "main", "e5")]
    assert all(not x.any() for x in seen)


def test_simulated_step_times_its_spin_on_the_current_stream(fake):
    step = SimulatedStep(0.002)  # compiles with a 1 ns spin first
    fake.log.clear()
    batch = (FakeArray(4, np.uint8, 0), FakeArray(4, np.int64, 0))
    assert step(batch) == pytest.approx(0.002)
    assert fake.log == [("record", "e2", "current"), ("spin", 2_000_000), ("record", "e3", "current"),
                        ("sync event", "e3"), ("elapsed", "e2", "e3")]


def test_queued_samples_start_after_a_hold_longer_than_their_issue_and_report_issue_apart(fake):
    """Launching from Python takes about as long as a short kernel runs: each sample is queued behind a
    spin first, so its window holds the GPU's time only, and the host's issue time comes back on its own."""
    s = FakeStream(fake, "s")
    held = []

    def hold(stream, seconds):
        held.append(seconds)
        fake.log.append(("hold", stream.name))
        fake.now_ms += 1e3 * seconds  # the GPU spins: none of it may reach the window

    q = timing.queued_time(fake.work("stage", 0.25), hold, repeats=2, warmup=1, stream=s)
    assert q.device == pytest.approx((0.00025, 0.00025))
    assert len(q.issue) == 2 and all(t >= 0 for t in q.issue)
    assert held == [q.held_seconds] * 2 and q.held_seconds >= timing.HOLD_MARGIN_S
    assert q.overran == 0
    assert fake.log == [("work", "stage"), ("sync stream", "s"),
                        ("hold", "s"), ("record", "e0", "s"), ("work", "stage"), ("record", "e1", "s"),
                        ("sync event", "e1"), ("elapsed", "e0", "e1"),
                        ("hold", "s"), ("record", "e2", "s"), ("work", "stage"), ("record", "e3", "s"),
                        ("sync event", "e3"), ("elapsed", "e2", "e3")]


def test_an_overlap_run_behind_a_hold_opens_its_window_after_the_hold_on_every_stream(fake):
    main, a, b = (FakeStream(fake, n) for n in ("main", "a", "b"))
    host = np.zeros(8, np.float32)

    def hold() -> None:
        fake.log.append(("hold", "main"))
        fake.now_ms += 5.0

    seconds, issued = overlap._timed_run(fake.work("chunks", 2.0), host, main, [a, b], hold)
    assert seconds == pytest.approx(0.002) and issued >= 0
    assert fake.log[:4] == [("hold", "main"), ("record", "e0", "main"), ("wait", "a", "e0"), ("wait", "b", "e0")]


def test_queued_samples_that_outlast_the_hold_are_counted():
    q = timing.QueuedTimes(device=(1e-3, 1e-3, 1e-3), issue=(1e-4, 3e-3, 5e-4), held_seconds=1e-3)
    assert q.overran == 1
