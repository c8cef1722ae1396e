"""How fast do JPEG photographs become ImageNet training batches (random-resized crop to 224)?

The set: real photographs that Python packages ship (scikit-learn's ``load_sample_images``,
scikit-image's ``data``), each made into many images by a random crop, scale and flip, re-encoded
at quality 85-95, at ImageNet's sizes (about 500 x 375, either orientation) and at a camera's
(4000 x 3000; a sensor's grain added after the upscale, so that the file holds about as many bits a
pixel as a camera's). Written once into the cache folder (``$CUPY_NWT_CACHE_DIR`` or
``~/.cache/cupy_nwt``), never into the tree.

The recipe: torchvision's ImageNet training transform. Random-resized crop to 224 (scale 0.08-1,
ratio 3/4-4/3, bilinear, antialiased), horizontal flip, ToTensor + Normalize, batch 256 (64 at
camera size, whose images take some 20 times longer: see ``--batch-size``). Arms,
interleaved in rotating order over ``--rounds`` rounds, each on a fresh loader with
``--workers`` workers (fork) on the same cores:

* ``torch``: ``torch.utils.data.DataLoader`` over a torch ``Dataset`` making the same PIL calls
  torchvision makes (torchvision cannot be installed beside this CPU torch): ``Image.open`` ->
  ``convert("RGB")`` -> ``crop`` -> ``resize(BILINEAR)`` -> flip -> ToTensor -> Normalize;
* ``cupy_nwt``: ``ImageFolder(transform=RandomResizedCrop(224, flip_p=0.5, normalize=(IMAGENET_MEAN,
  IMAGENET_STD)))``: the crop's rectangle decoded at a DCT scale (the project's libjpeg-turbo
  extension where built: rows below the crop never decoded, columns outside it not transformed), one resize whose last pass also flips and
  normalises into float32 CHW, collated straight into the loader's shared-memory slot;
* ``cupy_nwt-uint8``: the project's usual layout, uint8 HWC samples
  (``Compose([RandomResizedCrop(224), RandomHorizontalFlip()])``) normalised per batch by
  ``batch_transform=NormalizeBatch()``;
* ``floor-decode``: a bare loop of the fastest decoder (simplejpeg, whole image) in as many
  processes: what decoding alone costs with no crop, no resize, no loader;
* ``floor-entropy``: the same loop decoding each image at 1/8 (the IDCT reduced to its DC term,
  colour conversion on 1/64 of the pixels): close to the Huffman decoding of the whole file, which
  no DCT scaling skips, so the bound for any CPU path that reads every block.

Rates are images/s timed after the batches the workers make ahead while the first one is awaited.
Beside them, one process, no loader: each binding's decode of the same images (which binding to
use), and instructions per image counted with callgrind (``--count``; the difference between two
runs of different lengths, so start-up cancels; at ImageNet size, where the target is).

    PYTHONPATH=. python bench/studies/how_fast_do_jpegs_decode_to_224/jpeg_to_224.py

Writes ``jpeg_to_224-<host>-<N>cpu.json`` beside itself.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

try:  # the study's own needs, beyond the package's: said in one line by main() where absent
    import simplejpeg
    from skimage import data as skimage_data
    from sklearn.datasets import load_sample_images
    MISSING = ""
except ImportError as exc:
    simplejpeg = skimage_data = load_sample_images = None
    MISSING = f"jpeg_to_224: needs simplejpeg, scikit-image and scikit-learn ({exc})"

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SET_VERSION = 1
BATCH = 256
SIZE = 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SIZES = {"imagenet": {"images": 512, "long": 500, "shorts": (375, 333, 281)},
         "camera": {"images": 48, "long": 4000, "shorts": (3000,)}}


# --- the set -----------------------------------------------------------------------------------


def source_photos() -> list[np.ndarray]:
    """The photographs the packages ship (RGB uint8); nothing is downloaded."""
    data = skimage_data

    photos = list(load_sample_images().images)
    for name in ("astronaut", "coffee", "chelsea", "rocket", "retina", "hubble_deep_field"):
        photos.append(np.ascontiguousarray(getattr(data, name)()[..., :3]))
    return photos


def build_set(kind: str, root: Path, seed: int = 0) -> Path:
    """``root/<kind>-v1/<class>/<k>.jpg`` made once; returns the folder (an ImageFolder)."""
    from PIL import Image

    spec = SIZES[kind]
    folder = root / f"{kind}-v{SET_VERSION}-n{spec['images']}-seed{seed}"
    done = folder / ".complete"
    if done.is_file():
        return folder
    rng = np.random.default_rng([seed, SET_VERSION, len(kind)])
    photos = source_photos()
    for k in range(spec["images"]):
        src = photos[k % len(photos)]
        h, w = src.shape[:2]
        frac = rng.uniform(0.5, 1.0)
        ch, cw = max(16, int(h * math.sqrt(frac))), max(16, int(w * math.sqrt(frac)))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        crop = src[top:top + ch, left:left + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        short = int(rng.choice(spec["shorts"]))
        size = (spec["long"], short) if rng.random() < 0.75 else (short, spec["long"])  # (w, h): mostly landscape
        img = Image.fromarray(np.ascontiguousarray(crop)).resize(size, Image.Resampling.BICUBIC)
        if kind == "camera":  # a sensor's grain: upscaled pixels alone are smoother than any camera's
            a = np.asarray(img, dtype=np.int16) + rng.normal(0, 2.5, (size[1], size[0], 1)).astype(np.int16)
            img = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
        out = folder / f"c{k % 8}" / f"{k:05d}.jpg"
        out.parent.mkdir(parents=True, exist_ok=True)
        img.save(out, format="JPEG", quality=int(rng.integers(85, 96)))
    done.touch()
    return folder


def set_summary(folder: Path) -> dict[str, Any]:
    from PIL import Image

    files = sorted(folder.rglob("*.jpg"))
    pixels = nbytes = 0
    for f in files:
        with Image.open(f) as im:
            pixels += im.size[0] * im.size[1]
        nbytes += f.stat().st_size
    return {"files": len(files), "mean_bytes": nbytes / len(files), "mean_megapixels": pixels / len(files) / 1e6,
            "bits_per_pixel": 8 * nbytes / pixels}


# --- the torch arm: torchvision's calls on PIL, in a torch Dataset -------------------------------


class TorchImageNetTrain:
    """torchvision's ``RandomResizedCrop(224)``, ``RandomHorizontalFlip()``, ``ToTensor()``, ``Normalize``
    as PIL and torch calls, drawing from torch's generator as torchvision does."""

    def __init__(self, files: Sequence[str]) -> None:
        self.files = list(files)

    def __len__(self) -> int:
        return len(self.files)

    @staticmethod
    def box(height: int, width: int) -> tuple[int, int, int, int]:
        import torch

        area = height * width
        log_ratio = torch.log(torch.tensor((3 / 4, 4 / 3)))
        for _ in range(10):
            target = area * torch.empty(1).uniform_(0.08, 1.0).item()
            aspect = math.exp(torch.empty(1).uniform_(log_ratio[0].item(), log_ratio[1].item()).item())
            w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return (int(torch.randint(0, height - h + 1, size=(1,)).item()),
                        int(torch.randint(0, width - w + 1, size=(1,)).item()), h, w)
        in_ratio = width / height
        if in_ratio < 3 / 4:
            w, h = width, int(round(width / (3 / 4)))
        elif in_ratio > 4 / 3:
            h, w = height, int(round(height * 4 / 3))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch
        from PIL import Image

        with open(self.files[i], "rb") as f:
            img = Image.open(f).convert("RGB")
        top, left, h, w = self.box(img.height, img.width)
        img = img.crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        if torch.rand(1).item() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        t = torch.from_numpy(np.array(img, np.uint8, copy=True)).view(SIZE, SIZE, 3).permute(2, 0, 1).contiguous()
        t = t.to(dtype=torch.float32).div(255)
        mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
        return t.sub(mean).div(std), i % 8


