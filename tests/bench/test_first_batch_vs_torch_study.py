"""bench/studies/what_does_a_worker_start_cost/first_batch_vs_torch.py: a tiny run writes every cell's first and
second loader and its workers' memory; bad input stops with one line before any run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "what_does_a_worker_start_cost"))
import first_batch_vs_torch as fb  # noqa: E402


def test_a_tiny_run_writes_each_cell(tmp_path):
    out = tmp_path / "fb.json"
    assert fb.main(["--rounds", "1", "--workers", "1", "--methods", "fork", "--mains", "light", "--index", "50",
                    "--index-workers", "1", "--no-torch", "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(s["dataset"], s["runner"]) for s in doc["summary"]] == [
        ("tiny", "cupy_nwt"), ("index", "cupy_nwt"), ("array-index", "cupy_nwt")]
    for s in doc["summary"]:
        assert s["first_loader_s"]["n"] == 1 and s["second_loader_s"]["median"] > 0
        assert s["worker_uss_mib"]["median"] > 0 and s["worker_pss_mib"]["median"] > 0
        assert s["every_worker_first_loader_s"]["median"] >= s["first_loader_s"]["median"]


def test_an_images_cell_takes_batches_of_imagenet_s_size(tmp_path):
    out = tmp_path / "fb.json"
    assert fb.main(["--rounds", "1", "--workers", "1", "--methods", "fork", "--mains", "light", "--index", "0",
                    "--datasets", "images", "--no-torch", "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [s["dataset"] for s in doc["summary"]] == ["images"] and doc["batch_sizes"] == {"images": 256}
    assert fb.Images()[300].shape == (3, 224, 224)


def test_the_indexes_hold_the_same_entries():
    listed, arrays = fb.Index(3), fb.ArrayIndex(3)
    assert len(listed) == len(arrays) == 3
    assert listed[2] == arrays[2][0] and arrays[2][1] == len(listed.samples[2][0])


def test_the_module_dataset_holds_the_tiny_one_s_samples_from_a_module():
    ds = fb.module(0)
    assert len(ds) == len(fb.Tiny()) and type(ds).__module__.startswith("cupy_nwt.")
    assert (ds[7][0] == fb.Tiny()[7]).all()


@pytest.mark.parametrize(("argv", "message"), [
    (["--workers", "0"], "--workers takes counts >= 1"),
    (["--methods", "teleport"], "--methods from fork,forkserver,spawn"),
    (["--mains", "tensorflow"], "--mains from light,torch,jax"),
    (["--rounds", "0"], "--rounds and --index-workers must be >= 1"),
    (["--before", "/nonexistent"], "holds no cupy_nwt/"),
    (["--datasets", "imagenet"], "--datasets from tiny,module,images"),
])
def test_bad_arguments_stop_before_any_run(argv, message, capsys):
    assert fb.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
