"""Where should ImageNet-size JPEGs decode to keep a 5-ms step fed: CPU workers, or the GPU fed by readers?

The tuner's answer: ``cupy_nwt.tune_decode_placement`` on the set ``gpu_decode.py`` beside this script
makes (random crops of the photographs scikit-learn ships, about 500 x 375, JPEG quality 85-95), as an
``ImageFolder`` with the ImageNet training recipe (``RandomResizedCrop(224, flip_p=0.5,
normalize=(IMAGENET_MEAN, IMAGENET_STD))``, batch 256) and a 5-ms step: slept as a GPU step where
batches go to a GPU, spun on the main process's CPU as a CPU step where they do not (``main_process``
"auto"). Each placement is searched for its own count by the fast strategy with the step in every
trial; counts 0 .. ``--max-workers``-1 (default: one per usable CPU and one more, so a count that
takes every CPU is measured beside the ones that leave the main process a core).

Without a GPU that decodes (no GPU, or no nvImageCodec) the GPU placement is reported as not available
and not measured: the decoder's CPU path (Pillow and NumPy) says nothing of a GPU. ``--gpu-stand-in``
measures it through that path anyway (a check of the script, not a figure). Writes
``decode_placement-<host>-<N>cpu.json`` beside this script (or into ``--out-dir``):

    nice -n 10 env PYTHONPATH=. python bench/studies/does_the_gpu_decode_jpegs/decode_placement.py

``--dry-run``: a tiny set, batches of 8, counts 0..1, with the stand-in: for the tests.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_decode import IMAGENET_SIZE, make_set  # noqa: E402

from cupy_nwt import system, tune_decode_placement  # noqa: E402
from cupy_nwt.data import IMAGENET_MEAN, IMAGENET_STD, ImageFolder, RandomResizedCrop, gpu_decode_status  # noqa: E402
from cupy_nwt.reporting.tables import write_json  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=256, help="distinct JPEGs in the set (default 256)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--step", type=float, default=0.005, help="the training step's seconds (default 0.005)")
    p.add_argument("--iterations", type=int, default=100,
                   help="the tuner's iterations (its default, 100: trials time 10 to 20 batches)")
    p.add_argument("--max-workers", type=int, default=0, help="counts 0..N-1 per placement (default: usable CPUs + 1)")
    p.add_argument("--gpu-stand-in", action="store_true", help="measure the GPU placement through the CPU path")
    p.add_argument("--out-dir", default=str(HERE))
    p.add_argument("--dry-run", action="store_true", help="a tiny set, small batches, the stand-in: checks this script")
    args = p.parse_args(argv)
    if args.dry_run:
        args.images, args.batch_size, args.max_workers, args.iterations, args.gpu_stand_in = 16, 8, 2, 8, True
    if min(args.images, args.batch_size, args.iterations) < 1 or args.max_workers < 0 or not args.step > 0:
        p.error("--images, --batch-size and --iterations must be >= 1, --max-workers >= 0, --step > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cpus = system.usable_cpus()
    max_workers = args.max_workers or cpus + 1
    usable, why_not = gpu_decode_status()
    tag = "dry-run" if args.dry_run else "gpu" if usable else "cpu"
    out = Path(args.out_dir) / f"decode_placement-{tag}-{platform.node() or 'host'}-{os.cpu_count()}cpu.json"
    load_start = os.getloadavg()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="decode_placement-") as tmp:
        size = (96, 128) if args.dry_run else IMAGENET_SIZE
        made = make_set(Path(tmp), args.images, size, seed=0)
        crop = RandomResizedCrop(224, flip_p=0.5, normalize=(IMAGENET_MEAN, IMAGENET_STD))
        result = tune_decode_placement(ImageFolder(tmp, transform=crop), args.step, batch_size=args.batch_size,
                                       max_workers=max_workers, iterations=args.iterations,
                                       gpu_stand_in=args.gpu_stand_in, progress=not args.dry_run, warn=False)
    doc = {
        "question": "where should ImageNet-size JPEGs decode to keep a 5-ms step fed, and at how many workers?",
        "host": platform.node(), "cpus": os.cpu_count(), "usable_cpus": cpus, "python": platform.python_version(),
        "dry_run": args.dry_run, "gpu_decode": {"usable": usable, "reason": why_not}, "set": made,
        "recipe": "RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3), flip_p=0.5, ImageNet normalize)",
        "batch_size": args.batch_size, "step_s": args.step, "iterations": args.iterations,
        "max_workers": max_workers, "gpu_stand_in": args.gpu_stand_in,
        "conditions": "shared machine: other jobs may run on the same cores; each placement's trials run "
                      "back to back (the tuner's own search, not interleaved rounds)",
        "load_average_at_start": load_start, "load_average_at_end": os.getloadavg(),
        "seconds": time.perf_counter() - began, "pick": result.to_dict()}
    write_json(doc, out)
    print(result.why)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
