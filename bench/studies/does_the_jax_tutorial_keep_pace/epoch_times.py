"""Epoch times of JAX's tutorial (``jax_tutorial.py``) with cupy_nwt's DataLoader and with torch's, interleaved.

Each round runs the tutorial once per loader, in fresh interpreters, in alternating order; each run's
"Epoch e in s sec" lines are its epoch times (worker start included: the tutorial's loader has no
persistent workers). Writes the per-run times and ``summarize``'s figures.

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


def summarize(runs: dict[str, list[list[float]]]) -> dict[str, object]:
    """Each loader's median over runs of a run's median epoch, epoch 0 left out where a run has more (it
    also compiles the tutorial's jitted step), the min-max of those run medians, and the ratio."""
    medians = {name: [statistics.median(t[1:] if len(t) > 1 else t) for t in times] for name, times in runs.items()}
    summary = {name: {"median_epoch_s": statistics.median(m), "interval_s": [min(m), max(m)],
                      "first_epoch_median_s": statistics.median(t[0] for t in runs[name])}
               for name, m in medians.items()}
    ratio = statistics.median(medians["cupy_nwt"]) / statistics.median(medians["torch"])
    return {"summary": summary, "ratio_cupy_nwt_over_torch": ratio}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--n-train", type=int, default=60000)
    ap.add_argument("--out", type=Path, default=HERE / "epoch_times.json")
    ap.add_argument("--summarize", type=Path, help="recompute the summary of a result file written before")
    args = ap.parse_args(argv)
    if args.rounds < 3 or args.epochs < 1 or args.n_train < 128:
        ap.error("--rounds must be >= 3, --epochs >= 1, --n-train >= 128")
    if args.summarize is not None:
        result = json.loads(args.summarize.read_text())
        result.update(summarize(result["epoch_s"]))
        args.out = args.summarize
    else:
        runs: dict[str, list[list[float]]] = {name: [] for name in LOADERS}
        for r in range(args.rounds):
            for name in (LOADERS if r % 2 == 0 else LOADERS[::-1]):
                runs[name].append(run_once(name, args.epochs, args.n_train))
                print(name, runs[name][-1], flush=True)
        result = {
            "question": "are the JAX tutorial's epochs with cupy_nwt's DataLoader no slower than with torch's?",
            "command": "python bench/studies/does_the_jax_tutorial_keep_pace/epoch_times.py "
                       f"--rounds {args.rounds} --epochs {args.epochs} --n-train {args.n_train}",
            "conditions": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                           "batch_size": 128, "num_workers": 2, "n_train": args.n_train, "epochs": args.epochs,
                           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "epoch_s": runs,
            **summarize(runs),
        }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"]), f"ratio {result['ratio_cupy_nwt_over_torch']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
