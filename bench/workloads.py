"""The workloads and loaders the studies and the suites share: one importable module, no study importing another.

Two workloads (a tar shard of 32x32 PNG/JPEG images decoded by Pillow, and an in-memory uint8 array
transformed in batches by Numba), built deterministically under a folder; the loaders that run them
(cupy_nwt's with process or thread workers, torch's with the same per-batch work in its ``collate_fn``);
and how a study takes batches from them (``endless``, ``batch_stream``, ``timed_after``); and the gate's
pipelines, the scratch projects the gate studies run the plugin on (``pipeline_source``). A study or a
suite imports it as ``bench.workloads`` with the repository on ``sys.path``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cupy_nwt import cuda, system
from cupy_nwt.data import ArrayDataset, CifarTrainTransform, TarImageDataset, synthetic_pixels, write_tar_shard

LOADERS = ("cupy_nwt", "cupy_nwt-thread", "torch")
PREFETCH_FACTOR = 2  # batches in flight per worker, both libraries (their default)


@dataclass(frozen=True)
class Workload:
    name: str
    dataset: Any
    batch_transform: Callable[[Any, int], Any]
    description: str


def make_workloads(root: Path, decode_images: int = 5000, array_images: int = 8192, fmt: str = "png",
                   seed: int = 0) -> list[Workload]:
    """The tar-shard decode workload and the array + Numba workload, built deterministically under ``root``."""
    rng = np.random.default_rng(seed)
    n = max(decode_images, array_images)
    labels = rng.permutation(np.arange(n) % 10)
    pixels = synthetic_pixels(labels, rng)
    shard = write_tar_shard(root / f"shard-{fmt}.tar", pixels[:decode_images], labels[:decode_images], fmt=fmt)
    transform = CifarTrainTransform()
    return [
        Workload(f"decode-{fmt}", TarImageDataset(shard), transform,
                 f"{decode_images} 32x32 {fmt.upper()}s in a tar shard, Pillow decode per sample"),
        Workload("numba-array", ArrayDataset(pixels[:array_images], labels[:array_images]), transform,
                 f"{array_images} 32x32x3 uint8 images in memory, Numba batch transform only"),
    ]


def default_workers(cpus: int | None = None) -> list[int]:
    """0, 1, 2, 4, ... up to the usable CPUs (always including that count); $CUPY_NWT_BENCH_WORKERS overrides."""
    env = os.environ.get("CUPY_NWT_BENCH_WORKERS")
    if env:
        try:
            return parse_workers(env)
        except ValueError as exc:
            raise ValueError(f"CUPY_NWT_BENCH_WORKERS: {exc}") from None
    cpus = cpus or system.usable_cpus()
    out, w = [0, 1], 2
    while w < cpus:
        out.append(w)
        w *= 2
    return sorted(set(out + [cpus]))


def parse_workers(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"workers must be comma-separated integers, got {text!r}") from None
    if not values or values[0] < 0:
        raise ValueError(f"workers must be non-negative integers, got {text!r}")
    return values


class TorchCollate:
    """torch's side of the same per-batch work: stack the samples, run the batch transform, wrap as tensors."""

    def __init__(self, batch_transform: Callable[[Any, int], Any] | None) -> None:
        self.batch_transform = batch_transform
        self._count = 0

    def __call__(self, samples: list[tuple[np.ndarray, Any]]) -> tuple[Any, Any]:
        import torch  # noqa: PLC0415

        batch = (np.stack([s[0] for s in samples]), np.array([s[1] for s in samples], dtype=np.int64))
        if self.batch_transform is not None:
            self._count += 1
            batch = self.batch_transform(batch, (os.getpid() << 24) + self._count)
        return torch.from_numpy(np.ascontiguousarray(batch[0])), torch.from_numpy(batch[1])


def timed_after(warmup: int, num_workers: int, prefetch_factor: int = PREFETCH_FACTOR) -> int:
    """Batches to take before the clock starts: ``warmup`` plus every batch the workers make during start-up.

    Workers fill ``num_workers * prefetch_factor`` batches while the first one is awaited; timed,
    those come out of the queue at once, and at 15 workers 30 of them would be a whole 30-batch
    window (torch's 1,030,522 samples/s on the H200 was that queue, not decoding).
    """
    if warmup < 1 or num_workers < 0 or prefetch_factor < 1:
        raise ValueError(f"need warmup >= 1, num_workers >= 0, prefetch_factor >= 1; got {warmup}, {num_workers}, "
                         f"{prefetch_factor}")
    return warmup + num_workers * prefetch_factor


def make_loader(kind: str, workload: Workload, num_workers: int, batch_size: int, device: str, seed: int) -> Any:
    """A loader of ``kind`` (one of ``LOADERS``) over the workload; process workers are forked.

    Workers persist across epochs (both libraries): the drained warm-up (``timed_after``) and the timed
    batches can pass an epoch's end, where a restart would be timed instead of loading.
    """
    persistent = num_workers > 0
    if kind in ("cupy_nwt", "cupy_nwt-thread"):
        from cupy_nwt import DataLoader  # noqa: PLC0415

        threads = kind == "cupy_nwt-thread"
        return DataLoader(workload.dataset, batch_size=batch_size, shuffle=True, seed=seed, num_workers=num_workers,
                          device=device, pin_memory=device == "cuda", batch_transform=workload.batch_transform,
                          multiprocessing_context=None if device == "cuda" or threads or not num_workers else "fork",
                          worker_type="thread" if threads else "process", prefetch_factor=PREFETCH_FACTOR,
                          persistent_workers=persistent)
    if kind == "torch":
        import torch  # noqa: PLC0415

        return torch.utils.data.DataLoader(
            workload.dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers,
            collate_fn=TorchCollate(workload.batch_transform), pin_memory=device == "cuda",
            prefetch_factor=PREFETCH_FACTOR if num_workers else None, generator=torch.Generator().manual_seed(seed),
            multiprocessing_context="fork" if num_workers else None, persistent_workers=persistent)
    raise ValueError(f"unknown loader {kind!r}: use one of {', '.join(LOADERS)}")


