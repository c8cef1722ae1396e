"""bench/make_figures.py: the pictures and the generated results blocks match the committed result files
(CI runs ``--check`` too); a changed result file or a hand-edited block is named as stale."""

from __future__ import annotations

import importlib.util
import json
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
