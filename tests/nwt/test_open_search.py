"""The default (open) search looks where the best count is: up to the usable CPUs, further while it rises.

On a 2-CPU machine the search used to measure counts 0 and 1 only (the paper's N-1), while 2 workers
were nearly twice as fast. These cost curves are simulated (``measure=``), with the machine's CPU
count set through ``cupy_nwt.system.usable_cpus``; no timing is asserted.
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import psutil
import pytest
from test_fast_search_noisy_trials import Hiccups
from test_trials_whole_rounds import Waves
from test_tuner import CostModel, _curve

from cupy_nwt.cli.explain import tune_summary
from cupy_nwt.data.datasets import ArrayDataset
from cupy_nwt.nwt import measure as nwt_measure
from cupy_nwt.nwt.fast import open_cap
from cupy_nwt.nwt.tune import tune_num_workers

CPUS = (1, 2, 3, 4, 8, 16)


@pytest.fixture
def cpus(monkeypatch):
    def set_cpus(n: int) -> int:
        monkeypatch.setattr("cupy_nwt.system.usable_cpus", lambda: n)
        return n
    return set_cpus


def rising_past(cpus: int, rng: random.Random):
    """Throughput that keeps rising past the core count (workers waiting on I/O), up to k, then a mild slope."""
    k, c, slope = rng.randint(cpus + 1, 3 * cpus + 2), rng.uniform(0.01, 0.1), rng.uniform(0, 0.03)
    return lambda w: c / min(w + 0.5, k + 0.5) * (1 + slope * max(0, w - k))


def _shape(kind: str, cpus: int, rng: random.Random):
    return rising_past(cpus, rng) if kind == "rising_past" else _curve(kind, cpus + 1, rng)


def _judge(t, cpus: int, result, paper_measure) -> tuple[float, float]:
    """The pick's share of the best count anywhere up to the cap, and its cost against Algorithm 1
    over the counts the open search ended up spanning."""
    best = min(t(w) for w in range(open_cap(cpus) + 1))
    paper = tune_num_workers(max_workers=result.max_workers, alpha=0.0, strategy="paper", progress=False,
                             measure=paper_measure)
    return best / t(result.best_workers), result.search_seconds / paper.search_seconds


@pytest.mark.parametrize("kind", ["rising_past", "flat", "valley", "falling", "rising"])
def test_open_search_finds_the_best_count_past_the_cpus_on_exact_curves(kind, cpus):
    for n in CPUS:
        cpus(n)
        for seed in range(4):
            t = _shape(kind, n, random.Random(seed * 7919 + n))
            calls = CostModel(t, 0.0, (0.0, 0.0), seed)
            seen = []
            r = tune_num_workers(strategy="fast", progress=False,
                                 measure=lambda w, i, u, m=calls: seen.append(w) or m(w, i, u))
            share, cost = _judge(t, n, r, CostModel(t, 0.0, (0.0, 0.0), seed + 1))
            where = f"{kind} cpus={n} seed={seed}: pick {r.best_workers}, searched 0..{r.max_workers - 1}"
            assert n in seen, where  # at least up to the usable CPUs, whatever the curve did before
            assert share >= 0.95, where
            if n >= 4:
                assert cost <= 0.30, where
            if kind in ("flat", "rising"):  # nothing gained past the CPUs: no count above them measured
                assert max(seen) == n and "stopped rising" in r.search_end, where


def test_a_curve_rising_past_the_cpus_is_followed_and_the_old_bound_would_miss_it(cpus):
    """2 CPUs, the best at 6 workers (the loader waits on I/O): the bounded search, counts 0..1 as
    Algorithm 1 has them, reaches under 30% of it."""
    cpus(2)
    t = lambda w: 0.06 / min(w + 0.5, 6.5) * (1 + 0.02 * max(0, w - 6))  # noqa: E731
    r = tune_num_workers(strategy="fast", progress=False, measure=CostModel(t))
    assert r.best_workers == 6 and r.max_workers - 1 == open_cap(2) and r.usable_cpus == 2
    assert "stopped rising" in r.search_end
    bounded = tune_num_workers(max_workers=2, strategy="fast", progress=False, measure=CostModel(t))
    assert t(6) / t(bounded.best_workers) < 0.3


def test_an_ever_rising_curve_stops_at_the_cap(cpus):
    cpus(2)
    r = tune_num_workers(strategy="fast", progress=False, measure=CostModel(lambda w: 1.0 / (w + 1)))
    assert r.max_workers - 1 == open_cap(2) == 8 and r.best_workers == 8 and "cap" in r.search_end


def test_memory_bounds_how_far_the_search_goes(cpus):
    """1 GB + 100 MB a worker against a 1.65 GB limit: at most 6 workers, though throughput still rises."""
    cpus(2)
    mem = lambda w: 1_000_000_000 + 100_000_000 * w  # noqa: E731
    r = tune_num_workers(strategy="fast", progress=False, memory_limit=1_650_000_000,
                         measure=CostModel(lambda w: 1.0 / (w + 1), memory=mem))
    assert max(t.workers for t in r.trials) == 6 and r.best_workers == 6 and "memory" in r.search_end


@pytest.mark.parametrize("kind", ["rising_past", "flat", "valley"])
def test_open_search_under_noise_interference_and_waves(kind, cpus):
    """Trials slowed at random by 20-40% (a shared machine), batches arriving in rounds of workers:
    the pick is within 5% of the best in at least 90% of cases."""
    hits = []
    for n in CPUS[1:]:
        cpus(n)
        for seed in range(4):
            t = _shape(kind, n, random.Random(seed * 104729 + n))
            for measure in (Hiccups(t, 0.01, (0.0, 0.0), seed, p=0.15), Waves(t, seed=seed)):
                r = tune_num_workers(strategy="fast", progress=False, measure=measure)
                hits.append(min(t(w) for w in range(open_cap(n) + 1)) / t(r.best_workers) >= 0.95)
    assert sum(hits) >= 0.9 * len(hits)


def test_the_paper_strategy_keeps_algorithm_1s_range(cpus):
    cpus(2)
    r = tune_num_workers(strategy="paper", progress=False, measure=CostModel(lambda w: 1.0 / (w + 1)))
    assert [t.workers for t in r.trials] == [0, 1] and r.best_workers == 1


# ---------------------------------------------------------------- the main process's load, on the real loader


class SeesBusyCpu:
    """Records, in the main process (0 workers), whether a child process is spinning beside it."""

    def __init__(self) -> None:
        self.spinners: set[int] = set()
        self.groups: set[int] = set()  # the spinners' process groups

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        for child in psutil.Process().children():
            try:
                if child.cmdline()[:2] == [sys.executable, "-c"] and "getppid" in child.cmdline()[2]:
                    self.spinners.add(child.pid)
                    self.groups.add(os.getpgid(child.pid))
            except psutil.Error:
                pass
        return np.full(4, i, np.float32)


def test_a_cpu_step_keeps_one_cpu_busy_during_a_trial_and_a_gpu_step_does_not():
    data = SeesBusyCpu()
    busy = nwt_measure.LoaderMeasure(data, batch_size=8, device="cpu", main_process="busy")
    busy(0, 4, 1)
    assert len(data.spinners) == 1
    assert not [p for p in psutil.Process().children() if p.pid in data.spinners]  # gone after the trial
    data.spinners = set()
    nwt_measure.LoaderMeasure(data, batch_size=8, device="cpu", main_process="waits")(0, 4, 1)
    assert data.spinners == set()
    with pytest.raises(ValueError, match="main_process"):
        nwt_measure.LoaderMeasure(data, batch_size=8, device="cpu", main_process="idle")


def test_a_ctrl_c_at_the_terminal_reaches_the_tuner_not_its_busy_cpu():
    """The terminal sends Ctrl-C to its foreground process group: a spinner in it died with a bare
    KeyboardInterrupt traceback beside the tuner's one line. It runs in a group of its own; the
    tuner ends it."""
    data = SeesBusyCpu()
    nwt_measure.LoaderMeasure(data, batch_size=8, device="cpu", main_process="busy")(0, 4, 1)
    assert data.spinners and os.getpgid(0) not in data.groups


def test_the_report_says_which_load_the_trials_represented(cpus):
    cpus(2)
    data = ArrayDataset(np.zeros((64, 4), np.float32), np.arange(64))
    r = tune_num_workers(data, batch_size=8, max_workers=2, iterations=8, strategy="fast", device="cpu",
                         progress=False)
    assert r.main_process == "busy"
    assert "main process: busy" in tune_summary(r)
    with pytest.raises(ValueError, match="main_process"):
        tune_num_workers(data, batch_size=8, main_process="sometimes", measure=lambda w, i, u: 1.0)


def test_a_search_past_the_cpus_says_so_once_in_one_line(cpus, capsys):
    """The loader warns when it starts more workers than CPUs; in a search that means it, one line says so."""
    cpus(1)
    data = ArrayDataset(np.zeros((64, 4), np.float32), np.arange(64))
    with _no_warnings():
        tune_num_workers(data, batch_size=8, max_workers=4, iterations=4, strategy="paper", device="cpu",
                         main_process="waits", progress=True)
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if "usable CPU" in ln]
    assert len(notes) == 1 and "UserWarning" not in err and ".py:" not in err


class _no_warnings:
    def __enter__(self):
        import warnings  # noqa: PLC0415

        self._cm = warnings.catch_warnings(record=True)
        self.seen = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        assert not [w for w in self.seen if "worker processes" in str(w.message)], [str(w.message) for w in self.seen]




class SeesAffinity:
    """Appends, per sample, the pid that made it and the CPUs that process may run on."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __len__(self):
        return 32

    def __getitem__(self, i):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()} {sorted(os.sched_getaffinity(0))}\n")
        return np.full(4, i, np.float32)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="reserving a CPU for the step needs two usable CPUs")
@pytest.mark.parametrize(("workers", "method"), [(0, None), (2, "fork"), (2, "forkserver")])
def test_a_cpu_step_reserves_its_cpu_and_the_loader_runs_on_the_others(tmp_path, workers, method):
    """Unpinned, the spinner's CPU would go to the workers, the more of it the more workers: a count's
    rate would rise with oversubscription that a real training step pays for."""
    before = os.sched_getaffinity(0)
    log = tmp_path / "affinity.txt"
    busy = nwt_measure.LoaderMeasure(SeesAffinity(log), batch_size=4, device="cpu", main_process="busy",
                                     multiprocessing_context=method)
    busy.preflight()  # its one batch is made before any trial: not part of what is checked
    log.unlink()
    busy(workers, 8, 1)
    seen = [line.split(" ", 1) for line in log.read_text().splitlines()]
    makers = {pid for pid, _ in seen}
    assert (makers == {str(os.getpid())}) == (workers == 0)
    timed = [cpus for _, cpus in seen[-8 * 4:]]  # the timed batches' samples: after the workers were confined
    assert all(str(min(before)) not in cpus.strip("[]").split(", ") for cpus in timed), timed
    assert os.sched_getaffinity(0) == before  # restored after the trial