def files_of(folder: Path) -> list[str]:
    from cupy_nwt.data import ImageFolder

    ds = ImageFolder(folder)
    return [str(ds.path(i)) for i in range(len(ds))]


# --- the arms ------------------------------------------------------------------------------------


def make_iter(arm: str, folder: Path, workers: int, prefetch: int, length: int,
              batch: int = BATCH) -> tuple[Any, Callable[[], None]]:
    """An endless iterator of batches for ``arm``, and how to close it."""
    if arm == "torch":
        import torch.utils.data as tud

        files = files_of(folder)
        ds = TorchImageNetTrain([files[k % len(files)] for k in range(length)])
        loader = tud.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, prefetch_factor=prefetch,
                                persistent_workers=True, multiprocessing_context="fork")
        it = (b for _ in iter(int, 1) for b in loader)
        return it, lambda: loader._iterator._shutdown_workers() if loader._iterator is not None else None
    from cupy_nwt import DataLoader

    ds, batch_transform = cupy_dataset(arm, folder)
    idx = np.arange(length) % len(ds)
    loader = DataLoader(_Repeat(ds, idx), batch_size=batch, shuffle=True, num_workers=workers, device="cpu",
                        prefetch_factor=prefetch, persistent_workers=True, batch_transform=batch_transform,
                        multiprocessing_context="fork")
    it = (b for _ in iter(int, 1) for b in loader)
    return it, loader.close


