"""Does the GPU decode JPEGs fast enough? Images/s of ``GpuJpegDecoder`` on ImageNet-size JPEGs, two host cores reading.

The set is made at run time from real photographs a package ships (scikit-learn's ``load_sample_images``;
scikit-image's ``data`` where scikit-learn is missing): random crops of them, scaled to about ImageNet's
500 x 375 (either orientation, +-15 %), half mirrored, re-encoded at quality 85-95, written as an
``ImageFolder``. The ImageNet training recipe follows: torchvision's random-resized crop to 224,
horizontal flip, normalisation, batch 256. Three arms, interleaved in each of ``--repeats`` rounds:

* ``decode``: the decoder alone on batches already in memory (the padded rows the ring would carry):
  what nvImageCodec and the resize kernel make, the ceiling of the pipeline; once per ``--backend``
  (``auto``: the hardware decoder first; ``auto:0.65``: it is offered 65 % of each batch, the CUDA
  decoder the rest; ``cuda``: nvJPEG's CUDA decoder alone) and ``--roi`` (the crop as
  the decoder's region of interest, or whole images cropped by the kernel), labelled ``decode[backend/roi]``;
* ``pipeline``: ``DataLoader(EncodedJpegs(ImageFolder), num_workers=--readers, device="cpu", zero_copy=True)``, each
  batch decoded as it comes (with the first backend and roi): workers only read files and draw crops;
* ``read``: the same loader with nothing decoding its batches: what the readers alone can supply;
* ``read-cpu``: images per CPU second of one reader: the same samples made and collated in this
  process (no workers), timed by ``time.process_time``, so a busy neighbour inflates it less than
  wall time. ``read`` and ``read-cpu`` need no GPU (``--arms read,read-cpu`` runs anywhere).

The whole process (its workers and nvImageCodec's threads with it) is pinned to ``--cores`` host cores
(default 2). Each round times ``--batches`` batches after ``--warmup`` untimed ones and ends in a
device sync. Reported: images/s per round, their median and a 90 % bootstrap interval; a variant the
GPU cannot run (say, ``hardware`` where there is no JPEG engine) is reported as an error, the others
still run. Writes
``gpu_decode-<device>.json`` beside this script (or into ``--out-dir``):

    PYTHONPATH=. python bench/studies/does_the_gpu_decode_jpegs/gpu_decode.py

Exit 0 done, 2 bad arguments, 3 no usable GPU or no nvImageCodec (one line). ``--dry-run`` runs the
same code on a tiny set through the CPU path, for the tests of a machine without a GPU.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent

from cupy_nwt import DataLoader, cuda  # noqa: E402
from cupy_nwt.data import EncodedJpegs, GpuJpegDecoder, ImageFolder, gpu_decode_status  # noqa: E402
from cupy_nwt.data.jpeg_codecs import BACKENDS, ROI_MODES  # noqa: E402
from cupy_nwt.errors import CupyNwtError  # noqa: E402
from cupy_nwt.reporting.figures import median_interval  # noqa: E402
from cupy_nwt.reporting.tables import write_json  # noqa: E402

IMAGENET_SIZE = (375, 500)  # height, width of the typical landscape ImageNet photo
ARMS = ("decode", "pipeline", "read", "read-cpu")
GPU_ARMS = ("decode", "pipeline")


def photographs() -> tuple[list[np.ndarray], str]:
    """Real photographs shipped inside a package (no download), and which package they came from."""
    try:
        from sklearn.datasets import load_sample_images  # noqa: PLC0415

        return [np.asarray(a, np.uint8) for a in load_sample_images().images], "sklearn.datasets.load_sample_images"
    except ImportError:
        pass
    try:
        from skimage import data  # noqa: PLC0415

        return [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()], "skimage.data"
    except ImportError as exc:
        raise SystemExit("gpu_decode: needs scikit-learn or scikit-image for its photographs "
                         f"(pip install scikit-learn): {exc}") from exc


def make_set(root: Path, count: int, size: tuple[int, int], seed: int, classes: int = 10) -> dict[str, Any]:
    """``count`` JPEGs of about ``size`` under ``root/<class>/``: random crops, scales, flips, quality 85-95."""
    from PIL import Image  # noqa: PLC0415

    photos, origin = photographs()
    rng = np.random.default_rng(seed)
    nbytes, pixels = [], []
    for c in range(classes):
        (root / f"c{c:02d}").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        photo = photos[int(rng.integers(len(photos)))]
        ph, pw = photo.shape[:2]
        landscape = rng.random() < 0.75
        h, w = size if landscape else size[::-1]
        h, w = (int(round(v * rng.uniform(0.85, 1.15))) for v in (h, w))
        frac = rng.uniform(0.5, 1.0)  # a crop of the photograph, then scaled to (h, w)
        ch = max(8, min(ph, int(ph * frac)))
        cw = max(8, min(pw, int(ch * w / h)))
        top, left = int(rng.integers(0, ph - ch + 1)), int(rng.integers(0, pw - cw + 1))
        img = Image.fromarray(photo[top:top + ch, left:left + cw]).resize((w, h), Image.BICUBIC)
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=int(rng.integers(85, 96)))
        (root / f"c{i % classes:02d}" / f"{i:06d}.jpg").write_bytes(buf.getvalue())
        nbytes.append(len(buf.getvalue()))
        pixels.append(h * w)
    return {"images": count, "photographs": origin, "mean_bytes": float(np.mean(nbytes)), "max_bytes": int(max(nbytes)),
            "mean_megapixels": float(np.mean(pixels)) / 1e6, "quality": [85, 95], "size_about": list(size)}


def in_memory_batches(ds: EncodedJpegs, batch_size: int, count: int) -> list[dict[str, np.ndarray]]:
    """``count`` collated batches of ``ds``, made once: the decode arm's input."""
    out = []
    for b in range(count):
        samples = [ds[(b * batch_size + k) % len(ds)] for k in range(batch_size)]
        out.append({key: np.stack([s[key] for s in samples]) for key in samples[0]})
    return out


