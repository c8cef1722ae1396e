"""bench/make_figures.py: the pictures and the generated results blocks match the committed result files
(CI runs ``--check`` too); a changed result file or a hand-edited block is named as stale."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the pictures need matplotlib (the plot extra)")
ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("make_figures", ROOT / "bench" / "make_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_committed_pictures_and_blocks_are_current(capsys):
    assert load().main(["--check"]) == 0, capsys.readouterr().err


def test_a_hand_edit_or_a_changed_result_file_is_stale(tmp_path, monkeypatch, capsys):
    mf = load()
    page = tmp_path / "results.md"
    page.write_text((ROOT / "docs" / "results.md").read_text(encoding="utf-8").replace("GPU runs so far", "GPU runs"))
    monkeypatch.setattr(mf, "PAGES", {page: "figures/"})
    assert mf.main(["--check"]) == 1
    assert "results.md" in capsys.readouterr().err
    sources = tmp_path / "sources.json"
    doc = json.loads((ROOT / "docs" / "figures" / "sources.json").read_text(encoding="utf-8"))
    doc["tuner.png"]["sha256"] = "0" * 64  # as if nwt/report.json had changed since the picture was drawn
    sources.write_text(json.dumps(doc))
    monkeypatch.setattr(mf, "PAGES", {})
    monkeypatch.setattr(mf, "SOURCES", sources)
    assert mf.main(["--check"]) == 1
    assert "docs/figures/" in capsys.readouterr().err


@pytest.mark.parametrize(("rel", "damage", "said"), [
    ("nwt/report.json", lambda text: text[:500], "nwt/report.json: not a readable JSON result (Expecting"),
    ("gpu-tests/junit.xml", lambda text: text[:100], "gpu-tests/junit.xml: not valid JUnit XML (unclosed token"),
    ("nwt/report.json", lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "comparison"}),
     "NVIDIA-H200: NWT picks on 0..15 workers: its result files lack or garble a field (KeyError: 'comparison')"),
])
def test_a_cut_or_garbled_result_file_is_one_line_naming_it(rel, damage, said, tmp_path, monkeypatch):
    mf = load()
    results = tmp_path / "results"
    shutil.copytree(ROOT / "bench" / "results", results, ignore=shutil.ignore_patterns("vm-2cpu"))
    target = results / "NVIDIA-H200" / rel
    target.write_text(damage(target.read_text(encoding="utf-8")), encoding="utf-8")
    monkeypatch.setattr(mf, "RESULTS", results)
    monkeypatch.setattr(mf, "sources", lambda runs: {})  # its hashes name files by their place in the repository
    with pytest.raises(SystemExit) as info:
        mf.main(["--check"])
    line = str(info.value.code)
    assert line.startswith("make_figures: ") and said in line and "\n" not in line