def cupy_dataset(arm: str, folder: Path | str, seed: int | None = None) -> tuple[Any, Any]:
    """The ImageFolder and batch transform of a cupy_nwt arm."""
    from cupy_nwt.data import (
        IMAGENET_MEAN,
        IMAGENET_STD,
        Compose,
        ImageFolder,
        NormalizeBatch,
        RandomHorizontalFlip,
        RandomResizedCrop,
    )

    if arm == "cupy_nwt":
        crop = RandomResizedCrop(SIZE, seed=seed, flip_p=0.5, normalize=(IMAGENET_MEAN, IMAGENET_STD))
        return ImageFolder(folder, transform=crop), None
    return (ImageFolder(folder, transform=Compose([RandomResizedCrop(SIZE, seed=seed), RandomHorizontalFlip(seed=seed)])),
            NormalizeBatch())


class _Repeat:
    """``length`` samples cycling over a smaller set of files (every read draws a new crop)."""

    def __init__(self, ds: Any, idx: np.ndarray) -> None:
        self.ds, self.idx = ds, idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i: int) -> Any:
        return self.ds[int(self.idx[i])]


def whole_rounds(n: int, workers: int) -> int:
    """``n`` rounded up to a multiple of the workers, which finish their batches together."""
    w = max(1, workers)
    return -(-n // w) * w


def loader_rate(arm: str, folder: Path, workers: int, prefetch: int, batches: int, batch: int = BATCH) -> float:
    """Images/s over ``batches`` batches, timed after those the workers made ahead while the first was awaited.

    Workers started together finish their batches together, so both the batches skipped and the
    batches timed are whole multiples of the workers: the clock starts and stops on the last batch of
    such a group, never between two that arrive at once.
    """
    it, close = make_iter(arm, folder, workers, prefetch, length=batch * 4, batch=batch)
    try:
        for _ in range(whole_rounds(1 + workers * prefetch, workers)):
            next(it)
        start = time.perf_counter()
        for _ in range(batches):
            next(it)
        return batches * batch / (time.perf_counter() - start)
    finally:
        close()


def _decode_chunk(args: tuple[list[str], int]) -> int:
    files, scale = args
    for f in files:
        data = Path(f).read_bytes()
        if scale == 1:
            simplejpeg.decode_jpeg(data, colorspace="RGB")
        else:
            h, w, _, _ = simplejpeg.decode_jpeg_header(data)
            simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-h // scale), min_width=-(-w // scale))
    return len(files)


def floor_rate(folder: Path, workers: int, images: int, scale: int) -> float:
    """Images/s of a bare simplejpeg loop in ``workers`` processes (the calling process with 0)."""
    files = files_of(folder)
    todo = [files[k % len(files)] for k in range(images)]
    n = max(1, workers)
    chunks = [(todo[k::n], scale) for k in range(n)]
    if workers == 0:
        start = time.perf_counter()
        _decode_chunk(chunks[0])
        return images / (time.perf_counter() - start)
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(_decode_chunk, [(c[0][:2], scale) for c in chunks])  # started and warm before the clock
        start = time.perf_counter()
        pool.map(_decode_chunk, chunks)
        return images / (time.perf_counter() - start)


# --- one process: which binding, and the instruction counts ---------------------------------------


def binding_paths() -> dict[str, Callable[[bytes], Any]]:
    """Every way of turning one file into the 224 crop (or, for the floors, just decoding it)."""
    from PIL import Image

    from cupy_nwt.data import RandomResizedCrop, jpeg_region

    sj, pil = RandomResizedCrop(SIZE, seed=0, backend="simplejpeg"), RandomResizedCrop(SIZE, seed=0, backend="pillow")
    region = {}
    if jpeg_region.available():
        lj = RandomResizedCrop(SIZE, seed=0, backend="libjpeg")
        region = {"libjpeg-turbo region at the DCT scale, resize (cupy_nwt backend='libjpeg', the default)":
                  lambda d: lj.from_bytes(d, "x")}

    def pil_full_crop(data: bytes) -> Any:
        with Image.open(io.BytesIO(data)) as im:
            img = im.convert("RGB")
            top, left, h, w = TorchImageNetTrain.box(img.height, img.width)
            return np.asarray(img.crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.Resampling.BILINEAR))

    def pil_decode(data: bytes) -> Any:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))

    def sj_eighth(data: bytes) -> Any:
        h, w, _, _ = simplejpeg.decode_jpeg_header(data)
        return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-h // 8), min_width=-(-w // 8))

    return {"pillow whole decode, crop, resize (torchvision's calls)": pil_full_crop,
            "pillow draft at the DCT scale, crop, resize (cupy_nwt backend='pillow')": lambda d: pil.from_bytes(d, "x"),
            "simplejpeg at the DCT scale, crop, resize (cupy_nwt backend='simplejpeg')": lambda d: sj.from_bytes(d, "x"),
            **region,
            "pillow whole decode only": pil_decode,
            "simplejpeg whole decode only": lambda d: simplejpeg.decode_jpeg(d, colorspace="RGB"),
            "simplejpeg 1/8 decode (entropy bound)": sj_eighth}