def time_decode(decoder: GpuJpegDecoder, batches: list[dict[str, np.ndarray]], warmup: int, timed: int,
                sync: Any) -> float:
    """Images/s of the decoder alone over ``timed`` batches (cycling ``batches``), after ``warmup``."""
    for b in range(warmup):
        decoder(batches[b % len(batches)])
    sync()
    start = time.perf_counter()
    n = 0
    for b in range(timed):
        batch = batches[b % len(batches)]
        decoder(batch)
        n += len(batch["nbytes"])
    sync()
    return n / (time.perf_counter() - start)


def time_pipeline(decoder: GpuJpegDecoder, batches: Any, warmup: int, timed: int, sync: Any) -> float:
    """Images/s of loader + decoder over ``timed`` batches of the endless iterator ``batches``, after ``warmup``."""
    for _ in range(warmup):
        decoder(next(batches))
    sync()
    start = time.perf_counter()
    n = 0
    for _ in range(timed):
        batch = next(batches)
        decoder(batch)
        n += len(batch["nbytes"])
    sync()
    return n / (time.perf_counter() - start)


def time_read(batches: Any, warmup: int, timed: int) -> float:
    """Images/s the loader alone supplies over ``timed`` batches, after ``warmup``."""
    for _ in range(warmup):
        next(batches)
    start = time.perf_counter()
    n = sum(len(next(batches)["nbytes"]) for _ in range(timed))
    return n / (time.perf_counter() - start)


def read_cpu_rate(ds: EncodedJpegs, batch_size: int, warmup: int, timed: int) -> float:
    """Images per CPU second of one process making and collating ``timed`` batches, after ``warmup``."""
    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, seed=1, num_workers=0, device="cpu", zero_copy=True)
    batches = endless(loader)
    for _ in range(warmup):
        next(batches)
    start = time.process_time()
    n = sum(len(next(batches)["nbytes"]) for _ in range(timed))
    return n / (time.process_time() - start)


def endless(loader: DataLoader) -> Any:
    while True:
        yield from loader


def summary(rates: list[float]) -> dict[str, Any]:
    median, lo, hi = median_interval(rates)
    return {"images_per_s": rates, "median": median, "interval_90": [lo, hi]}


