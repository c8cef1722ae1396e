"""``tune`` and ``stats`` check every option before any work: a bad one is one line and its exit code, with no
synthetic dataset built (its cache left as it was), no trial measured and no table begun."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_nwt import cli, cuda

SMALL = ["--synthetic-n", "64", "--no-progress"]


@pytest.fixture
def no_work(tmp_path, monkeypatch):
    """A fresh cache folder; building the dataset or measuring a trial fails the test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(cache))

    def never(*args, **kwargs):
        pytest.fail("the run started before every option was checked")

    monkeypatch.setattr("cupy_nwt.cli._pipeline.subprocess.Popen", never)
    monkeypatch.setattr("cupy_nwt.data._synthetic.SyntheticCIFAR10._build_into", never)
    monkeypatch.setattr("cupy_nwt.nwt.measure.LoaderMeasure", never)
    return cache


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert "building synthetic" not in captured.err and "Traceback" not in captured.err
    return captured.err


@pytest.mark.parametrize(("argv", "needle"), [
    (["--tolerance", "5"], "tolerance must be a number in [0, 0.5)"),
    (["--alpha", "-1"], "alpha must be a non-negative number"),
    (["--iterations", "5"], "the fast strategy needs iterations >= 8, got 5"),
    (["--prefetch-factor", "0"], "--prefetch-factor must be >= 1"),
    (["--plot", "t.jpg"], "--plot t.jpg: the plot is a PNG image, so its name must end in .png"),
    (["--strategy", "paper", "--max-workers", "10000000"], "max_workers=10000000 (up to 9,999,999 workers) is more "
                                                          "than this machine can hold about"),
])
def test_tune_refuses_a_bad_option_before_building_anything(argv, needle, no_work, capsys):
    assert cli.main(["tune", *SMALL, "--device", "cpu", *argv]) == cli.EXIT_USAGE
    assert needle in _one_line(capsys)
    assert not no_work.exists()


@pytest.mark.parametrize(("argv", "line"), [
    (["--alpha", "nan"], "--alpha must be a non-negative number of seconds per 100 iterations, got nan"),
    (["--tolerance", "inf"], "--tolerance must be a number in [0, 0.5), got inf"),
    (["--tolerance", "0.7"], "--tolerance must be a number in [0, 0.5), got 0.7"),
    (["--alpha", "abc"], "--alpha must be a number, got 'abc'"),
])
def test_a_bad_alpha_or_tolerance_is_named_as_typed(argv, line, no_work, capsys):
    assert cli.main(["tune", *SMALL, "--device", "cpu", *argv]) == cli.EXIT_USAGE
    assert _one_line(capsys) == f"cupy-nwt tune: {line}\n"
    assert not no_work.exists()


@pytest.mark.parametrize("command", ["tune", "stats"])
def test_device_cuda_without_a_gpu_is_refused_before_building_anything(command, no_work, monkeypatch, capsys):
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(False, "no usable GPU: test says so"))
    assert cli.main([command, *SMALL, "--device", "cuda"]) == cli.EXIT_NO_GPU
    assert "no usable GPU: test says so" in _one_line(capsys)
    assert not no_work.exists()


def test_stats_refuses_more_workers_than_the_machine_holds_before_the_table(no_work, capsys):
    assert cli.main(["stats", *SMALL, "--device", "cpu", "--num-workers", "10000000"]) == cli.EXIT_USAGE
    assert "num_workers=10000000 is more than this machine can hold" in _one_line(capsys)
    assert not no_work.exists()


@pytest.mark.parametrize("command", ["tune", "stats", "reproduce"])
@pytest.mark.parametrize("n", ["99999999999999999999", "9999999999999"])
def test_a_synthetic_size_beyond_the_machine_is_one_line(command, n, no_work, tmp_path, capsys):
    argv = [command, "--synthetic-n", n, "--no-progress"] + (["--out", str(tmp_path / "r")] if command == "reproduce"
                                                             else ["--device", "cpu"])
    assert cli.main(argv) == cli.EXIT_USAGE
    err = _one_line(capsys)
    assert "synthetic CIFAR-10 images need at least" in err and "ask for fewer" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["tune", "stats"])
def test_a_cache_folder_that_is_a_file_is_one_line(command, tmp_path, monkeypatch, capsys):
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    assert cli.main([command, *SMALL, "--device", "cpu"]) == cli.EXIT_USAGE
    err = _one_line(capsys)
    assert f"the cache folder {tmp_path / 'cache'} (CUPY_NWT_CACHE_DIR)" in err and "is a file, not a folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def test_stats_shows_the_synthetic_build_progress(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))
    assert cli.main(["stats", "--synthetic-n", "64", "--batch-size", "16", "--num-workers", "0", "--device", "cpu",
                     "--batches", "2", "--every", "1", "--json"]) == 0
    assert "building synthetic CIFAR-10 (64 images) 1/1: 64 images" in capsys.readouterr().err


def test_tune_refuses_a_picks_folder_it_cannot_save_in_before_the_search(no_work, tmp_path, monkeypatch, capsys):
    data = tmp_path / "x.npy"
    np.save(data, np.zeros((64, 4), np.float32))
    (tmp_path / "blocker").write_text("a file where the cache folder would be")
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "blocker" / "cache"))
    assert cli.main(["tune", "--dataset", str(data), "--no-progress", "--device", "cpu"]) == cli.EXIT_USAGE
    line = _one_line(capsys)
    cache = tmp_path / "blocker" / "cache"
    assert f"the cache folder {cache} (CUPY_NWT_CACHE_DIR) cannot hold the saved picks: " in line
    assert line.endswith("or pass --no-save\n")
