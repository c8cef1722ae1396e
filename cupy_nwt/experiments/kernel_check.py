"""Compile every run-time kernel for sm_90 with warnings as errors: the CUDA step of each CI run.

    python -m cupy_nwt.experiments.kernel_check [--arch sm_90] [--nvcc PATH]

No GPU is needed, only nvcc: this runs the compiler, never the driver or CuPy, so it stays out of
``cupy_nwt.cuda`` (the one module that talks to a GPU). Exit 0 when every kernel compiles clean, or
when there is no nvcc (the step then says so and skips); 1 when any kernel has an error or a
warning (its log is printed). No NVRTC library is needed either: CUDA toolkits without one (as on
the CI machines) still have nvcc.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import MissingPathError
from .kernels import SOURCES


@dataclass(frozen=True)
class CompileCheck:
    """One kernel source compiled for one architecture: clean only with no error and no warning."""

    source: str
    arch: str
    command: tuple[str, ...]
    returncode: int
    log: str

    @property
    def clean(self) -> bool:
        return self.returncode == 0 and not self.log


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME / $CUDA_PATH / /usr/local/cuda; None when there is none."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def compile_check(source: Path, arch: str = "sm_90", nvcc: str | None = None) -> CompileCheck:
    """Compile one kernel source to a cubin for ``arch`` with every warning an error; no GPU needed.

    The options are NVRTC's defaults for CuPy's RawKernel (device code only, C++17), so a source that
    passes here compiles at run time too. Raises ``MissingPathError`` (a ``FileNotFoundError``) without nvcc.
    """
    compiler = nvcc or find_nvcc()
    if compiler is None:
        raise MissingPathError("nvcc was not found (PATH, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda)")
    with tempfile.TemporaryDirectory(prefix="cupy_nwt-nvcc-") as tmp:
        command = (compiler, "-cubin", f"-arch={arch}", "-std=c++17", "-Werror", "all-warnings",
                   "-o", str(Path(tmp) / "kernel.cubin"), str(source))
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    return CompileCheck(str(source), arch, command, proc.returncode, (proc.stdout + proc.stderr).strip())



def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_90", help="GPU architecture to compile for (default sm_90, the H100's)")
    p.add_argument("--nvcc", default=None, help="the compiler (default: found on PATH or under CUDA_HOME)")
    args = p.parse_args(argv)
    nvcc = args.nvcc or find_nvcc()
    if nvcc is None:
        print("kernel_check: nvcc not found (PATH, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda); skipped")
        return 0
    failed = 0
    for kernel in SOURCES:
        try:
            check = compile_check(kernel.path, args.arch, nvcc)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            print(f"kernel_check: {kernel.name}: cannot run {nvcc}: {exc}", file=sys.stderr)
            return 1
        if check.clean:
            print(f"kernel_check: {kernel.name} ({kernel.path.name}) compiles clean for {args.arch}")
        else:
            failed += 1
            print(f"kernel_check: FAILED {kernel.name} ({kernel.path.name}) for {args.arch}, exit "
                  f"{check.returncode}:\n{check.log}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
