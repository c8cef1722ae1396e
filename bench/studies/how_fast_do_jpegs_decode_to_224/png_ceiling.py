"""What bounds PNG where JPEG has a region decode: the same photographs as PNG and as JPEG, one process.

A PNG has no DCT to scale and no blocks to skip: every row is inflated and un-filtered before the
first pixel of a crop exists, so a crop to 224 costs the whole decode plus the resize, whatever the
crop keeps. This measures, in one process on the ImageNet-size set that ``jpeg_to_224.py`` builds,
interleaved over ``--rounds`` rounds (images/s):

The PNGs are Pillow's default encoding of the JPEGs' pixels (zlib level 6, adaptive row filters).

* ``png whole decode``: Pillow, the image only (the ceiling of any CPU path on PNG, per core);
* ``png crop to 224``: ``RandomResizedCrop(224).from_bytes`` on the PNG (decode whole, crop, resize);
* ``jpeg crop to 224``: the same on the JPEG (decoded at the crop's DCT scale).

    PYTHONPATH=. python bench/studies/how_fast_do_jpegs_decode_to_224/png_ceiling.py

Writes ``png_ceiling-<host>-<N>cpu.json`` beside itself.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from jpeg_to_224 import build_set, files_of, summary  # noqa: E402


def png(pixels: object) -> bytes:
    """Pillow's default PNG (zlib level 6, adaptive row filters): what a user's PNG files usually are."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")  # type: ignore[arg-type]
    return buf.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.rounds < 3:
        ap.error("--rounds must be at least 3 (an interval needs repeats)")
    import numpy as np

    from cupy_nwt.data import RandomResizedCrop, decode_image
    from cupy_nwt.system import cache_dir

    folder = build_set("imagenet", cache_dir() / "jpeg-to-224")
    jpegs = [Path(f).read_bytes() for f in files_of(folder)[:args.images]]
    pngs = [png(decode_image(j, "x")) for j in jpegs]  # the same pixels, losslessly
    crop = RandomResizedCrop(224, seed=0)
    paths = {"png whole decode": lambda b: decode_image(b, "x"),
             "png crop to 224": lambda b: crop.from_bytes(b, "x"),
             "jpeg crop to 224": lambda b: crop.from_bytes(b, "x")}
    inputs = {"png whole decode": pngs, "png crop to 224": pngs, "jpeg crop to 224": jpegs}
    rates: dict[str, list[float]] = {k: [] for k in paths}
    names = list(paths)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            f, blobs = paths[name], inputs[name]
            f(blobs[0])
            start = time.perf_counter()
            for b in blobs:
                f(b)
            rates[name].append(len(blobs) / (time.perf_counter() - start))
            print(f"round {r + 1} {name}: {rates[name][-1]:,.0f} images/s", file=sys.stderr)
    result = {"question": "what bounds PNG where JPEG has a region decode?", "host": platform.node(),
              "cpus": os.cpu_count(), "images": len(jpegs), "rounds": args.rounds,
              "png_mean_bytes": float(np.mean([len(p) for p in pngs])),
              "jpeg_mean_bytes": float(np.mean([len(j) for j in jpegs])),
              "conditions": "one process on a shared 2-core machine (other sessions' jobs beside it); "
                            "paths interleaved in rotating order each round",
              "images_per_s": {k: summary(v) for k, v in rates.items()},
              "jpeg_crop_over_png_crop": statistics.median(rates["jpeg crop to 224"])
              / statistics.median(rates["png crop to 224"])}
    out = args.out or HERE / f"png_ceiling-{platform.node() or 'host'}-{os.cpu_count()}cpu.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
