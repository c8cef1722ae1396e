"""``cupy-nwt tune`` gives one verdict per run: the pick it prints is the pick it keeps or saves, with
why in one line, and a warning (with what to do) when its trials were too noisy to trust.

The searches run on fake trial curves (``tune_num_workers(measure=...)`` behind the command), so
what each run picks is fixed; the command, the store and the printing are the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import cli
from cupy_nwt.cli.exits import EXIT_FAILED, EXIT_USAGE
from cupy_nwt.nwt import tune as nwt_tune
from cupy_nwt.nwt.trials import Measurement

REAL = nwt_tune.tune_num_workers
ARGS = ["--batch-size", "8", "--max-workers", "3", "--strategy", "paper", "--alpha", "0", "--no-progress",
        "--device", "cpu"]


@pytest.fixture
def dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "data.npy"
    np.save(path, np.zeros((64, 4), np.float32))
    return path


def _curve(monkeypatch, times: dict[int, float], rel_error: float = 0.002) -> None:
    """The command's next search measures ``times`` (seconds per iteration by worker count)."""

    def measure(workers: int, iterations: int, warmup: int) -> Measurement:
        return Measurement(times[workers], times[workers] * (iterations + warmup), rel_error=rel_error)

    monkeypatch.setattr(nwt_tune, "tune_num_workers", lambda data, **kw: REAL(data, **{**kw, "measure": measure}))


def _tune(dataset, capsys, *extra: str) -> str:
    assert cli.main(["tune", "--dataset", str(dataset), *ARGS, *extra]) == 0
    return capsys.readouterr().out


def test_the_printed_pick_is_the_pick_kept(dataset, capsys, monkeypatch):
    _curve(monkeypatch, {0: 0.020, 1: 0.015, 2: 0.010})
    first = _tune(dataset, capsys)
    assert "pick: 2 workers (alpha 0 s per 100 iterations)" in first
    assert "saved to " in first and "the first pick for this machine and work" in first
    _curve(monkeypatch, {0: 0.0100, 1: 0.0101, 2: 0.0101})  # 0 now, but not faster than 2 beyond the noise
    second = _tune(dataset, capsys)
    picks = [line for line in second.splitlines() if line.startswith("pick:")]
    assert picks == ["pick: 2 workers, the saved pick, kept: this search's 0 is not faster than it beyond "
                     "the uncertainty"]
    assert "this search picked 0 workers: " in second
    assert "WARNING" not in second
    _curve(monkeypatch, {0: 0.0100, 1: 0.0101, 2: 0.0101})
    doc = json.loads(_tune(dataset, capsys, "--json"))
    assert doc["best_workers"] == 0  # the search's own result, as it measured it
    assert doc["verdict"]["workers"] == 2 and doc["verdict"]["source"] == "saved"
    assert doc["verdict"]["search_pick"] == 0 and doc["verdict"]["warning"] is None


