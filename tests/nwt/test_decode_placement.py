"""The decode placement the tuner picks: CPU workers against a GPU decode fed by readers, judged by the
consumer's loop with the user's step, the fewer workers among placements within noise, the GPU
placement reported (not measured) where no GPU decodes, and one real run of both placements with the
decoder's CPU stand-in.

Decisions run on fake trials (``measure={"cpu": ..., "gpu": ...}``) that report the consumer's loop,
its wait and the step's time as the real trial does, so no assertion depends on timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cupy_nwt import PlacementResult, TuneResult, system, tune_decode_placement
from cupy_nwt.data import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageFolder,
    RandomResizedCrop,
    TarImageDataset,
    gpu_decode_status,
    write_tar_shard,
)
from cupy_nwt.errors import ArgumentError
from cupy_nwt.nwt.trials import Measurement

STEP = 0.005
NORMALIZE = (IMAGENET_MEAN, IMAGENET_STD)
no_gpu_decode = pytest.mark.skipif(gpu_decode_status()[0], reason="this machine decodes JPEGs on its GPU")


def _photos(root: Path, count: int = 12, size: tuple[int, int] = (72, 96)) -> Path:
    """Photo-like JPEGs (smooth gradients with grain, not noise, which compresses unlike photos) in two classes."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:size[0], 0:size[1]]
    for k in range(count):
        (root / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        base = np.stack([(2 * x + 30 * k) % 256, (3 * y + 10 * k) % 256, (x + y + 50 * k) % 256], -1)
        pixels = np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / f"c{k % 2}" / f"{k}.jpg", quality=90)
    return root


@pytest.fixture
def photos(tmp_path: Path) -> ImageFolder:
    return ImageFolder(_photos(tmp_path / "photos"), transform=RandomResizedCrop(32, flip_p=0.5, normalize=NORMALIZE))


def _loop(waits: dict[int, float], step: float = STEP, rel_error: float = 0.002):
    """A fake trial: a wait fraction f makes the consumer's loop step / (1 - f) seconds a batch."""
    def measure(workers: int, iterations: int, warmup: int) -> Measurement:
        f = waits[workers]
        spi = step / (1 - f)
        return Measurement(spi, spi * (iterations + warmup), rel_error=rel_error, wait_fraction=f, step_seconds=step)
    return measure


def _tune(ds: ImageFolder, cpu: dict[int, float], gpu: dict[int, float] | None = None, **kw) -> PlacementResult:
    fakes = {"cpu": _loop(cpu)} | ({"gpu": _loop(gpu)} if gpu is not None else {})
    return tune_decode_placement(ds, STEP, batch_size=4, max_workers=len(cpu), iterations=100, measure=fakes,
                                 gpu_stand_in=gpu is not None, progress=False, warn=False, **kw)


@no_gpu_decode
def test_without_a_gpu_the_gpu_placement_is_reported_not_measured(photos):
    result = _tune(photos, {0: 0.6, 1: 0.3, 2: 0.01})
    assert result.placement == "cpu" and result.best_workers == 2
    gpu = next(c for c in result.candidates if c.placement == "gpu")
    assert gpu.status == "not available" and not gpu.measured and gpu.reason == gpu_decode_status()[1]
    assert result.decided == "the only placement measured"
    assert result.why.startswith("picked cpu decode at 2 workers: 5.1 ms a batch, 1.0% waiting: the only placement")
    assert f"gpu decode: not available: {gpu.reason}" in result.why
    assert result.result.other_types == ()


def test_the_placement_whose_loop_is_shortest_wins_and_the_result_records_both(photos, tmp_path):
    result = _tune(photos, {0: 0.8, 1: 0.5, 2: 0.3}, {0: 0.5, 1: 0.02, 2: 0.02})
    assert (result.placement, result.best_workers) == ("gpu", 1)
    assert result.decided == "the shortest loop of the consumer"
    assert result.why.startswith("picked gpu decode at 1 reader: 5.1 ms a batch, 2.0% waiting")
    assert "cpu decode at 2 workers: 7.1 ms a batch, 30.0% waiting" in result.why
    tuned = result.result
    assert tuned.placement == "gpu" and tuned.why.startswith("picked 1 worker (gpu decode)")
    (cpu,) = tuned.other_types
    assert (cpu.placement, cpu.best_workers) == ("cpu", 2)
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["placement"] == "gpu" and doc["why"] == result.why
    assert [c["placement"] for c in doc["candidates"]] == ["cpu", "gpu"]
    assert json.loads(result.save(tmp_path / "placement.json").read_text())["best_workers"] == 1
    assert TuneResult.load(tuned.save(tmp_path / "tuned.json")) == tuned


