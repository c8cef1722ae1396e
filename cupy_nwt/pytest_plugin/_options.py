"""The gate's command-line options: how each is parsed, its default, and whether a run asked for the gate.

Kept apart from the gate's machinery so that a pytest run that gives none of them, in any project that
has cupy-nwt installed, imports this and nothing heavier (the plugin loads in every pytest session).
"""

from __future__ import annotations

import argparse
import re

import pytest

#: exact instruction counts move by less than 0.1% between runs of the same code
DEFAULT_INSTRUCTIONS_DROP_PCT = 1.0
DEFAULT_TARGET_NOISE_PCT = 1.0
DEFAULT_MAX_SECONDS = 15.0
#: the oldest pytest the gate runs under (the test extra's floor); older ones get no gate, and a line saying why
OLDEST_PYTEST = (7, 4)
#: the options that turn the gate on (each asks for a comparison, a file or a run beside this one)
GATE_OPTIONS = {"nwt_throughput_drop": "--nwt-throughput-drop", "nwt_baseline": "--nwt-baseline",
                "nwt_save_baseline": "--nwt-save-baseline", "nwt_require_baseline": "--nwt-require-baseline",
                "nwt_against": "--nwt-against"}


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r} (example: 20 for 20%)") from None
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError(f"a percentage between 0 and 100 is needed, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"seconds must be > 0 and at most a day, got {text!r}")
    return value


def add_options(parser: pytest.Parser) -> None:
    """Register the ``--nwt-*`` options under their own heading of ``pytest --help``."""
    group = parser.getgroup("cupy_nwt", "cupy_nwt throughput gate")
    group.addoption(
        "--nwt-throughput-drop", type=_percent, default=None, metavar="PCT",
        help="fail the run when a judged figure (the exact cost per sample against the baseline; samples/s "
        "and CPU per sample against --nwt-against REV; GB/s) got worse by more than its limit (PCT percent; "
        "--nwt-instructions-drop for exact counts) and beyond the 95%% interval of the change",
    )
    group.addoption(
        "--nwt-baseline", default=None, metavar="FILE.json",
        help="the baseline to compare with: a file written by --nwt-save-baseline (or pytest-benchmark's "
        "--benchmark-json); a missing file is a note, or an error with --nwt-require-baseline",
    )
    group.addoption(
        "--nwt-save-baseline", default=None, metavar="FILE.json",
        help="write this run's figures, machine and pipeline to FILE.json, to commit and compare with later",
    )
    group.addoption(
        "--nwt-require-baseline", action="store_true", default=False,
        help="CI mode: fail when the --nwt-baseline file, or a benchmark's entry in it, is missing",
    )
    group.addoption(
        "--nwt-against", default=None, metavar="REV",
        help="measure the git revision REV (a worktree of it) beside this run, round for round in the same job, "
        "and judge samples/s and CPU per sample by the pairs' ratios (what a baseline from another hour cannot)",
    )
    group.addoption(
        "--nwt-instructions", choices=("auto", "off"), default="auto",
        help="auto (default): count each loader benchmark's cost per sample (instructions, simulated cache misses, "
        "page faults, system calls) under valgrind's callgrind where valgrind is installed (exact: the deciding "
        "figure for CPU-bound pipelines); off: do not",
    )
    group.addoption(
        "--nwt-instructions-drop", type=_percent, default=DEFAULT_INSTRUCTIONS_DROP_PCT, metavar="PCT",
        help="the limit for the exact counts (cost and instructions per sample) once the gate is on "
        "(default %(default)s)",
    )
    group.addoption(
        "--nwt-target-noise", type=_percent, default=DEFAULT_TARGET_NOISE_PCT, metavar="PCT",
        help="loader_benchmark runs rounds until the 95%% interval of its deciding figure's median is within "
        "+-PCT percent (default %(default)s) ...",
    )
    group.addoption(
        "--nwt-max-seconds", type=_seconds, default=DEFAULT_MAX_SECONDS, metavar="S",
        help="... or until S seconds of rounds have passed (default %(default)s)",
    )


def gate_asked(config: pytest.Config) -> list[str]:
    """The gate's options this run gave (``--benchmark-compare`` too: the gate reads what it selects)."""
    given = [flag for dest, flag in GATE_OPTIONS.items() if config.getoption(dest, None) not in (None, False)]
    if config.getoption("benchmark_compare", None):
        given.append("--benchmark-compare")
    return given


def too_old(version: str) -> bool:
    """Whether ``version`` (pytest's) is older than the gate runs under; an unreadable one is not."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return m is not None and (int(m.group(1)), int(m.group(2))) < OLDEST_PYTEST
