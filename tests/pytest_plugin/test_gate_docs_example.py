"""docs/ci-gate.md's own example as a user runs it: three NumPy passes over each batch fail the gate on its
cost per sample (one line naming the figure and the rise), unchanged code beside a busy neighbour passes.

The pipeline file is taken from the page itself; the only change is the timed run (a fixed 12 batches in
6 rounds, no clock is judged) and the counted samples (128), so the test costs three counts under callgrind.
Needs valgrind; skipped with the reason where it is missing.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_projects import FAST_CONFTEST

from cupy_nwt.pytest_plugin._callgrind import callgrind_unavailable_reason

pytest_plugins = ["pytester"]
NO_VALGRIND = callgrind_unavailable_reason()
# The passes cost memory traffic, not instructions; which kind dominates depends on the versions: page faults
# with NumPy 2.4 on Python 3.11, last-level misses with NumPy 2.5 on Python 3.12.
MEMORY = "(page faults|LL misses)"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "ci-gate.md"
PASSES = '''

class ThreePasses(CifarTrainTransform):
    def __call__(self, batch, seed=None):
        images, labels = super().__call__(batch, seed)
        for _ in range(3):
            images = np.ascontiguousarray(images * 1.0)
        return images, labels
'''


def docs_pipeline() -> str:
    """The page's ``bench/test_pipeline.py``, with the transfer test left out (it needs a GPU)."""
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(r"```python\n(# bench/test_pipeline\.py\n.*?)```", text, re.S)
    assert block is not None, "docs/ci-gate.md lost its bench/test_pipeline.py block"
    code = block.group(1).split("\n@pytest.mark.parametrize")[0]
    assert "batch_transform=CifarTrainTransform()" in code
    return code.replace("seed=0,", "seed=0, batches=12, rounds=6, count_samples=128,")


@pytest.mark.slow
@pytest.mark.skipif(NO_VALGRIND is not None, reason=f"needs valgrind: {NO_VALGRIND}")
def test_the_docs_example_fails_three_numpy_passes_and_passes_unchanged_code(pytester):
    pytester.makeconftest(FAST_CONFTEST)
    pytester.makeini("[pytest]\naddopts = -p no:hypothesispytest -p no:cacheprovider\n")
    plain = docs_pipeline()
    bench = pytester.mkdir("bench")
    (bench / "test_pipeline.py").write_text(plain)
    gate = ("--nwt-baseline=bench/baseline.json", "--nwt-require-baseline", "--nwt-throughput-drop=5")
    pytester.runpytest_subprocess("bench/test_pipeline.py", "--nwt-save-baseline=bench/baseline.json",
                                  ).assert_outcomes(passed=1)

    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        unchanged = pytester.runpytest_subprocess("bench/test_pipeline.py", *gate)
    finally:
        neighbour.kill()
        neighbour.wait()
    assert unchanged.ret == 0, unchanged.stdout.str()[-3000:]
    unchanged.stdout.fnmatch_lines(["*cost/sample * -> * [[]baseline bench/baseline.json[]]"])

    (bench / "test_pipeline.py").write_text(plain.replace("batch_transform=CifarTrainTransform()",
                                                          "batch_transform=ThreePasses()")
                                            + "import numpy as np\n" + PASSES)
    planted = pytester.runpytest_subprocess("bench/test_pipeline.py", *gate)
    assert planted.ret == 1, planted.stdout.str()[-3000:]
    failed = [line for line in planted.stdout.lines if " rose " in line and "(more than" in line]
    assert len(failed) == 1, failed
    assert re.match(r"bench/test_pipeline\.py::test_loader: cost/sample rose \d+\.\d% \(more than 1%\): [\d,.]+ -> "
                    rf"[\d,.]+; most of it {MEMORY}", failed[0]), failed[0]


def _git(path: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                   capture_output=True)


@pytest.mark.slow
@pytest.mark.skipif(NO_VALGRIND is not None, reason=f"needs valgrind: {NO_VALGRIND}")
def test_against_the_base_revision_the_numpy_passes_fail_on_its_cost_counted_in_the_same_job(pytester):
    """No stored baseline: HEAD is the docs' pipeline, the working tree adds the passes; both are counted."""
    pytester.makeconftest(FAST_CONFTEST)
    pytester.makeini("[pytest]\naddopts = -p no:hypothesispytest -p no:cacheprovider\n")
    plain = docs_pipeline()
    bench = pytester.mkdir("bench")
    (bench / "test_pipeline.py").write_text(plain)
    _git(pytester.path, "init", "-q")
    _git(pytester.path, "add", "-A")
    _git(pytester.path, "commit", "-qm", "base")
    (bench / "test_pipeline.py").write_text(plain.replace("batch_transform=CifarTrainTransform()",
                                                          "batch_transform=ThreePasses()")
                                            + "import numpy as np\n" + PASSES)
    result = pytester.runpytest_subprocess("bench/test_pipeline.py", "--nwt-against=HEAD", "--nwt-throughput-drop=5",
                                           "--nwt-max-seconds=1")
    assert result.ret == 1, result.stdout.str()[-3000:]
    failed = [line for line in result.stdout.lines if " rose " in line and "cost/sample" in line]
    assert len(failed) == 1, result.stdout.str()[-3000:]
    assert re.search(rf"test_loader: cost/sample rose \d+\.\d% \(more than 1%\): [\d,.]+ -> [\d,.]+; most of it "
                     rf"{MEMORY}, .*\[baseline HEAD \(\w+\), same job\]$", failed[0]), failed[0]