def test_noisy_trials_print_a_warning_with_what_to_do(dataset, capsys, monkeypatch):
    _curve(monkeypatch, {0: 0.020, 1: 0.015, 2: 0.010}, rel_error=0.35)
    out = _tune(dataset, capsys, "--no-save")
    warning = out[out.index("WARNING: "):]
    assert "the pick of 2 workers is unreliable" in warning and "--iterations" in " ".join(warning.split())
    _curve(monkeypatch, {0: 0.020, 1: 0.015, 2: 0.010}, rel_error=0.35)
    assert cli.main(["tune", "--dataset", str(dataset), *ARGS, "--no-save", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdict"]["warning"].startswith("the pick of 2 workers is unreliable")
    assert captured.err.startswith("cupy-nwt tune: warning: the pick of 2 workers is unreliable")


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "nan", "inf", "1e9"])
def test_a_bad_step_is_one_line(dataset, capsys, bad):
    assert cli.main(["tune", "--dataset", str(dataset), *ARGS, "--step", bad]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("cupy-nwt tune: ") and "--step" in err[-1]


@pytest.mark.parametrize(("step", "recorded"), [("0.001", "0.001 s"), ("numpy:mean", "numpy.mean")])
def test_a_step_from_the_shell_keys_the_saved_pick(dataset, capsys, monkeypatch, step, recorded):
    _curve(monkeypatch, {0: 0.020, 1: 0.015, 2: 0.010})
    doc = json.loads(_tune(dataset, capsys, "--step", step, "--json"))
    assert doc["fingerprint"]["work"]["step"] == recorded


def test_the_tuner_guide_quotes_what_a_kept_pick_prints(dataset, capsys, monkeypatch):
    _curve(monkeypatch, {0: 0.020, 1: 0.015, 2: 0.010})
    _tune(dataset, capsys)
    _curve(monkeypatch, {0: 0.0100, 1: 0.0101, 2: 0.0101})
    printed = next(line for line in _tune(dataset, capsys).splitlines() if line.startswith("pick:"))
    guide = " ".join((Path(__file__).parents[2] / "docs" / "tuner.md").read_text().split())
    assert printed.replace("pick: 2", "pick: N").replace("search's 0", "search's M") in guide


def test_the_json_of_a_paper_search_carries_algorithm_1s_walk(dataset, capsys, monkeypatch):
    """The text explains the paper's pick decision by decision; --json had only the trials and a ``why``
    that says nothing of alpha, so a 2-worker count 17% faster than the pick read as passed over unexplained."""
    _curve(monkeypatch, {0: 0.020, 1: 0.012, 2: 0.010})
    doc = json.loads(_tune(dataset, capsys, "--alpha", "0.5", "--json"))
    assert doc["best_workers"] == 1
    walk = [(d["workers"], d["accepted"], d["accepted_before"]) for d in doc["paper_decisions"]]
    assert walk == [(0, True, None), (1, True, 0), (2, False, 1)]
    assert doc["paper_decisions"][2]["gain"] == pytest.approx(0.2)
    _curve(monkeypatch, {0: 0.020, 1: 0.012, 2: 0.010})
    fast = json.loads(_tune(dataset, capsys, "--strategy", "fast", "--iterations", "100", "--json"))
    assert "paper_decisions" not in fast


def test_a_pick_that_cannot_be_saved_after_the_search_still_gives_its_result(dataset, capsys, monkeypatch, tmp_path):
    """The store's lock held past its wait (another tuner stopped while saving): the search's JSON is printed and
    written all the same, then one line says the pick was not saved."""
    from filelock import FileLock

    import cupy_nwt.picks.store_file as store_file

    monkeypatch.setattr(store_file, "LOCK_TIMEOUT_S", 0.2)
    _curve(monkeypatch, {0: 0.020, 1: 0.015, 2: 0.010})
    (tmp_path / "cache").mkdir()
    with FileLock(str(tmp_path / "cache" / "num_workers.json.lock")):
        code = cli.main(["tune", "--dataset", str(dataset), *ARGS, "--json", "--output", str(tmp_path / "t.json")])
    out, err = capsys.readouterr()
    assert code == EXIT_USAGE and err.count("\n") == 1 and "stayed held by another process" in err
    assert json.loads(out)["best_workers"] == 2 and json.loads((tmp_path / "t.json").read_text())["best_workers"] == 2


@pytest.mark.parametrize("kind", ["function", "class"])
def test_a_step_that_raises_ends_as_one_line_naming_the_option(dataset, capsys, monkeypatch, tmp_path, kind):
    """The user's own step failing is their code's error, said as such: not "unexpected error"."""
    body = ("def step(batch):\n    raise TypeError('my step broke')\n" if kind == "function" else
            "class step:\n    def __call__(self, batch):\n        raise TypeError('my step broke')\n")
    (tmp_path / f"my{kind}step.py").write_text(body)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["tune", "--dataset", str(dataset), *ARGS, "--no-save", "--step", f"my{kind}step:step"]) == EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"cupy-nwt tune: --step my{kind}step:step raised TypeError: my step broke (--debug shows where)"]


def test_a_wrapped_step_keys_the_pick_by_its_own_name(dataset, capsys, monkeypatch, tmp_path):
    (tmp_path / "stepclass.py").write_text("class Step:\n    def __call__(self, batch):\n        pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    _curve(monkeypatch, {0: 0.020, 1: 0.015, 2: 0.010})
    doc = json.loads(_tune(dataset, capsys, "--step", "stepclass:Step", "--json"))
    assert doc["fingerprint"]["work"]["step"] == "stepclass.Step"


def test_a_search_of_one_count_claims_no_trial(dataset, capsys):
    """``--max-workers 1`` leaves one count, taken unmeasured: no line may say the step ran in trials."""
    args = [a if a != "3" else "1" for a in ARGS]
    out = _tune(dataset, capsys, "--no-save", "--step", "0.001", *args, "--strategy", "fast")
    assert "pick: 0 workers" in out and "not measured" in out
    assert "main process:" not in out


def test_a_partial_step_from_the_shell_is_keyed_as_the_api_keys_it(dataset, capsys, monkeypatch, tmp_path):
    (tmp_path / "partialstep.py").write_text("import functools\n\ndef step(batch, seconds):\n    pass\n\n"
                                             "slow = functools.partial(step, seconds=0.05)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    _curve(monkeypatch, {0: 0.020, 1: 0.015, 2: 0.010})
    doc = json.loads(_tune(dataset, capsys, "--step", "partialstep:slow", "--json"))
    assert doc["fingerprint"]["work"]["step"] == "partialstep.step(seconds=0.05)"