def endless(loader: Any) -> Iterator[Any]:
    """Batches forever, epoch after epoch, as training takes them: ``set_epoch`` first where the loader has it."""
    epoch = 0
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def batch_stream(loader: Any, kind: str, device: str) -> Iterator[int]:
    """Batch sizes forever, epoch after epoch; each batch is on ``device`` and finished when yielded."""
    for x, _ in endless(loader):
        if device == "cuda":
            if kind == "torch":
                import torch  # noqa: PLC0415

                x = x.to("cuda", non_blocking=True)
                torch.cuda.current_stream().synchronize()
            else:
                cuda.current_stream().synchronize()
        yield int(x.shape[0])


def close_loader(loader: Any) -> None:
    if hasattr(loader, "close"):
        loader.close()
    else:  # torch: dropping the iterator shuts its workers down
        del loader


def worker_pids(loader: Any) -> Callable[[], list[int]]:
    """The loader's worker PIDs: cupy_nwt says; torch's are this process's children."""
    if hasattr(loader, "worker_pids"):
        return loader.worker_pids
    import psutil  # noqa: PLC0415

    me = psutil.Process()
    return lambda: [c.pid for c in me.children(recursive=True)]


# ---------------------------------------------------------------- the gate's pipelines
# The scratch projects ``does_the_gate_hold/gate_noise_proof.py`` runs the gate on, and whose plants
# ``what_does_the_gate_see/cost_model.py`` counts: a NumPy loop whose work is a factor, or the docs' own
# pipeline (docs/ci-gate.md) with each regression users make planted in turn.

PIPELINE = '''import numpy as np

WORK = {work:.2f}
STEPS = 100


class LoopImages:
    """A map-style dataset whose per-sample work is a NumPy loop of round(STEPS * WORK) steps."""

    def __init__(self, n=4096):
        self.n, self.steps = n, round(STEPS * WORK)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = np.full((16, 16), float(i % 7), np.float32)
        for _ in range(self.steps):
            x = np.sqrt(x * 1.0001 + 1.0)
        return x, i % 10
'''
TEST = '''from pipeline import LoopImages


def test_loader(loader_benchmark):
    loader_benchmark(LoopImages(), batch_size=64, num_workers=2, persistent_workers=True, count_samples=64)
'''
#: --mode plants: the docs' own pipeline (docs/ci-gate.md) with each regression users make planted in turn
PLANTED = '''import os

import numpy as np

from cupy_nwt.data import CifarTrainTransform, SyntheticCIFAR10

PLANT = {plant!r}
#: Python steps a sample: about 200 instructions each, so 300 add ~10% and 60 ~2% of the ~590,000 a sample
STEPS = {{"python +10%": 300, "instructions +2%": 60}}.get(PLANT, 0)


def per_sample():
    for _ in range(STEPS):
        pass
    if PLANT == "alloc 1 MiB":
        np.ones(1 << 20, np.uint8)  # a fresh 1 MiB, every byte written
    elif PLANT == "os.stat":
        os.stat(__file__)


class Data(SyntheticCIFAR10):
    def __getitem__(self, i):
        per_sample()
        return super().__getitem__(i)

    def __getitems__(self, indices):
        for _ in indices:
            per_sample()
        return super().__getitems__(indices)


class Transform(CifarTrainTransform):
    def __call__(self, batch, seed=None):
        images, labels = super().__call__(batch, seed)
        if PLANT == "numpy passes":
            for _ in range(3):
                images = np.ascontiguousarray(images * 1.0)
        elif PLANT == "batch copy":
            images = images.copy()
        return images, labels
'''
PLANTED_TEST = '''from pipeline import Data, Transform


def test_loader(loader_benchmark):
    loader_benchmark(Data(n=4096), batch_size=128, num_workers=2, persistent_workers=True, shuffle=True, seed=0,
                     batch_transform=Transform(), batches={batches}, rounds=6, count_samples={count})
'''
PLANTS = ("python +10%", "instructions +2%", "numpy passes", "batch copy", "alloc 1 MiB", "os.stat")
MODES: dict[str, dict[str, Any]] = {
    "main": {"unchanged": 1.00, "slower 10%": 1.10}, "instructions": {"slower 2%": 1.02},
    "cpu": {"unchanged": 1.00, "slower 40%": 1.40},
    "plants": {"unchanged": "none", **{p: p for p in PLANTS}}}


def pipeline_source(mode: str, work: Any) -> str:
    """The scratch project's ``pipeline.py`` for one group: its work factor, or its plant."""
    return PLANTED.format(plant=work) if mode == "plants" else PIPELINE.format(work=work)