def pin_cores(count: int) -> list[int] | None:
    """Pin this process (and what it starts later) to its first ``count`` allowed cores; 0 leaves it as it is."""
    if count <= 0 or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if count > len(allowed):
        raise ValueError(f"--cores {count}: only {len(allowed)} cores are allowed here")
    os.sched_setaffinity(0, allowed[:count])
    return allowed[:count]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=1024, help="distinct JPEGs in the set (default 1024)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=224, help="output side (default 224)")
    p.add_argument("--readers", type=int, default=2, help="loader workers reading files (default 2)")
    p.add_argument("--cores", type=int, default=2, help="host cores the whole run is pinned to (default 2; 0: all)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--batches", type=int, default=40, help="timed batches per arm and round (default 40)")
    p.add_argument("--warmup", type=int, default=4, help="untimed batches before each (default 4)")
    p.add_argument("--backend", default="auto,auto:0.65,cuda",
                   help="nvImageCodec backends the decode arm compares: auto, hardware, cuda, hybrid; auto:F offers "
                        "the hardware decoder the fraction F of each batch (default auto,auto:0.65,cuda)")
    p.add_argument("--roi", default="decoder,kernel",
                   help="where the crop is made, compared in the decode arm: decoder (region of interest), kernel")
    p.add_argument("--arms", default=",".join(ARMS), help=f"subset of {','.join(ARMS)} (default: all)")
    p.add_argument("--max-bytes", type=int, default=0,
                   help="ring row width (EncodedJpegs' max_bytes; default 0: the set's largest file, rounded up to 4 KiB)")
    p.add_argument("--out-dir", default=str(RESULTS))
    p.add_argument("--dry-run", action="store_true", help="a tiny set through the CPU path: checks this script")
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if not arms or set(arms) - set(ARMS):
        p.error(f"--arms must be a subset of {','.join(ARMS)}, got {args.arms!r}")
    if min(args.images, args.batch_size, args.size, args.repeats, args.batches) < 1 or min(args.readers, args.warmup) < 0:
        p.error("--images, --batch-size, --size, --repeats, --batches must be >= 1; --readers, --warmup >= 0")
    args.arms = arms
    args.backend = [b for b in args.backend.split(",") if b]
    args.roi = [r for r in args.roi.split(",") if r]
    if not args.backend or not all(_backend(b) for b in args.backend) or not args.roi or set(args.roi) - set(ROI_MODES):
        p.error(f"--backend takes {','.join(BACKENDS)} and --roi {','.join(ROI_MODES)}, got {args.backend} and {args.roi}")
    if args.dry_run:
        args.images, args.batch_size, args.size, args.batches, args.warmup = min(args.images, 24), 8, 32, 2, 1
        args.cores = 0
    return args


