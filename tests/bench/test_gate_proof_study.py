"""bench/studies/does_the_gate_hold/gate_proof.py: it runs the docs' gate example (the README's too) as written, and plants slowdowns
only through the documented variable. The proof itself (60 CI runs) is run by hand; these are its cheap
parts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "does_the_gate_hold"))
import gate_proof as gp  # noqa: E402
from planted import ENV, SlowedBatchDataset, SlowedDataset, planted, planted_cpu_us

from cupy_nwt.data.datasets import SyntheticCIFAR10


def test_the_proof_runs_the_docs_example_verbatim_which_is_the_readmes():
    body = gp.example_file(None)
    page = (gp.ROOT / "docs" / "ci-gate.md").read_text(encoding="utf-8")
    readme = (gp.ROOT / "README.md").read_text(encoding="utf-8")
    assert body.startswith("# bench/test_pipeline.py\n") and body in page and body in readme
    assert "def test_loader(loader_benchmark):" in body
    compile(body, "test_pipeline.py", "exec")


def test_a_smoke_run_may_shrink_only_the_dataset():
    small = gp.example_file(512)
    assert "SyntheticCIFAR10(n=512)" in small
    assert small.replace("n=512", "n=4096") == gp.example_file(None)


@pytest.mark.parametrize("argv", [["--runs", "0"], ["--limit", "0"], ["--limit", "100"]])
def test_bad_arguments_stop_before_any_run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        gp.main(argv)
    assert exc.value.code == 2
    assert "--runs must be >= 1 and --limit between 0 and 100" in capsys.readouterr().err


def test_the_planted_slowdown_is_off_unless_the_variable_is_set(monkeypatch):
    data = SyntheticCIFAR10(n=8)
    monkeypatch.delenv(ENV, raising=False)
    assert planted(data) is data and planted_cpu_us() is None
    monkeypatch.setenv(ENV, "0")
    wrapped = planted(data)
    assert isinstance(wrapped, SlowedBatchDataset) and len(wrapped) == 8  # the batch fetch path is kept
    assert wrapped.__getitems__([0, 1])[1][1] == data[1][1]
    monkeypatch.setenv(ENV, "250")
    plain = planted([10, 20, 30])
    assert type(plain) is SlowedDataset and plain[2] == 30 and plain.cpu_s == pytest.approx(250e-6)


@pytest.mark.parametrize("value", ["fast", "-1", "1e9"])
def test_a_bad_planted_slowdown_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ValueError, match=ENV):
        planted_cpu_us()
