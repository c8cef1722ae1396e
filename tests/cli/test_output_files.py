"""Result files: a command that fails creates nothing (no folder, no file); files that are written
get the mode the umask gives, appear whole or not at all, and create their folders only then."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import cli, cuda
from cupy_nwt._files import atomic_open
from cupy_nwt.data.datasets import write_tar_shard
from cupy_nwt.nwt.tune import tune_num_workers
from cupy_nwt.picks.store import ResultStore, TuneResult
from cupy_nwt.reporting import tables as report


@pytest.fixture(params=[0o022, 0o027, 0o077], ids=["umask022", "umask027", "umask077"])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _no_gpu(monkeypatch):
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(False, "no usable GPU: test says so"))


def _npz(path) -> None:
    np.savez(path, images=np.zeros((16, 8, 8, 3), np.uint8), labels=np.arange(16) % 10)


def _tree(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# ------------------------------------------------------------- failing commands leave nothing


@pytest.mark.parametrize("argv", [
    ["bandwidth", "--output", "{t}/a/b/bw.json", "--plot", "{t}/c/d/bw.png"],
    ["bandwidth", "--json", "--output", "{t}/a/bw.json"],
    ["overlap", "--output", "{t}/a/b/ov.json"],
])
def test_no_gpu_exit_3_creates_no_folder(argv, tmp_path, monkeypatch, capsys):
    _no_gpu(monkeypatch)
    assert cli.main([a.format(t=tmp_path) for a in argv] + ["--no-progress"]) == cli.EXIT_NO_GPU
    assert "no usable GPU" in capsys.readouterr().err
    assert _tree(tmp_path) == []


@pytest.mark.parametrize("argv", [
    ["bandwidth", "--min", "0", "--output", "{t}/a/bw.json", "--plot", "{t}/b/bw.png"],
    ["bandwidth", "--factor", "1", "--output", "{t}/a/bw.json"],
    ["overlap", "--streams", "0", "--output", "{t}/a/ov.json"],
    ["tune", "--dataset", "{t}/no-such-data", "--output", "{t}/a/t.json", "--plot", "{t}/b/t.png", "--no-save"],
    ["tune", "--dataset", "{t}/d.npz", "--max-workers", "0", "--output", "{t}/a/t.json", "--plot", "{t}/b/t.png"],
    ["tune", "--dataset", "{t}/d.npz", "--alpha", "x", "--output", "{t}/a/t.json", "--no-save"],
])
def test_bad_input_exit_2_creates_no_folder(argv, tmp_path, capsys):
    _npz(tmp_path / "d.npz")
    assert cli.main([a.format(t=tmp_path) for a in argv] + ["--no-progress"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.count("\n") == 1
    assert _tree(tmp_path) == ["d.npz"]


def test_output_below_a_file_is_refused_before_the_run(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(cuda, "require_gpu", lambda: pytest.fail("checked after the GPU, not before"))
    assert cli.main(["bandwidth", "--output", str(tmp_path / "file" / "sub" / "bw.json"),
                     "--no-progress"]) == cli.EXIT_USAGE
    assert "is a file, not a folder" in capsys.readouterr().err
    assert _tree(tmp_path) == ["file"]


def test_output_in_a_read_only_folder_is_refused(tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root may write anywhere")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    try:
        assert cli.main(["overlap", "--output", str(ro / "new" / "ov.json"), "--no-progress"]) == cli.EXIT_USAGE
        assert "is not writable" in capsys.readouterr().err
        assert _tree(tmp_path) == ["ro"]
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("option", ["--output", "--plot"])
def test_output_where_nothing_can_be_made_even_by_root_is_refused_before_the_run(option, tmp_path, capsys):
    """/proc (a read-only mount alike) passes a permission check as root: the file was refused only after
    the run, in a message naming a temporary file."""
    if not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc")
    target = f"/proc/nwt-{tmp_path.name}.{'png' if option == '--plot' else 'json'}"
    argv = ["stats", "--device", "cpu", "--synthetic-n", "64", "--batches", "2", "--no-progress", option, target]
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{option} {target}: nothing can be made in /proc" in err and ".tmp" not in err
    with pytest.raises(OSError, match=rf"No such file or directory: '{target}'$"):
        with atomic_open(target, option) as f:
            f.write(b"x")


# ------------------------------------------------------------- modes and atomic writes


def _tuned() -> TuneResult:
    return tune_num_workers(max_workers=3, strategy="paper", measure=lambda w, i, u: 0.1 / (w + 1), progress=False)


def test_every_writer_gives_the_umask_mode(tmp_path, umask):
    pytest.importorskip("matplotlib")
    from cupy_nwt.cli import plots

    want = 0o666 & ~umask
    r = _tuned()
    written = [
        report.write_json({"a": 1}, tmp_path / "new" / "r.json"),
        r.save(tmp_path / "tune.json"),
        ResultStore(tmp_path / "store").put("k", r.to_dict()),
        write_tar_shard(tmp_path / "shard.tar", np.zeros((2, 4, 4, 3), np.uint8), [0, 1]),
        plots.plot_tune(r, tmp_path / "plots" / "t.png"),
    ]
    for path in written:
        assert _mode(path) == want, (path, oct(_mode(path)), oct(want))
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_an_existing_file_is_replaced_with_the_umask_mode(tmp_path, umask):
    target = tmp_path / "r.json"
    target.write_text("old")
    target.chmod(0o600)
    report.write_json({"new": True}, target)
    assert _mode(target) == 0o666 & ~umask and target.read_text() == '{\n  "new": true\n}\n'


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "r.json"
    report.write_json({"v": 1}, target)
    with pytest.raises(TypeError, match="cannot serialise"):
        report.write_json({"v": object()}, target)
    with pytest.raises(RuntimeError), atomic_open(tmp_path / "never.bin") as f:
        f.write(b"half")
        raise RuntimeError("cut")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    assert report.to_json({"v": 1}) + "\n" == target.read_text()


def test_cli_tune_creates_output_folders_when_it_writes(tmp_path, monkeypatch, capsys, umask):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "d.npz"
    _npz(data)
    out, png = tmp_path / "new" / "deep" / "t.json", tmp_path / "other" / "t.png"
    assert cli.main(["tune", "--dataset", str(data), "--max-workers", "1", "--iterations", "8", "--batch-size", "8",
                     "--device", "cpu", "--no-progress", "--no-transform", "--no-save", "--output", str(out),
                     "--plot", str(png)]) == 0
    assert TuneResult.load(out).best_workers == 0
    assert _mode(out) == _mode(png) == 0o666 & ~umask
    capsys.readouterr()


def test_the_closing_line_names_the_plot_or_says_why_there_is_none(tmp_path):
    def drawn(png):
        png.write_bytes(b"png")
        return png

    def no_matplotlib(png):
        raise ImportError("No module named 'matplotlib'")

    out = tmp_path / "r.json"
    assert report.wrote(out, drawn) == f"wrote {out} and {tmp_path / 'r.png'}" and (tmp_path / "r.png").exists()
    assert report.wrote(out, no_matplotlib) == f"wrote {out} (no plot: matplotlib is not installed)"
