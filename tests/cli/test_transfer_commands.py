"""``cupy-nwt bandwidth`` and ``cupy-nwt overlap``: exit codes and one-line errors through the real
entry point, and (on a GPU) the files they write."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cupy_nwt import cli, cuda
from cupy_nwt.cli import plots


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUPY_NWT_DISABLE_GPU="1")
    return subprocess.run([sys.executable, "-m", "cupy_nwt", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


@pytest.mark.parametrize("argv", [["bandwidth"], ["bandwidth", "--json"], ["overlap"],
                                  ["overlap", "--json", "--streams", "2"]])
def test_no_gpu_exits_3_with_one_line(argv):
    proc = _cli(*argv)
    assert proc.returncode == cli.EXIT_NO_GPU
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"cupy-nwt {argv[0]}: ") and "disabled by CUPY_NWT_DISABLE_GPU" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize(("argv", "needle"), [
    (["bandwidth", "--min", "0"], "--min: size must be positive"),
    (["bandwidth", "--max", "foo"], "--max: not a size: 'foo'"),
    (["bandwidth", "--min", "1MiB", "--max", "4KiB"], "--min (1 MiB) is larger than --max (4 KiB)"),
    (["overlap", "--streams", "3", "--elements", "10"], "multiple of --streams"),
])
def test_bad_input_exits_2_with_one_line_even_without_gpu(argv, needle):
    proc = _cli(*argv)
    assert proc.returncode == cli.EXIT_USAGE
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("argv", "needle"), [
    (["bandwidth", "--factor", "1"], "--factor must be >= 2"),
    (["bandwidth", "--factor", "two"], "--factor must be a whole number"),
    (["bandwidth", "--repeats", "0"], "--repeats must be >= 1"),
    (["bandwidth", "--warmup", "-1"], "--warmup must be >= 0"),
    (["bandwidth", "--device", "gpu0"], "--device must be a whole number"),
    (["bandwidth", "--batch-total", "1MiB", "--batch-chunk", "3KiB"], "whole multiple"),
    (["bandwidth", "--batch-chunk", "1.5.2"], "--batch-chunk: not a size"),
    (["overlap", "--streams", "0"], "--streams must be >= 1"),
    (["overlap", "--elements", "lots"], "--elements must be a whole number"),
])
def test_bad_options_in_process(argv, needle, capsys):
    assert cli.main([*argv, "--no-progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_output_that_is_a_directory_fails_before_the_run(tmp_path, capsys):
    assert cli.main(["overlap", "--output", str(tmp_path), "--no-progress"]) == cli.EXIT_USAGE
    assert "is a directory" in capsys.readouterr().err


def test_plot_without_matplotlib_is_a_usage_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(plots, "matplotlib_available", lambda: False)
    assert cli.main(["bandwidth", "--plot", str(tmp_path / "bw.png"), "--no-progress"]) == cli.EXIT_USAGE
    assert "needs matplotlib" in capsys.readouterr().err


def test_no_gpu_in_process_prints_no_progress_bar(monkeypatch, capsys):
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(False, "no usable GPU: test says so"))
    assert cli.main(["bandwidth"]) == cli.EXIT_NO_GPU
    out = capsys.readouterr()
    assert out.err == "cupy-nwt bandwidth: no usable GPU: test says so\n" and out.out == ""


# ------------------------------------------------------------------------------------ GPU

@pytest.mark.gpu
def test_bandwidth_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "bw.json", tmp_path / "bw.png"
    argv = ["bandwidth", "--min", "1MiB", "--max", "4MiB", "--repeats", "3", "--warmup", "1",
            "--batch-total", "4MiB", "--json", "--output", str(out), "--plot", str(png), "--no-progress"]
    assert cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads(out.read_text())
    assert printed["verified"] is True and saved["config"]["sizes"] == [1 << 20, 2 << 20, 4 << 20]
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.gpu
def test_overlap_prints_a_table(capsys):
    assert cli.main(["overlap", "--streams", "2", "--repeats", "3", "--warmup", "1", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "async_v1" in text and "ideal pipelined" in text
