"""bench/studies/does_the_gpu_decode_jpegs/decode_placement.py: run dry (a tiny set, both placements with the
decoder's CPU stand-in), and its result file says what was picked and why."""

import importlib.util
import json
from pathlib import Path

import pytest

STUDY = Path(__file__).resolve().parents[2] / "bench" / "studies" / "does_the_gpu_decode_jpegs" / "decode_placement.py"


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None and importlib.util.find_spec("skimage") is None,
                    reason="the study's photographs come from scikit-learn or scikit-image, neither installed")
def test_dry_run_measures_both_placements_and_writes_the_pick(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("decode_placement_study", STUDY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--dry-run", "--out-dir", str(tmp_path)]) == 0
    (out,) = tmp_path.glob("decode_placement-dry-run-*.json")
    doc = json.loads(out.read_text())
    pick = doc["pick"]
    assert doc["dry_run"] is True and doc["step_s"] == 0.005 and doc["set"]["images"] == 16
    assert pick["placement"] in ("cpu", "gpu") and [c["placement"] for c in pick["candidates"]] == ["cpu", "gpu"]
    assert all(c["seconds_per_iteration"] for c in pick["candidates"])
    assert capsys.readouterr().out.strip() == pick["why"]
