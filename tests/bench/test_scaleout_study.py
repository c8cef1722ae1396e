"""Two ranks on one GPU in an exclusive compute mode: bench/scaleout.py says so in one line."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from cupy_nwt import cuda

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench():
    spec = importlib.util.spec_from_file_location("bench_scaleout_exclusive", ROOT / "bench" / "studies" / "does_it_scale_over_ranks" / "scaleout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_gpu(monkeypatch):
    def use(mode: str) -> None:
        monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 1))
        monkeypatch.setattr(cuda, "compute_mode", lambda device: mode)

    return use


def test_sharing_an_exclusive_gpu_is_refused_with_the_reason(bench, one_gpu):
    one_gpu("exclusive-process")
    assert bench.sharing_refusal(1) is None  # one rank, one GPU: nothing is shared
    why = bench.sharing_refusal(2)
    assert why is not None and "\n" not in why
    assert "GPU 0" in why and "exclusive-process compute mode" in why


def test_default_mode_lets_ranks_share(bench, one_gpu):
    one_gpu("default")
    assert bench.sharing_refusal(4) is None


def test_main_skips_the_shared_counts_in_one_line_and_never_launches_them(bench, one_gpu, monkeypatch, capsys):
    one_gpu("exclusive-process")

    def no_launch(*a, **k):
        raise AssertionError("a refused rank count was launched")

    monkeypatch.setattr(bench, "launch", no_launch)
    assert bench.main(["--ranks", "2"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("scaleout: 2 ranks would share GPU 0")


def test_a_rank_refused_by_the_driver_is_one_line(bench, monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "torchrun_path", lambda: "torchrun")
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="Traceback ...\ncupy_backends.cuda.api.runtime."
                                         "CUDARuntimeError: cudaErrorDevicesUnavailable: CUDA-capable device(s) is/are "
                                         "busy or unavailable\n")
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: failed)
    args = bench.argparse.Namespace(samples=10, batch_size=2, batches=1, warmup=0, workers="0")
    with pytest.raises(SystemExit) as info:
        bench.launch(2, args, tmp_path / "k2")
    text = str(info.value.code)
    assert "\n" not in text and "exclusive compute mode" in text and "Traceback" not in text



@pytest.mark.parametrize("argv", [["--warmup", "0"], ["--batches", "0"]])
def test_a_window_without_warm_up_or_batches_is_refused_in_one_line(bench, argv, capsys):
    with pytest.raises(SystemExit) as info:
        bench.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--warmup and --batches must be >= 1" in err and "Traceback" not in err