def pyturbojpeg_status() -> str:
    try:
        from turbojpeg import TurboJPEG

        TurboJPEG()
    except ImportError as exc:
        return f"unavailable: {exc}"
    except Exception as exc:  # noqa: BLE001 - any reason it cannot run is the answer
        return f"unavailable: {' '.join(str(exc).split())[:160]}"
    return "available (not measured by this script)"


def region_decoder_status() -> str:
    from cupy_nwt.data import jpeg_region

    version = jpeg_region.libjpeg_turbo_version()
    return f"built against libjpeg-turbo {version}" if version else "not built: crops decode with simplejpeg"


def binding_rates(folder: Path, rounds: int, images: int) -> dict[str, list[float]]:
    import torch

    torch.manual_seed(0)
    files = files_of(folder)
    blobs = [Path(files[k % len(files)]).read_bytes() for k in range(images)]
    paths = binding_paths()
    out: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            f = paths[name]
            f(blobs[0])
            start = time.perf_counter()
            for b in blobs:
                f(b)
            out[name].append(images / (time.perf_counter() - start))
    return out


def count_child(arm: str, folder: str, images: int) -> None:
    """Run ``images`` samples of ``arm`` in this process, batches of 8 (what callgrind counts)."""
    n = images
    if arm == "torch":
        import torch
        import torch.utils.data as tud

        torch.manual_seed(0)
        files = files_of(Path(folder))
        ds = TorchImageNetTrain([files[k % len(files)] for k in range(n)])
        for _ in tud.DataLoader(ds, batch_size=8, num_workers=0):
            pass
    elif arm.startswith("cupy_nwt"):
        from cupy_nwt import DataLoader

        ds, batch_transform = cupy_dataset(arm, folder, seed=0)
        sub = _Repeat(ds, np.arange(n) % len(ds))
        for _ in DataLoader(sub, batch_size=8, num_workers=0, device="cpu", batch_transform=batch_transform):
            pass
    else:
        files = files_of(Path(folder))
        _decode_chunk(([files[k % len(files)] for k in range(n)], 8 if arm == "floor-entropy" else 1))