def test_within_noise_the_fewer_workers_win(photos):
    result = _tune(photos, {0: 0.8, 1: 0.5, 2: 0.3, 3: 0.02}, {0: 0.5, 1: 0.021, 2: 0.02, 3: 0.02})
    assert (result.placement, result.best_workers) == ("gpu", 1)
    assert result.decided.startswith("its loop is within noise of cpu decode's, with fewer workers")


def test_within_noise_at_as_many_workers_the_cpu_placement_wins(photos):
    result = _tune(photos, {0: 0.8, 1: 0.021, 2: 0.021}, {0: 0.5, 1: 0.02, 2: 0.02})
    assert (result.placement, result.best_workers) == ("cpu", 1)
    assert result.decided == "its loop is within noise of gpu decode's, with no GPU decoding"


def test_a_pick_that_leaves_the_main_process_a_core_says_so(tmp_path):
    cpus = system.usable_cpus()
    waits = {w: (0.5 if w < cpus - 1 else 0.01 if w == cpus - 1 else 0.25) for w in range(cpus + 2)}
    ds = ImageFolder(_photos(tmp_path / "photos", count=4), transform=RandomResizedCrop(32, normalize=NORMALIZE))
    result = _tune(ds, waits)
    assert result.best_workers == cpus - 1
    clause = f"a core left to the main process: {cpus} worker{'s' * (cpus != 1)} on {cpus} usable CPU"
    assert clause in result.why and clause in result.result.why


def test_tar_shards_are_a_source_too(tmp_path):
    rng = np.random.default_rng(1)
    images = np.clip(rng.normal(128, 20, (6, 40, 50, 3)), 0, 255).astype(np.uint8)
    write_tar_shard(tmp_path / "s.tar", images, np.arange(6) % 2, fmt="jpeg")
    ds = TarImageDataset(tmp_path / "s.tar", transform=RandomResizedCrop(24, normalize=NORMALIZE))
    result = _tune(ds, {0: 0.5, 1: 0.1}, {0: 0.5, 1: 0.05})
    assert result.placement == "gpu"


def test_what_the_gpu_placement_cannot_run_is_said_and_a_bad_recipe_refused(tmp_path):
    root = _photos(tmp_path / "photos", count=4)
    uint8 = ImageFolder(root, transform=RandomResizedCrop(32))
    result = _tune(uint8, {0: 0.5, 1: 0.1}, {0: 0.5, 1: 0.05})
    gpu = next(c for c in result.candidates if c.placement == "gpu")
    assert gpu.status == "not available" and "normalize=(mean, std)" in (gpu.reason or "")
    with pytest.raises(ArgumentError, match="transform is a RandomResizedCrop"):
        tune_decode_placement(ImageFolder(root), STEP, progress=False)
    with pytest.raises(ArgumentError, match="placements 'cpu' and 'gpu'"):
        tune_decode_placement(uint8, STEP, measure={"tpu": _loop({0: 0.1})}, progress=False)


def test_both_placements_run_end_to_end_with_the_cpu_stand_in(photos):
    seen = []

    def step(batch):
        images, labels = batch
        seen.append((type(images).__module__.split(".")[0], tuple(images.shape), str(images.dtype).split(".")[-1],
                     tuple(labels.shape)))

    result = tune_decode_placement(photos, step, batch_size=4, max_workers=2, iterations=8, device="cpu",
                                   gpu_stand_in=True, progress=False, warn=False)
    assert result.placement in ("cpu", "gpu") and result.best_workers in (0, 1)
    assert {c.placement for c in result.candidates if c.measured} == {"cpu", "gpu"}
    assert result.why.startswith(f"picked {result.placement} decode at ") and "cpu decode" in result.why
    assert "gpu decode" in result.why and ("(CPU stand-in)" in result.why or not gpu_decode_status()[0])
    assert len(set(seen)) == 1 and set(seen).pop()[1:] == ((4, 3, 32, 32), "float32", (4,))  # the same from both
    json.dumps(result.to_dict())


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_decode_status()[0], reason=str(gpu_decode_status()[1]))
def test_on_a_gpu_both_placements_are_measured_and_the_step_gets_device_images(photos):
    from cupy_nwt import cuda  # noqa: PLC0415

    seen = []

    def step(batch):
        images, labels = batch
        seen.append((cuda.is_device_array(images), images.shape, labels.shape))

    result = tune_decode_placement(photos, step, batch_size=4, max_workers=2, iterations=8, device="cuda",
                                   progress=False, warn=False)
    assert [(c.placement, c.status) for c in result.candidates] == [("cpu", "measured"), ("gpu", "measured")]
    assert "(CPU stand-in)" not in result.why and result.result.placement == result.placement
    assert (True, (4, 3, 32, 32), (4,)) in seen  # the GPU placement's images are on the device
