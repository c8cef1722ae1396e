"""The CI step that compiles every run-time kernel for sm_90 with nvcc, warnings as errors (no GPU needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cupy_nwt.experiments import kernel_check, kernels

ROOT = Path(__file__).resolve().parents[2]
NVCC = kernel_check.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed here (PATH, CUDA_HOME, /usr/local/cuda)")


def test_every_kernel_the_package_compiles_at_run_time_is_listed():
    """A kernel compiled from a source the check does not know would escape it."""
    listed = {k.path.name for k in kernels.SOURCES}
    assert listed == {p.name for p in kernels.SOURCE_DIR.glob("*.cu")}
    for k in kernels.SOURCES:
        assert f'extern "C" __global__ void {k.name}(' in k.text
    text = "\n".join(p.read_text() for p in (ROOT / "cupy_nwt").rglob("*.py"))
    assert "RawModule" not in text and "ElementwiseKernel(" not in text  # every kernel goes through kernels.py


@needs_nvcc
def test_every_run_time_kernel_compiles_clean_for_sm_90():
    proc = subprocess.run([sys.executable, "-m", "cupy_nwt.experiments.kernel_check"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("compiles clean for sm_90") == len(kernels.SOURCES)


@needs_nvcc
def test_a_warning_fails_the_check(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(float* a) { int unused = 3; a[0] = 1.0f; }\n')
    check = kernel_check.compile_check(bad, "sm_90")
    assert not check.clean and check.returncode != 0 and "unused" in check.log
    good = tmp_path / "good.cu"
    good.write_text('extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n')
    assert kernel_check.compile_check(good, "sm_90").clean


def test_without_nvcc_the_step_says_so_and_skips(monkeypatch, capsys):
    monkeypatch.setattr(kernel_check, "find_nvcc", lambda: None)
    assert kernel_check.main([]) == 0
    out = capsys.readouterr().out
    assert "nvcc not found" in out and "skipped" in out


def test_a_broken_compiler_is_a_failure_not_a_skip(tmp_path, capsys):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'nvcc fatal   : broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert kernel_check.main(["--nvcc", str(fake)]) == 1
    assert "FAILED cupy_nwt_spin" in capsys.readouterr().err
