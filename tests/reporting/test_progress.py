"""Terminal output: a bar on a terminal, one plain line per step in a log (no carriage-return
frames), progress for every long step (dataset build, searches, the reproduce comparison), counts
in English ("1 worker"), and --help texts without reStructuredText markup."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cupy_nwt import cli
from cupy_nwt.cli import commands
from cupy_nwt.cli.explain import tune_summary
from cupy_nwt.data.datasets import SyntheticCIFAR10
from cupy_nwt.nwt.trials import Measurement
from cupy_nwt.nwt.tune import tune_num_workers
from cupy_nwt.reporting import progress
from cupy_nwt.reporting.progress import ProgressBar, is_terminal
from cupy_nwt.reporting.units import plural


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def every_step(monkeypatch):
    """A line for every step: no minimum interval between lines (what these tests read line by line)."""
    monkeypatch.setattr(progress, "LINE_INTERVAL_S", 0.0)


def test_a_log_gets_at_most_one_line_every_few_seconds():
    """200 steps in 4 s (``cupy-nwt stats`` on a small dataset) give 2 lines, not 200."""
    now = [0.0]
    log = io.StringIO()
    with ProgressBar(200, "stats", stream=log, clock=lambda: now[0]) as bar:
        for _ in range(200):
            bar.step()
            now[0] += 0.02
        bar.note("a note is always its own line")
    lines = log.getvalue().splitlines()
    assert lines == ["stats 1/200", f"stats {int(progress.LINE_INTERVAL_S / 0.02) + 1}/200",
                     "a note is always its own line"]
    assert 2 <= progress.LINE_INTERVAL_S <= 10


def test_a_log_gets_one_plain_line_per_step(every_step):
    log = io.StringIO()
    with ProgressBar(3, "sweep", stream=log) as bar:
        bar.step("4 KiB")
        bar.step()
        bar.step("1 MiB")
    assert log.getvalue() == "sweep 1/3: 4 KiB\nsweep 2/3\nsweep 3/3: 1 MiB\n"


def test_an_unknown_total_counts_up(every_step):
    log = io.StringIO()
    with ProgressBar(None, "NWT (fast)", stream=log) as bar:
        bar.step("0 workers")
        bar.step("2 workers")
    assert log.getvalue().splitlines() == ["NWT (fast) 1: 0 workers", "NWT (fast) 2: 2 workers"]


def test_a_terminal_gets_a_redrawn_bar():
    term = _Terminal()
    assert is_terminal(term) and not is_terminal(io.StringIO())
    with ProgressBar(2, "sweep", stream=term) as bar:
        bar.step("a")
        bar.step("b")
    assert "\r" in term.getvalue() and "sweep" in term.getvalue()


BAR_THEN_FORK = """
import io, os, threading, warnings
from cupy_nwt.reporting.progress import ProgressBar
class Terminal(io.StringIO):
    def isatty(self):
        return True
warnings.simplefilter("always")
with ProgressBar(2, "trials", stream=Terminal()) as bar:
    bar.step("a")
    print(sorted(t.name for t in threading.enumerate()))
    pid = os.fork()  # a trial's loader forks its workers under the bar
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
print(sorted(t.name for t in threading.enumerate()))
"""


def test_a_bar_on_a_terminal_runs_no_thread_a_fork_would_copy_a_lock_of():
    """Python 3.12 warns of a fork beside a thread (a lock it held stays locked in the child)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    got = subprocess.run([sys.executable, "-c", BAR_THEN_FORK], capture_output=True, text=True, env=env, timeout=60)
    assert got.stdout.splitlines() == ["['MainThread']", "['MainThread']"], got.stderr
    assert "multi-threaded" not in got.stderr


def test_disabled_progress_writes_nothing():
    log = io.StringIO()
    with ProgressBar(2, "sweep", stream=log, enabled=False) as bar:
        bar.step("a")
    assert log.getvalue() == "" and bar.done == 0


def test_a_closed_stream_is_no_terminal():
    s = io.StringIO()
    s.close()
    assert not is_terminal(s) and not is_terminal(object())