def _backend(spec: str) -> tuple[str, float] | None:
    """``"auto:0.65"`` -> ``("auto", 0.65)``, ``"cuda"`` -> ``("cuda", 1.0)``; None if it is neither."""
    name, _, load = spec.partition(":")
    try:
        fraction = float(load) if load else 1.0
    except ValueError:
        return None
    return (name, fraction) if name in BACKENDS and 0 <= fraction <= 1 and (not load or name == "auto") else None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    usable, why = gpu_decode_status()
    if not usable and not args.dry_run and set(args.arms) & set(GPU_ARMS):
        print(f"gpu_decode: {why}", file=sys.stderr)
        return 3
    try:
        cores = pin_cores(args.cores)
    except ValueError as exc:
        print(f"gpu_decode: {exc}", file=sys.stderr)
        return 2
    device = "cuda" if usable and not args.dry_run else "cpu"
    sync = cuda.synchronize if device == "cuda" else (lambda: None)
    name = (cuda.device_info().name if device == "cuda" else
            f"{'dry-run' if args.dry_run else 'cpu'}-{platform.node() or 'host'}-{os.cpu_count()}cpu")
    variants = [(b, r) for b in args.backend for r in args.roi]  # the decode arm runs for each; the pipeline, the first
    labels = [f"decode[{b}/{r}]" if a == "decode" else a for a in args.arms
              for b, r in (variants if a == "decode" else [variants[0]])]
    rates: dict[str, list[float]] = {label: [] for label in labels}
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # a busy neighbour shows here
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="gpu_decode-") as tmp:
        size = (96, 128) if args.dry_run else IMAGENET_SIZE
        data = make_set(Path(tmp), args.images, size, seed=0)
        row = args.max_bytes or -(-data["max_bytes"] // 4096) * 4096
        ds = EncodedJpegs(ImageFolder(tmp), max_bytes=max(row, data["max_bytes"]), seed=0)
        threads = args.cores if args.cores else 2
        specs = {b: _backend(b) or ("auto", 1.0) for b in args.backend}  # each checked in parse()
        decoders = {(b, r): GpuJpegDecoder(args.size, device=device, backend=specs[b][0], roi=r,
                                           hardware_load=specs[b][1], max_cpu_threads=threads,
                                           source=ds.sample_source) for b, r in variants}
        memory = in_memory_batches(ds, args.batch_size, min(8, -(-args.images // args.batch_size))) \
            if "decode" in args.arms else []
        # zero_copy: each batch is a view of its ring slot, decoded before the next is asked for (no copy out)
        loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=0, num_workers=args.readers,
                            device="cpu", zero_copy=True, persistent_workers=args.readers > 0,
                            drop_last=args.images >= args.batch_size)
        try:
            stream = endless(loader)
            for r in range(args.repeats):
                for label in labels:
                    if label in errors:
                        continue
                    try:
                        if label.startswith("decode["):
                            b, roi = label[len("decode["):-1].split("/")
                            rate = time_decode(decoders[b, roi], memory, args.warmup, args.batches, sync)
                        elif label == "read":
                            rate = time_read(stream, args.warmup, args.batches)
                        elif label == "read-cpu":
                            rate = read_cpu_rate(ds, args.batch_size, args.warmup, args.batches)
                        else:
                            rate = time_pipeline(decoders[variants[0]], stream, args.warmup, args.batches, sync)
                    except CupyNwtError as exc:  # one variant the GPU cannot run must not lose the others
                        errors[label] = f"{type(exc).__name__}: {exc}"
                        print(f"round {r + 1}/{args.repeats} {label}: failed: {errors[label]}", flush=True)
                        continue
                    rates[label].append(rate)
                    print(f"round {r + 1}/{args.repeats} {label}: {rate:,.0f} images/s", flush=True)
        finally:
            loader.close()
    path = decoders[variants[0]].path
    result = {
        "question": "Does the GPU decode JPEGs fast enough? (target >= 15,000 ImageNet-size images/s, <= 2 host cores)",
        "device": name, "path": path, "dry_run": args.dry_run, "backends": args.backend, "rois": args.roi,
        "pipeline_uses": list(variants[0]), "readers": args.readers, "cores": cores, "row_bytes": ds.max_bytes,
        "batch_size": args.batch_size, "output_size": args.size, "timed_batches": args.batches,
        "warmup_batches": args.warmup, "set": data, "python": platform.python_version(),
        "nvimgcodec": _nvimgcodec_version() if usable else None,
        "command": "python bench/studies/does_the_gpu_decode_jpegs/gpu_decode.py " + " ".join(argv or sys.argv[1:]),
        "load_average_1min": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
        "cpus": os.cpu_count(),
        "arms": {label: summary(v) for label, v in rates.items() if v}, "errors": errors,
    }
    out = Path(args.out_dir) / f"gpu_decode-{name.replace(' ', '-')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(result, out)
    for arm, s in result["arms"].items():
        print(f"{arm}: median {s['median']:,.0f} images/s, 90% interval {s['interval_90'][0]:,.0f}-"
              f"{s['interval_90'][1]:,.0f} over {args.repeats} rounds ({path} path)")
    print(f"wrote {out}")
    return 0


def _nvimgcodec_version() -> str | None:
    try:
        from nvidia import nvimgcodec  # noqa: PLC0415

        return str(nvimgcodec.__version__)
    except ImportError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
