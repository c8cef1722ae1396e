"""Paths as users give them: a device or a pipe (``--output /dev/stdout``), a link, the dataset itself
named again as the output, an empty string, a pipe where a file is read, a cache holding no regular
file or a newer version's store. Nothing of the user's is replaced, renamed or destroyed; what cannot
work is one line and exit 2 before any work; a reader that goes away (``| head``) ends it quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import cli, cuda

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--synthetic-n", "64", "--no-progress"]


@pytest.fixture
def no_work(tmp_path, monkeypatch):
    """A fresh cache folder; building the dataset or measuring a trial fails the test."""
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))

    def never(*args, **kwargs):
        pytest.fail("the run started before every option was checked")

    monkeypatch.setattr("cupy_nwt.cli._pipeline.subprocess.Popen", never)
    monkeypatch.setattr("cupy_nwt.data._synthetic.SyntheticCIFAR10._build_into", never)
    monkeypatch.setattr("cupy_nwt.nwt.measure.LoaderMeasure", never)
    monkeypatch.setattr(cuda, "require_gpu", never)
    return tmp_path / "cache"


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    return captured.err


def _npy(path: Path) -> Path:
    np.save(path, np.zeros((32, 4), np.float32))
    return path


def _stats(*argv: str) -> list[str]:
    return ["stats", "--batch-size", "8", "--batches", "2", "--device", "cpu", "--num-workers", "0", "--no-progress",
            *argv]


def test_an_output_that_is_a_pipe_is_written_into_not_replaced(tmp_path):
    """As ``--output /dev/stdout`` is, or a named pipe a monitoring job reads: root may replace either."""
    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert cli.main(_stats("--dataset", str(_npy(tmp_path / "d.npy")), "--output", str(fifo))) == 0
    reader.join(30)
    assert fifo.is_fifo() and got and len(json.loads(got[0])["rows"]) == 2


def test_an_output_that_is_a_link_replaces_the_file_it_names_and_stays_a_link(tmp_path):
    real, link = tmp_path / "kept" / "stats.json", tmp_path / "stats.json"
    real.parent.mkdir()
    real.write_text("{}")
    link.symlink_to(real)
    assert cli.main(_stats("--dataset", str(_npy(tmp_path / "d.npy")), "--output", str(link))) == 0
    assert link.is_symlink() and len(json.loads(real.read_text())["rows"]) == 2
    assert sorted(p.name for p in real.parent.iterdir()) == ["stats.json"]


@pytest.mark.parametrize(("argv", "needle"), [
    (["--output", "{t}/d.npy"], "--output {t}/d.npy is the --dataset itself"),
    (["--output", "{t}/link.npy"], "--output {t}/link.npy is the --dataset itself"),
    (["--output", "{t}/same.png", "--plot", "{t}/same.png"], "--output and --plot name one file"),
])
def test_one_file_named_twice_is_refused_before_the_run(argv, needle, tmp_path, capsys, no_work):
    pytest.importorskip("matplotlib")
    data = _npy(tmp_path / "d.npy")
    (tmp_path / "link.npy").symlink_to(data)
    before = data.read_bytes()
    argv = [a.format(t=tmp_path) for a in argv]
    assert cli.main(_stats("--dataset", str(data), *argv)) == cli.EXIT_USAGE
    assert needle.format(t=tmp_path) in _one_line(capsys)
    assert data.read_bytes() == before and not (tmp_path / "same.png").exists()


@pytest.mark.parametrize("argv", [
    ["tune", "--dataset", "", "--no-save"], ["tune", "--output", "", "--no-save"], ["stats", "--plot", ""],
    ["reproduce", "--out", ""], ["bandwidth", "--output", ""],
])
def test_an_empty_string_is_refused_not_taken_for_no_value(argv, capsys, no_work):
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, *SMALL[-1:]])
    assert exc.value.code == cli.EXIT_USAGE
    option = next(a for a, b in zip(argv, argv[1:]) if b == "")
    assert f"{option} needs a value, got an empty string" in _one_line(capsys)


def test_a_dataset_that_is_a_pipe_is_refused_not_read_for_ever(tmp_path, capsys, no_work):
    os.mkfifo(tmp_path / "d.npy")
    assert cli.main(_stats("--dataset", str(tmp_path / "d.npy"))) == cli.EXIT_USAGE
    assert "is no regular file or folder (a pipe, a device)" in _one_line(capsys)


@pytest.mark.parametrize("store", ["pipe", "newer"])
def test_a_store_the_pick_cannot_be_saved_in_is_refused_before_the_search(store, tmp_path, capsys, no_work):
    no_work.mkdir()
    path = no_work / "num_workers.json"
    if store == "pipe":
        os.mkfifo(path)
    else:
        path.write_text(json.dumps({"format": "cupy_nwt.num_workers/9", "results": {}}))
    assert cli.main(["tune", "--dataset", str(_npy(tmp_path / "d.npy")), "--no-progress"]) == cli.EXIT_USAGE
    err = _one_line(capsys)
    assert ("is no regular file: it is left as it is" if store == "pipe" else "written by a newer cupy_nwt") in err
    assert path.is_fifo() if store == "pipe" else json.loads(path.read_text())["format"].endswith("/9")


@pytest.mark.parametrize("own", [True, False], ids=["dataset", "synthetic"])
def test_no_save_is_offered_only_where_it_would_help(own, tmp_path, capsys, no_work):
    """The synthetic CIFAR-10 is kept in the cache folder too: there ``--no-save`` would fail the same way."""
    no_work.mkdir()
    (no_work / "num_workers.json.lock").mkdir()  # no lock can be made: as a read-only folder would be
    argv = ["--dataset", str(_npy(tmp_path / "d.npy"))] if own else ["--synthetic-n", "64"]
    assert cli.main(["tune", *argv, "--no-progress"]) == cli.EXIT_USAGE
    assert ("or pass --no-save" in _one_line(capsys)) is own


def test_a_size_beyond_this_machine_s_memory_is_refused_before_the_gpu(capsys, no_work):
    assert cli.main(["bandwidth", "--max", "100000000000000000000", "--no-progress"]) == cli.EXIT_USAGE
    assert "of host buffers, more than the" in _one_line(capsys)
    assert cli.main(["overlap", "--streams", "99999999", "--no-progress"]) == cli.EXIT_USAGE
    assert "of host buffers, more than the" in _one_line(capsys)


def test_a_warning_is_one_line_named_by_the_command(tmp_path, capsys):
    argv = _stats("--dataset", str(_npy(tmp_path / "d.npy")))
    argv[argv.index("--num-workers") + 1] = str((os.cpu_count() or 1) + 1)
    assert cli.main(argv) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warned and all(line.startswith("cupy-nwt stats: warning: ") for line in warned)


@pytest.mark.parametrize("argv", [["info"], []], ids=["info", "no-command"])
def test_a_reader_that_went_away_ends_the_command_quietly(tmp_path, argv):
    """``cupy-nwt info | head -1``: the pipe closes under the command, which stops without a word (with no
    command, its short help printed a traceback)."""
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as closed:
        done = subprocess.run([sys.executable, "-m", "cupy_nwt", *argv], stdout=closed, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, timeout=120)
    assert (done.returncode, done.stderr) == (cli.EXIT_PIPE, "")


def test_the_short_help_to_a_full_disk_is_one_line(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "cupy_nwt"], stdout=full, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, timeout=120)
    assert done.returncode == cli.EXIT_FAILED
    assert done.stderr == "cupy-nwt: cannot write the help: No space left on device\n", done.stderr


def test_an_out_folder_the_system_will_not_make_names_the_option_not_a_temporary_file(capsys, no_work):
    """``/proc`` passes the writability check (root) and refuses the folder: the line named an internal
    ``.x.<hex>.tmp`` folder; it names ``--out`` and where."""
    assert cli.main(["reproduce", "--out", "/proc/cupy_nwt_out"]) == cli.EXIT_USAGE
    line = _one_line(capsys)
    assert "--out /proc/cupy_nwt_out: nothing can be made in /proc" in line and ".tmp" not in line


def test_an_image_folder_with_an_empty_class_is_bad_input_said_without_a_python_only_remedy(tmp_path, capsys):
    from PIL import Image

    for c in ("a", "b"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "imgs" / "a" / "x.png")
    assert cli.main(_stats("--dataset", str(tmp_path / "imgs"))) == cli.EXIT_USAGE  # as a folder with no image at all
    line = _one_line(capsys)
    assert "in the class folders 'b' of" in line and "remove them" in line and "pass allow_empty" not in line
