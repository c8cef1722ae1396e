"""bench/studies/does_the_jax_tutorial_keep_pace/epoch_times.py: the summary of recorded runs, and bad input
stopping with one line. The tutorial itself runs in tests/loader/test_clients.py; the study is run by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "does_the_jax_tutorial_keep_pace"))
import epoch_times as et  # noqa: E402


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
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import time  # noqa: PLC0415

    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def recording(*args, **kwargs):
        started.append(real(*args, **kwargs))
        return started[-1]

    seen: list[int] = []

    def spinning() -> int:
        return sum(p.poll() is None and os.getsid(p.pid) == p.pid for p in started)  # alive, in a session of its own

    def fake_run(loader, epochs, n_train, bases=None):
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
