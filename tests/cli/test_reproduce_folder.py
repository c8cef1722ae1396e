"""``reproduce``'s folder appears whole or not at all: every option is checked before any work, a failed or
interrupted run leaves the old report (or nothing), and a new one replaces the old whole."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from cupy_nwt import cli
from cupy_nwt.nwt.trials import Measurement

QUICK = ["--synthetic-n", "64", "--batch-size", "16", "--max-workers", "3", "--iterations", "8",
         "--compare-iterations", "8", "--compare-repeats", "1", "--judge-repeats", "1", "--no-gpu", "--no-progress"]


class FakeMeasure:
    """A trial in no time; ``fail_after`` trials in, it raises as Ctrl-C would."""

    fail_after: int | None = None
    calls = 0

    def __init__(self, dataset, **kwargs):
        pass

    def __call__(self, workers, iterations, warmup):
        FakeMeasure.calls += 1
        if FakeMeasure.fail_after is not None and FakeMeasure.calls > FakeMeasure.fail_after:
            raise KeyboardInterrupt
        t = [0.04, 0.02, 0.03][workers]
        return Measurement(t, t * (iterations + warmup), 10**9 + workers * 10**7)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("cupy_nwt.nwt.measure.LoaderMeasure", FakeMeasure)
    monkeypatch.setattr(FakeMeasure, "fail_after", None)
    monkeypatch.setattr(FakeMeasure, "calls", 0)
    return FakeMeasure


def _beside(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "cache")


def test_too_few_iterations_for_the_fast_search_fail_before_any_work(tmp_path, fake, capsys):
    out = tmp_path / "a" / "r1"
    assert cli.main(["reproduce", "--out", str(out), *QUICK, "--iterations", "5"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the fast strategy needs iterations >= 8, got 5" in err
    assert _beside(tmp_path) == [] and fake.calls == 0


def test_out_below_a_file_is_bad_input(tmp_path, fake, capsys):
    (tmp_path / "file").write_text("x")
    assert cli.main(["reproduce", "--out", str(tmp_path / "file" / "sub"), *QUICK]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {tmp_path / 'file' / 'sub'}: {tmp_path / 'file'} is a file" in err


def test_a_new_report_replaces_the_old_whole(tmp_path, fake, capsys):
    out = tmp_path / "r"
    assert cli.main(["reproduce", "--out", str(out), *QUICK]) == 0
    first = json.loads((out / "report.json").read_text())
    (out / "tune-paper.png").unlink(missing_ok=True)  # a file the report names may be gone
    capsys.readouterr()
    assert cli.main(["reproduce", "--out", str(out), *QUICK, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    names = sorted(p.name for p in out.iterdir())
    assert {"report.json", "info.json", "tune-fast.json"} <= set(names) and printed != first
    assert sorted(printed["files"]) == sorted(str(out / n) for n in names)
    assert _beside(tmp_path) == ["r"]


@pytest.mark.parametrize("report", [None, '{"config": {}, "files": ["r/info.json"]}', "not json"],
                         ids=["no-report", "report-not-naming-it", "damaged-report"])
def test_a_folder_holding_files_no_earlier_report_names_is_refused_and_kept(report, tmp_path, fake, capsys):
    """A report replaces its folder whole: a folder of the user's own, given by mistake, is not removed."""
    out = tmp_path / "r"
    (out / "sub").mkdir(parents=True)
    (out / "thesis.txt").write_text("precious")
    (out / "sub" / "data.csv").write_text("x")
    if report is not None:
        (out / "report.json").write_text(report)
    assert cli.main(["reproduce", "--out", str(out), *QUICK]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "which no earlier report there names" in err and "thesis.txt" in err
    assert (out / "thesis.txt").read_text() == "precious" and (out / "sub" / "data.csv").exists()
    assert fake.calls == 0


@pytest.mark.parametrize("where", [".", "..", "/"])
def test_the_current_folder_or_one_above_it_is_refused(where, tmp_path, fake, capsys, monkeypatch):
    here = tmp_path / "work"
    here.mkdir()
    monkeypatch.chdir(here)
    assert cli.main(["reproduce", "--out", where, *QUICK]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is the current folder or one above it" in err
    assert list(here.iterdir()) == [] and fake.calls == 0


def test_a_link_to_an_earlier_report_stays_a_link(tmp_path, fake, capsys):
    real, link = tmp_path / "reports" / "r", tmp_path / "r"
    assert cli.main(["reproduce", "--out", str(real), *QUICK]) == 0
    link.symlink_to(real)
    assert cli.main(["reproduce", "--out", str(link), *QUICK]) == 0
    assert link.is_symlink() and (real / "report.json").is_file()
    assert _beside(tmp_path) == ["r", "reports"] and sorted(p.name for p in real.parent.iterdir()) == ["r"]


@pytest.mark.parametrize("old", [True, False], ids=["old-report", "none"])
def test_an_interrupted_run_leaves_the_old_report_or_nothing(old, tmp_path, fake, capsys):
    out = tmp_path / "new" / "r"
    if old:
        out.mkdir(parents=True)
        (out / "report.json").write_text('{"config": {"old": true}, "files": ["new/r/report.json"]}')
    fake.fail_after = 4  # in the paper search, after info.json and the dataset
    assert cli.main(["reproduce", "--out", str(out), *QUICK]) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err.endswith("interrupted\n")
    if old:
        assert sorted(p.name for p in out.iterdir()) == ["report.json"]
        assert json.loads((out / "report.json").read_text())["config"] == {"old": True}
        assert sorted(p.name for p in out.parent.iterdir()) == ["r"]
    else:
        assert _beside(tmp_path) == []


def test_a_picks_folder_that_cannot_be_written_fails_before_any_work(tmp_path, fake, capsys):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "num_workers.json.lock").mkdir()  # no lock can be made: as a read-only folder would be
    assert cli.main(["reproduce", "--out", str(tmp_path / "r"), *QUICK]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the cache folder {cache} (CUPY_NWT_CACHE_DIR) cannot hold the saved picks" in err
    assert _beside(tmp_path) == [] and fake.calls == 0


@pytest.fixture
def mount_point(tmp_path):
    """An empty tmpfs mounted at ``tmp_path/out``, as a container's volume (``-v $PWD/out:/out``) is."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a folder needs root and mount")
    where = tmp_path / "out"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(where)], capture_output=True).returncode != 0:
        pytest.skip("this machine does not let a tmpfs be mounted here")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_mount_point_takes_the_report_and_a_new_one_replaces_it(mount_point, fake, capsys):
    """A mount point cannot be renamed: the report was made, then lost with 'Device or resource busy'."""
    assert cli.main(["reproduce", "--out", str(mount_point), *QUICK]) == 0
    first = sorted(p.name for p in mount_point.iterdir())
    assert "report.json" in first and not [n for n in first if n.startswith(".")]
    (mount_point / "tune-paper.png").unlink(missing_ok=True)
    assert cli.main(["reproduce", "--out", str(mount_point), *QUICK]) == 0
    again = sorted(p.name for p in mount_point.iterdir())
    assert again == first and os.path.ismount(mount_point)
    capsys.readouterr()


def test_an_interrupted_run_into_a_mount_point_leaves_the_old_report(mount_point, fake, capsys):
    assert cli.main(["reproduce", "--out", str(mount_point), *QUICK]) == 0
    before = {p.name: p.read_bytes() for p in mount_point.iterdir()}
    fake.fail_after = fake.calls + 4
    assert cli.main(["reproduce", "--out", str(mount_point), *QUICK]) == cli.EXIT_INTERRUPTED
    assert {p.name: p.read_bytes() for p in mount_point.iterdir()} == before
    capsys.readouterr()


def test_a_read_only_mount_point_is_refused_before_any_work(tmp_path, fake, capsys):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a folder needs root and mount")
    where = tmp_path / "ro"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("this machine does not let a tmpfs be mounted here")
    try:
        assert cli.main(["reproduce", "--out", str(where), *QUICK]) == cli.EXIT_USAGE
    finally:
        subprocess.run(["umount", str(where)], check=True)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {where}: {where} is not writable" in err and fake.calls == 0
