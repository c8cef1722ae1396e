"""bench/studies/do_repeated_tunes_agree/readme_example.py: it runs the README's tuner block verbatim,
with a probe that reads back what the study records (a real run builds a 50,000-image set: not here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "do_repeated_tunes_agree"))
import readme_example as rx  # noqa: E402


def test_the_block_is_the_readmes_and_the_probe_compiles():
    block = rx.readme_block()
    readme = (rx.ROOT / "README.md").read_text()
    assert block in readme and "tune_num_workers(" in block and "num_workers=\"auto\"" in block
    compile(block + rx.PROBE.format(mark=rx.MARK), "readme-example", "exec")


def test_bad_runs_exit_with_one_line(capsys):
    with pytest.raises(SystemExit):
        rx.main(["--runs", "0"])
    assert "--runs must be >= 1" in capsys.readouterr().err
