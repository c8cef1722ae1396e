"""bench/studies/does_the_gpu_decode_jpegs/gpu_decode.py: run dry through the CPU path, and refused without a GPU."""

import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cupy_nwt.data import gpu_decode_status

STUDY = Path(__file__).resolve().parents[2] / "bench" / "studies" / "does_the_gpu_decode_jpegs" / "gpu_decode.py"
needs_photographs = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None and importlib.util.find_spec("skimage") is None,
    reason="the study's photographs come from scikit-learn or scikit-image, neither installed")


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("gpu_decode_study", STUDY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_photographs
def test_dry_run_writes_every_arm_with_its_interval(study, tmp_path):
    assert study.main(["--dry-run", "--out-dir", str(tmp_path)]) == 0
    (out,) = tmp_path.glob("gpu_decode-*.json")
    result = json.loads(out.read_text())
    assert result["dry_run"] is True and result["path"] == "cpu" and result["readers"] == 2
    assert sorted(result["arms"]) == ["decode[auto/decoder]", "decode[auto/kernel]", "decode[auto:0.65/decoder]",
                                      "decode[auto:0.65/kernel]", "decode[cuda/decoder]", "decode[cuda/kernel]",
                                      "pipeline", "read", "read-cpu"] and result["errors"] == {}
    for arm in result["arms"]:
        s = result["arms"][arm]
        assert len(s["images_per_s"]) == 3 and s["interval_90"][0] <= s["median"] <= s["interval_90"][1]


@needs_photographs
def test_the_set_is_photographs_re_encoded_near_the_size_asked(study, tmp_path):
    info = study.make_set(tmp_path, 6, (75, 100), seed=1, classes=2)
    assert info["images"] == 6 and info["photographs"] in ("sklearn.datasets.load_sample_images", "skimage.data")
    for f in sorted(tmp_path.glob("*/*.jpg")):
        img = Image.open(io.BytesIO(f.read_bytes()))
        assert img.format == "JPEG" and min(img.size) >= 0.84 * 75 and max(img.size) <= 1.16 * 100
        assert np.asarray(img).std() > 5  # a photograph, not a flat field


@pytest.mark.skipif(gpu_decode_status()[0], reason="checks the machine without a GPU")
def test_without_a_gpu_it_exits_3_with_one_line(study, tmp_path, capsys):
    assert study.main(["--out-dir", str(tmp_path)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_decode: ") and not list(tmp_path.iterdir())


@pytest.mark.parametrize("args", [["--arms", "decode,fly"], ["--backend", "gpu"], ["--backend", "cuda:0.5"],
                                  ["--backend", "auto:1.5"], ["--roi", ""], ["--images", "0"]])
def test_bad_arguments_exit_2(study, args):
    with pytest.raises(SystemExit) as exc:
        study.main(args)
    assert exc.value.code == 2
