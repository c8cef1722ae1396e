"""Epoch times of JAX's tutorial (``jax_tutorial.py``) with cupy_nwt's DataLoader and with torch's, interleaved.

Each round runs the tutorial once per loader, in fresh interpreters, in alternating order; each run's
"Epoch e in s sec" lines are its epoch times (worker start included: the tutorial's loader has no
persistent workers). Writes the per-run times, each loader's median over rounds of the per-run median
epoch, the min-max interval of those, and the ratio cupy_nwt / torch.

    python bench/studies/does_the_jax_tutorial_keep_pace/epoch_times.py --rounds 3 --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOADERS = ("cupy_nwt", "torch")


def run_once(loader: str, epochs: int, n_train: int) -> list[float]:
    env = {**os.environ, "LOADER": loader, "EPOCHS": str(epochs), "N_TRAIN": str(n_train), "N_TEST": "2000"}
    proc = subprocess.run([sys.executable, str(HERE / "jax_tutorial.py")], capture_output=True, text=True, env=env,
                          timeout=900, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the tutorial with {loader}'s loader failed: {proc.stderr[-2000:]}")
    return [float(s) for s in re.findall(r"^Epoch \d+ in ([\d.]+) sec$", proc.stdout, re.M)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--n-train", type=int, default=60000)
    ap.add_argument("--out", type=Path, default=HERE / "epoch_times.json")
    args = ap.parse_args(argv)
    if args.rounds < 3 or args.epochs < 1 or args.n_train < 128:
        ap.error("--rounds must be >= 3, --epochs >= 1, --n-train >= 128")
    runs: dict[str, list[list[float]]] = {name: [] for name in LOADERS}
    for r in range(args.rounds):
        for name in (LOADERS if r % 2 == 0 else LOADERS[::-1]):
            runs[name].append(run_once(name, args.epochs, args.n_train))
            print(name, runs[name][-1], flush=True)
    medians = {name: [statistics.median(times) for times in runs[name]] for name in LOADERS}
    summary = {name: {"median_epoch_s": statistics.median(m), "interval_s": [min(m), max(m)]} for name, m in medians.items()}
    result = {
        "question": "are the JAX tutorial's epochs with cupy_nwt's DataLoader no slower than with torch's?",
        "command": "python bench/studies/does_the_jax_tutorial_keep_pace/epoch_times.py "
                   f"--rounds {args.rounds} --epochs {args.epochs} --n-train {args.n_train}",
        "conditions": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                       "batch_size": 128, "num_workers": 2, "n_train": args.n_train, "epochs": args.epochs,
                       "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "epoch_s": runs,
        "summary": summary,
        "ratio_cupy_nwt_over_torch": summary["cupy_nwt"]["median_epoch_s"] / summary["torch"]["median_epoch_s"],
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary), f"ratio {result['ratio_cupy_nwt_over_torch']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