def count_all(arms: Sequence[str], folder: Path, small: int, large: int) -> dict[str, float | str]:
    return {a: instructions_per_image(a, folder, small, large) for a in arms}


def instructions_per_image(arm: str, folder: Path, small: int, large: int) -> float | str:
    from cupy_nwt.pytest_plugin._callgrind import callgrind_unavailable_reason, count_instructions

    reason = callgrind_unavailable_reason()
    if reason is not None:
        return reason
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # one image under callgrind first, uncounted: Numba keys its on-disk cache by the CPU's features, and
    # valgrind's simulated CPU has other ones, so the first counted run would compile (billions of
    # instructions) and the second load what it saved; the difference would then hold the compile
    counts = [count_instructions([sys.executable, __file__, "--count-child", arm, str(folder), str(n)], env=env,
                                 timeout=3600) for n in (1, small, large)][1:]
    per_image = (counts[1] - counts[0]) / (large - small)
    if per_image <= 0:
        return (f"not counted: {large} images counted {counts[1]:,} instructions and {small} counted {counts[0]:,}, "
                "so the shorter run held one-off work; count again")
    return per_image


# --- the run -------------------------------------------------------------------------------------


def summary(values: Sequence[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": list(values)}


def recount(args: argparse.Namespace) -> int:
    from cupy_nwt.system import cache_dir

    kind, arm = args.recount.split("=")
    out = args.out or HERE / f"jpeg_to_224-{platform.node() or 'host'}-{os.cpu_count()}cpu.json"
    counted_over = json.loads(out.read_text())["sizes"][kind].get("instructions_counted_over")
    small, large = counted_over or [int(x) for x in dict(kv.split("=") for kv in args.count.split(","))[kind].split(":")]
    folder = build_set(kind, cache_dir() / "jpeg-to-224")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, __file__, "--count-child", arm, str(folder), "1"], env=env, check=True)  # warm caches
    count = instructions_per_image(arm, folder, small, large)
    result = json.loads(out.read_text())  # read again: another recount may have written it meanwhile
    entry = result["sizes"][kind]
    entry["instructions_counted_over"] = [small, large]
    entry.setdefault("instructions_per_image", {})[arm] = count
    ipi = entry["instructions_per_image"]
    if isinstance(ipi.get("cupy_nwt"), float) and isinstance(ipi.get("torch"), float):
        entry["cupy_nwt_instructions_over_torch"] = ipi["cupy_nwt"] / ipi["torch"]
    entry.setdefault("recounted", []).append(arm)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{kind} {arm}: {ipi[arm]} instructions an image; wrote {out}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="imagenet,camera")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="workers for every arm (default: cores)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="imagenet=4,camera=2", help="timed batches per loader")
    ap.add_argument("--batch-size", default="imagenet=256,camera=64",
                    help="samples a batch per size (camera images take ~20x longer: 64 keeps a run under an hour "
                         "on a shared 2-core machine; images/s hardly depends on it)")
    ap.add_argument("--count", default="imagenet=2:6",
                    help="callgrind: images in the short and the long run per size ('' to skip)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--recount", metavar="SIZE=ARM",
                    help="count one arm's instructions (again) into the existing result file (e.g. after a "
                         "Numba cache was rebuilt during the first count, which the difference then holds, or "
                         "where the timing's run was stopped before its counts ended)")
    ap.add_argument("--count-child", nargs=3, metavar=("ARM", "FOLDER", "IMAGES"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if MISSING:
        print(MISSING, file=sys.stderr)
        return 3
    if args.count_child:
        count_child(args.count_child[0], args.count_child[1], int(args.count_child[2]))
        return 0
    if args.recount:
        return recount(args)
    if args.rounds < 3:
        ap.error("--rounds must be at least 3 (an interval needs repeats)")
    from cupy_nwt.system import cache_dir

    sizes = [s for s in args.sizes.split(",") if s]
    batches = dict(kv.split("=") for kv in args.batches.split(","))
    batch_sizes = {k: int(v) for k, v in (kv.split("=") for kv in args.batch_size.split(","))}
    counts = dict(kv.split("=") for kv in args.count.split(",")) if args.count else {}
    root = cache_dir() / "jpeg-to-224"
    out = args.out or HERE / f"jpeg_to_224-{platform.node() or 'host'}-{os.cpu_count()}cpu.json"
    folders = {}
    for kind in sizes:
        print(f"[{kind}] building or reusing the set under {root}", file=sys.stderr)
        folders[kind] = build_set(kind, root)
    arms = ["torch", "cupy_nwt", "cupy_nwt-uint8", "floor-decode", "floor-entropy"]
    # callgrind counts on a simulated CPU, whatever runs beside it: it runs beside the timing, whose
    # interleaved rounds spread the extra load over every arm alike
    counting = ThreadPoolExecutor(1)
    counted = {kind: counting.submit(count_all, [a for a in arms if a != "cupy_nwt-uint8"], folders[kind], *(int(x) for x in counts[kind].split(":")))
               for kind in sizes if kind in counts}
    result: dict[str, Any] = {
        "question": "how fast do JPEG photographs become ImageNet training batches of 224?",
        "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "workers": args.workers, "rounds": args.rounds,
        "conditions": "shared machine: other jobs may run on the same cores, and this script's own callgrind "
                      "counts run beside the timing; arms interleaved in rotating order each round so that a "
                      "busy spell falls on every arm alike",
        "load_average_at_start": os.getloadavg(),
        "pyturbojpeg": pyturbojpeg_status(), "region_decoder": region_decoder_status(), "sizes": {}}
    for kind in sizes:
        folder = folders[kind]
        entry: dict[str, Any] = {"set": set_summary(folder), "batch_size": batch_sizes[kind]}
        nb = whole_rounds(int(batches[kind]), args.workers)
        print(f"[{kind}] one process, each binding", file=sys.stderr)
        entry["one_process_images_per_s"] = {k: summary(v) for k, v in
                                             binding_rates(folder, args.rounds, 64 if kind == "imagenet" else 8).items()}
        rates: dict[str, list[float]] = {a: [] for a in arms}
        prefetch = 2 if kind == "imagenet" else 1
        for r in range(args.rounds):
            for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
                if arm.startswith("floor"):
                    rate = floor_rate(folder, args.workers, nb * batch_sizes[kind], 8 if arm == "floor-entropy" else 1)
                else:
                    rate = loader_rate(arm, folder, args.workers, prefetch, nb, batch_sizes[kind])
                rates[arm].append(rate)
                print(f"[{kind}] round {r + 1} {arm}: {rate:,.0f} images/s", file=sys.stderr)
        entry["loader_images_per_s"] = {a: summary(v) for a, v in rates.items()}
        for a in ("cupy_nwt", "cupy_nwt-uint8"):
            entry[f"{a}_over_torch"] = summary([c / t for c, t in zip(rates[a], rates["torch"])])
        entry["of_entropy_bound"] = {a: statistics.median(rates[a]) / statistics.median(rates["floor-entropy"])
                                     for a in arms if a != "floor-entropy"}
        entry["timed_batches"], entry["prefetch_factor"] = nb, prefetch
        result["sizes"][kind] = entry
        result["load_average_at_end"] = os.getloadavg()
        out.write_text(json.dumps(result, indent=2) + "\n")  # each size as it is done
    for kind, future in counted.items():
        print(f"[{kind}] waiting for the instruction counts", file=sys.stderr)
        ipi = future.result()
        entry = result["sizes"][kind]
        entry["instructions_per_image"] = ipi
        entry["instructions_counted_over"] = [int(x) for x in counts[kind].split(":")]
        if all(isinstance(v, float) for v in ipi.values()):
            entry["cupy_nwt_instructions_over_torch"] = ipi["cupy_nwt"] / ipi["torch"]
    counting.shutdown()
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
