"""bench/studies/does_the_jax_tutorial_keep_pace/epoch_times.py, cpu_waits.py and sleepers.py: the summary of recorded runs,
bad input stopping with one line, neighbours and confinement as the runs see them. The tutorial itself runs in
tests/loader/test_clients.py; the study is run by hand."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "does_the_jax_tutorial_keep_pace"))
import cpu_waits as cw  # noqa: E402
import epoch_times as et  # noqa: E402
import sleepers as sl  # noqa: E402


def test_the_summary_leaves_out_the_compiling_epoch_and_takes_medians_of_runs(tmp_path):
    runs = {"cupy_nwt": [[9.0, 2.0, 4.0], [9.0, 3.0, 3.0], [9.0, 5.0, 5.0]],
            "torch": [[8.0, 2.0, 2.0], [8.0, 2.0, 4.0], [8.0, 1.0, 1.0]]}
    s = et.summarize(runs)
    assert s["summary"]["cupy_nwt"] == {"median_epoch_s": 3.0, "interval_s": [3.0, 5.0], "first_epoch_median_s": 9.0}
    assert s["summary"]["torch"]["median_epoch_s"] == 2.0 and s["ratio_cupy_nwt_over_torch"] == 1.5
    saved = tmp_path / "r.json"
    saved.write_text(json.dumps({"epoch_s": runs}))
    assert et.main(["--summarize", str(saved)]) == 0
    assert json.loads(saved.read_text())["ratio_cupy_nwt_over_torch"] == 1.5


@pytest.mark.parametrize("argv", [["--rounds", "2"], ["--epochs", "0"], ["--n-train", "10"], ["--sessions", "-1"]])
def test_bad_arguments_stop_before_any_run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        et.main(argv)
    assert exc.value.code == 2 and "--rounds must be >= 3" in capsys.readouterr().err


def test_neighbours_in_other_sessions_spin_through_every_round_and_are_gone_after(tmp_path, monkeypatch):
    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def recording(*args, **kwargs):
        started.append(real(*args, **kwargs))
        return started[-1]

    seen: list[int] = []

    def spinning() -> int:
        return sum(p.poll() is None and os.getsid(p.pid) == p.pid for p in started)  # alive, in a session of its own

    def fake_run(loader, epochs, n_train, bases=None, cpus=None, step=True):
        deadline = time.monotonic() + 10  # a child on a loaded machine may not have reached setsid() yet
        while spinning() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(spinning())
        return [9.0, 2.0 if loader == "torch" else 3.0]

    monkeypatch.setattr(et.subprocess, "Popen", recording)
    monkeypatch.setattr(et, "run_once", fake_run)
    out = tmp_path / "r.json"
    assert et.main(["--rounds", "3", "--sessions", "2", "--out", str(out)]) == 0
    assert len(started) == 2 and seen == [2] * 6  # both neighbours beside each of the 3 rounds' 2 runs
    assert all(p.returncode is not None for p in started)  # and gone after
    doc = json.loads(out.read_text())
    assert doc["conditions"]["other_sessions_spinning"] == 2 and doc["command"].endswith("--sessions 2")
    assert doc["ratio_cupy_nwt_over_torch"] == 1.5
    share = doc["machine_share"]["torch"]  # each run's share of the machine, and each neighbour's beside it
    assert len(share["runs"]) == 3 and share["fair_share_per_session"] == pytest.approx(1 / 3)
    assert all(0 <= r["run"] <= 1 and 0 <= r["each_neighbour"] <= 1 for r in share["runs"])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_cpus_confine_the_tutorial_and_its_workers_and_are_recorded(tmp_path, monkeypatch):
    (tmp_path / "jax_tutorial.py").write_text(  # a stand-in that reports where it and a child of it may run
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(len(os.sched_getaffinity(0)))\n"
        "print(f'Epoch 0 in {len(os.sched_getaffinity(0))}.0 sec')\n"
        "print(f'Epoch 1 in {os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}.0 sec')\n")
    monkeypatch.setattr(et, "HERE", tmp_path)
    assert et.run_once("torch", 2, 128, cpus={0}) == [1.0, 1.0]
    out = tmp_path / "r.json"
    assert et.main(["--rounds", "3", "--epochs", "2", "--n-train", "128", "--cpus", "0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["conditions"]["tutorial_cpus"] == [0] and doc["command"].endswith("--cpus 0")
    assert doc["summary"]["cupy_nwt"]["median_epoch_s"] == 1.0


@pytest.mark.parametrize("cpus", ["zero", "0,,1", "99999"])
def test_cpus_this_process_cannot_use_stop_before_any_run(cpus, capsys, monkeypatch):
    monkeypatch.setattr(et, "run_once", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(SystemExit) as exc:
        et.main(["--cpus", cpus])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and ": error: --cpus" in err[-1]


def test_the_cpu_waits_neighbours_spin_through_the_runs_and_are_gone_after(tmp_path, monkeypatch):
    started: list[subprocess.Popen] = []
    seen: list[int] = []
    real = cw.neighbours

    @contextlib.contextmanager
    def recording(n: int) -> Iterator[list[subprocess.Popen]]:
        with real(n) as procs:
            started.extend(procs)
            yield procs

    def measure(args, names, bases, runs):
        deadline = time.monotonic() + 10  # a child on a loaded machine may not have reached setsid() yet
        while sum(os.getsid(p.pid) == p.pid for p in started if p.poll() is None) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(sum(os.getsid(p.pid) == p.pid for p in started if p.poll() is None))
        for name in names:
            runs[name].append({"epoch_s": [9.0, 1.0], "batches": [dict.fromkeys(ROW, 1.0)]})

    monkeypatch.setattr(cw, "neighbours", recording)
    monkeypatch.setattr(cw, "measure", measure)
    out = tmp_path / "w.json"
    assert cw.main(["--sessions", "3", "--out", str(out)]) == 0
    assert seen == [3] and len(started) == 3 and all(p.returncode is not None for p in started)
    doc = json.loads(out.read_text())
    assert doc["conditions"]["other_sessions_spinning"] == 3 and doc["command"].endswith("--sessions 3")


ROW = ("parent_wait_ms", "parent_cpu_ms", "worker_wait_ms", "worker_cpu_ms", "one_cpu", "parent_all_cpu_ms",
       "workers_all_cpu_ms")


def test_loading_only_runs_the_tutorial_without_its_step_and_says_so(tmp_path, monkeypatch):
    (tmp_path / "jax_tutorial.py").write_text(  # a stand-in that reports whether it was asked to train
        "import os\n"
        "print(f'Epoch 0 in {2 if os.environ.get(\"STEP\") == \"none\" else 1}.0 sec')\n")
    monkeypatch.setattr(et, "HERE", tmp_path)
    assert et.run_once("torch", 1, 128) == [1.0] and et.run_once("torch", 1, 128, step=False) == [2.0]
    out = tmp_path / "r.json"
    assert et.main(["--rounds", "3", "--epochs", "1", "--n-train", "128", "--loading-only", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["conditions"]["training_step"] is False and doc["command"].endswith("--loading-only")
    assert doc["summary"]["torch"]["median_epoch_s"] == 2.0


def test_cpu_waits_adds_the_epochs_machine_share_to_a_result_file(tmp_path, capsys):
    rows = [dict.fromkeys(ROW, 0.0) | {"parent_all_cpu_ms": 3.0, "workers_all_cpu_ms": 1.0}] * 500
    saved = tmp_path / "w.json"
    saved.write_text(json.dumps({"conditions": {"cpus": 2},
                                 "runs": {"torch": [{"epoch_s": [9.0, 0.5, 0.5], "batches": rows}]}}))
    assert cw.main(["--summarize", str(saved)]) == 0
    assert json.loads(saved.read_text())["machine_share_in_epochs"]["torch"] == [pytest.approx(1.0)]  # 2 s / 2 s


@pytest.mark.parametrize("study", [cw, et])
@pytest.mark.parametrize(("text", "says"), [(None, "no such result file"), ("{not json", "not readable as JSON"),
                                            ("[1, 2]", "not a result file"), ('{"runs": 3}', "not a result file")])
def test_a_result_file_to_summarize_that_is_not_one_stops_with_one_line(study, text, says, tmp_path, capsys):
    path = tmp_path / "r.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        study.main(["--summarize", str(path)])
    assert exc.value.code == 2 and says in capsys.readouterr().err.strip().splitlines()[-1]


def test_sleepers_summary_takes_medians_per_kind_against_the_fair_share():
    windows = {"busy": [{"group": 0.2, "each_neighbour": 0.2}, {"group": 0.1, "each_neighbour": 0.3},
                        {"group": 0.3, "each_neighbour": 0.2}],
               "sleepy": [{"group": 0.5, "each_neighbour": 0.1}]}
    s = sl.summarize(windows, sessions=4)
    assert s["fair_share_per_session"] == pytest.approx(0.2)
    assert s["busy"] == {"group_median": 0.2, "group_range": [0.1, 0.3], "each_neighbour_median": 0.2}
    assert s["sleepy"]["group_median"] == 0.5


@pytest.mark.parametrize(("argv", "says"), [(["--rounds", "0"], "--rounds must be >= 1"),
                                            (["--procs", "0"], "--procs must be >= 1"),
                                            (["--sleep-ms", "0"], "--sleep-ms must be > 0"),
                                            (["--seconds", "nan"], "--seconds must be > 0")])
def test_sleepers_bad_arguments_stop_with_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        sl.main(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err.strip().splitlines()[-1]


def test_sleepers_measures_both_groups_beside_its_neighbours_and_leaves_none(tmp_path):
    out = tmp_path / "s.json"
    assert sl.main(["--rounds", "2", "--sessions", "1", "--procs", "2", "--seconds", "0.3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["command"].endswith("sleepers.py --rounds 2 --sessions 1 --procs 2 --seconds 0.3 "
                                      "--run-ms 0.5 --sleep-ms 0.2")
    for kind in ("busy", "sleepy"):
        assert len(result["windows"][kind]) == 2
        for w in result["windows"][kind]:  # somebody ran: two spinning processes cannot get nothing in 0.3 s
            assert 0 < w["group"] <= 1.05 and 0 < w["each_neighbour"] <= 1.05
    assert result["summary"]["fair_share_per_session"] == 0.5
    leftover = subprocess.run(["pgrep", "-f", "-P", str(os.getpid()), cw.SPIN],
                              capture_output=True, text=True)
    assert leftover.stdout == ""