def test_the_search_logs_a_line_per_trial_with_singular_counts(capsys, every_step):
    tune_num_workers(max_workers=3, strategy="paper", measure=lambda w, i, u: 0.1, batch_size=10, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "\r" not in err
    assert err.splitlines() == [f"NWT (paper) {i + 1}/3: {plural(i, 'worker')}: 100 samples/s" for i in range(3)]
    assert "1 worker:" in err and "1 workers" not in err


def test_cli_steps_are_lines_in_a_log(capsys, every_step):
    args = argparse.Namespace(no_progress=False)
    assert commands._run_with_progress(args, 2, "bandwidth", lambda step: [step("a"), step("b")] and 7) == 7
    assert capsys.readouterr().err == "bandwidth 1/2: a\nbandwidth 2/2: b\n"
    assert commands._run_with_progress(argparse.Namespace(no_progress=True), 2, "x", lambda step: step("a")) is None
    assert capsys.readouterr().err == ""


def test_building_the_synthetic_dataset_shows_progress_once(tmp_path, capsys, every_step):
    data = SyntheticCIFAR10(n=1100, cache_dir=tmp_path, progress=True)
    assert data.built_now
    err = capsys.readouterr().err
    assert err.splitlines() == ["building synthetic CIFAR-10 (1,100 images) 1/2: 1,024 images",
                                "building synthetic CIFAR-10 (1,100 images) 2/2: 1,100 images"]
    SyntheticCIFAR10(n=1100, cache_dir=tmp_path, progress=True)  # cached: nothing to show
    SyntheticCIFAR10(n=50, cache_dir=tmp_path)  # a library call stays quiet
    assert capsys.readouterr().err == ""


def test_reproduce_shows_every_stage_and_the_comparison(tmp_path, monkeypatch, capsys, every_step):
    from cupy_nwt.cli.reproduce import ReproduceConfig, run_reproduce

    curve = [0.04, 0.02, 0.018, 0.03]

    class FakeMeasure:
        def __init__(self, dataset, **kwargs):
            pass

        def __call__(self, workers, iterations, warmup):
            return Measurement(curve[workers], curve[workers] * (iterations + warmup))

    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("cupy_nwt.nwt.measure.LoaderMeasure", FakeMeasure)
    run_reproduce(ReproduceConfig(out_dir=tmp_path / "out", synthetic_n=64, batch_size=16, max_workers=4,
                                  iterations=8, compare_iterations=8, compare_repeats=2, gpu_experiments=False))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err
    assert "[data] synthetic CIFAR-10, 64 images" in lines
    assert "building synthetic CIFAR-10 (64 images) 1/1: 64 images" in lines
    assert "[compare] every count 0..3 again, 2 rounds" in lines
    compare = [ln for ln in lines if ln.startswith("compare ")]
    assert compare == [f"compare {k + 1}/8: {plural(k % 4, 'worker')}" for k in range(8)]
    assert sum(ln.startswith("NWT (paper) ") for ln in lines) == 4


def test_counts_read_as_english():
    assert [plural(n, "worker") for n in (0, 1, 2)] == ["0 workers", "1 worker", "2 workers"]
    assert plural(1, "fewer worker", "fewer workers") == "1 fewer worker"
    assert plural(3, "process", "processes") == "3 processes"


def test_the_tune_summary_says_1_worker():
    r = tune_num_workers(max_workers=2, strategy="paper", alpha=0.0, measure=lambda w, i, u: 0.1 / (w + 1),
                         progress=False)
    text = tune_summary(r)
    assert r.best_workers == 1
    assert "pick: 1 worker (" in text and "1 workers" not in text
    assert "2 worker counts measured in 2 runs" in text


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_help_texts_have_no_restructuredtext_markup():
    parser = cli.build_parser()
    subs = _subcommands(parser)
    assert {"info", "bandwidth", "overlap", "tune", "reproduce"} <= set(subs)
    for name, text in [("cupy-nwt", parser.format_help())] + [(n, p.format_help()) for n, p in subs.items()]:
        assert "``" not in text, (name, text)
        assert ":func:" not in text and ":class:" not in text, name


@pytest.mark.parametrize("command", ["info", "bandwidth", "overlap", "tune", "reproduce"])
def test_help_through_the_entry_point(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    assert "``" not in capsys.readouterr().out
