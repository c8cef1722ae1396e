"""Does the libjpeg-turbo region decoder leak? memcheck over a decode loop at two lengths.

Each pass of the loop decodes one good crop (the DCT scale cycling through 1, 2, 4, 8, the box
moving) and four failures (truncated, not a JPEG body, cut short before EOI, a box outside the
image), each of which leaves libjpeg through its error_exit longjmp. Run once with ``--loop-child``
at a short and a long length under ``valgrind --tool=memcheck --leak-check=full``
(``PYTHONMALLOC=malloc``, so that Python's own arenas do not hide blocks). A leak in the extension
grows with the loop; the interpreter's own unreleased blocks at exit do not. Writes
``region_leak_check-<host>.json``: memcheck's lost bytes at each length and the memcheck records
that name the extension or libjpeg.

    PYTHONPATH=. python bench/studies/how_fast_do_jpegs_decode_to_224/region_leak_check.py
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LENGTHS = (20, 220)


def loop(n: int) -> None:
    import numpy as np
    from PIL import Image

    from cupy_nwt.data import jpeg_region

    rng = np.random.default_rng(0)
    img = np.clip(rng.normal(128, 40, (240, 320, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    good = buf.getvalue()
    bad = [good[: len(good) // 2], good[:4] + b"\0" * 200, good[:-100]]
    for k in range(n):
        s = (1, 2, 4, 8)[k % 4]
        h, w = jpeg_region.scaled_size(240, 320, s)
        jpeg_region.decode_region(good, (k % 7, k % 5, h - k % 7, w - k % 5), s)
        for b in bad:
            try:
                jpeg_region.decode_region(b, (0, 0, 4, 4), s)
            except ValueError:
                pass
        try:
            jpeg_region.decode_region(good, (h, 0, 1, 1), s)
        except ValueError:
            pass


def memcheck(n: int, folder: Path) -> dict[str, object]:
    log = folder / f"memcheck-{n}.log"
    env = {**os.environ, "PYTHONMALLOC": "malloc"}
    subprocess.run(["valgrind", "--tool=memcheck", "--leak-check=full", "--show-leak-kinds=definite",
                    f"--log-file={log}", sys.executable, __file__, "--loop-child", str(n)], env=env, check=True,
                   timeout=3600)
    text = log.read_text()

    def lost(kind: str) -> int:
        m = re.search(rf"{kind} lost: ([\d,]+) bytes", text)
        return int(m.group(1).replace(",", "")) if m else 0

    records = [r for r in text.split("\n==") if re.search(r"_libjpeg_region|libjpeg\.so|jpeg_", r)]
    return {"loop_passes": n, "definitely_lost_bytes": lost("definitely"), "indirectly_lost_bytes": lost("indirectly"),
            "records_naming_the_extension_or_libjpeg": len(records)}


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--loop-child":
        loop(int(sys.argv[2]))
        return 0
    from cupy_nwt.data import jpeg_region

    if shutil.which("valgrind") is None or not jpeg_region.available():
        print("region_leak_check: needs valgrind and the built extension", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory() as tmp:
        runs = [memcheck(n, Path(tmp)) for n in LENGTHS]
    grows = runs[1]["definitely_lost_bytes"] != runs[0]["definitely_lost_bytes"]
    result = {"question": "does the libjpeg-turbo region decoder leak over a decode loop?",
              "libjpeg_turbo": jpeg_region.libjpeg_turbo_version(), "runs": runs,
              "leak_grows_with_the_loop": grows,
              "verdict": "leaks" if grows or any(r["records_naming_the_extension_or_libjpeg"] for r in runs)
              else "no leak: lost bytes equal at both lengths, none in the extension or libjpeg"}
    out = HERE / f"region_leak_check-{platform.node() or 'host'}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(result["verdict"], file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
