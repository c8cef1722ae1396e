"""Is the first batch as soon as torch's, under every start method, whatever the script imports?

Each measurement is a fresh interpreter running this file as its ``__main__``, which imports at its
top what the cell says (``light``: nothing heavy; ``torch``; ``jax``: torch and JAX), as a user's
script would, so a forkserver server or a spawned worker that re-imports ``__main__`` pays for it too.
In it one loader (cupy_nwt's, or torch's DataLoader) is timed from its construction to its first
batch, closed, and a second one timed the same way: the first pays for what a process does once
(forkserver's server and its preload), the second does not. Two datasets:

* ``tiny``: 4096 samples of 3x32x32 float32, its class defined in the script (``__main__``);
* ``images``: ImageNet's batch as a model eats it, 256 samples of 3x224x224 uint8 (38.5 MB a batch),
  its class in the script: what the first batches cost when they are large;
* ``module``: the same samples as ``cupy_nwt.data.ArrayDataset``, a class from a module: a worker needs
  nothing of the script to unpickle it;
* ``index``: a map dataset whose index is a list of ``--index`` (path, class) pairs, as torchvision's
  ImageFolder holds it (the files are never read: a sample is its class);
* ``array-index``: the same index as ``cupy_nwt.data.ImageFolder`` holds it, in NumPy arrays.

Batch 64 (``images``: 256). Each loader is also timed to batch ``workers - 1``, the last worker's first (``every_worker_s``):
workers that start in waves must not buy an early first batch with a late last worker. Then each
worker's PSS and USS (private pages) are read from ``/proc/<pid>/smaps_rollup`` (the median over the workers). spawn keeps nothing in the process, so
only one loader is timed there unless ``--spawn-second``.

Each script imports its loader at its top as well (``cupy_nwt``, or ``torch.utils.data``), so torch's
``light`` cell imports torch: the lightest script torch's loader can have. Rounds interleave the loaders (and ``--before``'s tree, when given) cell
by cell, their order turning each round. Writes ``first_batch_vs_torch-<host>.json`` beside itself:

    PYTHONPATH=. python bench/studies/what_does_a_worker_start_cost/first_batch_vs_torch.py --before /tmp/before49
"""

from __future__ import annotations

import os

for _name in filter(None, os.environ.get("FIRST_BATCH_MAIN_IMPORTS", "").split(",")):
    __import__(_name)  # what the user's script imports at its top: a re-import of __main__ pays it too

import argparse  # noqa: E402 - after the script's own imports, as above
import importlib  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
METHODS = ("fork", "forkserver", "spawn")
MAINS = {"light": "", "torch": "torch", "jax": "torch,jax"}
PACKAGE = {"cupy_nwt": "cupy_nwt", "torch": "torch.utils.data"}  # a script imports its loader at its top too
LOADERS = ("cupy_nwt", "torch")
BATCH = 64


class Tiny:
    """4096 small float32 images: the start is all there is to time."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> Any:
        import numpy as np  # noqa: PLC0415 - this file's top imports nothing heavy

        return np.full((3, 32, 32), i, np.float32)


class Images:
    """Batches of ImageNet's size after decoding and cropping: the first batches are tens of MB."""

    def __len__(self) -> int:
        return 256 * 64

    def __getitem__(self, i: int) -> Any:
        import numpy as np  # noqa: PLC0415

        return np.full((3, 224, 224), i % 251, np.uint8)


class Index:
    """An image folder's index as torchvision's ImageFolder holds it: a list of (path, class), a Python
    object per entry; a sample is its class (no file is read)."""

    def __init__(self, n: int) -> None:
        self.samples = [(path(i), i % 1000) for i in range(n)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> int:
        return self.samples[i][1]


class ArrayIndex:
    """The same index as cupy_nwt.data.ImageFolder holds it: the paths in one NumPy bytes array, the
    classes in another; a sample is its class and the length of its path (so the path is read)."""

    def __init__(self, n: int) -> None:
        import numpy as np  # noqa: PLC0415

        self.paths = np.array([path(i).encode() for i in range(n)], dtype=bytes)
        self.labels = np.arange(n, dtype=np.int64) % 1000

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[int, int]:
        return int(self.labels[i]), len(self.paths[i])


def path(i: int) -> str:
    return f"/data/train/n{i % 1000:08d}/image_{i:08d}.JPEG"


def module(n: int) -> Any:
    import numpy as np  # noqa: PLC0415

    from cupy_nwt.data import ArrayDataset  # noqa: PLC0415 - in torch's runner too: a dataset from a module

    return ArrayDataset(np.repeat(np.arange(4096, dtype=np.float32), 3 * 32 * 32).reshape(4096, 3, 32, 32))


DATASETS = {"tiny": lambda n: Tiny(), "module": module, "images": lambda n: Images(), "index": Index,
            "array-index": ArrayIndex}
SMALL = ("tiny", "module", "images")  # the datasets of the (main, method, workers) cells
BATCHES = {"images": 256}  # the others: BATCH


def memory(pid: int) -> tuple[int, int]:
    """(PSS, USS) bytes of process ``pid``: its proportional share, and the pages only it holds."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return fields["Pss"], fields["Private_Clean"] + fields["Private_Dirty"]


def one(loader: str, method: str, workers: int, dataset: str, index: int, second: bool,
        device: str = "cpu") -> dict[str, Any]:
    """In the child interpreter: two loaders, each timed from construction to its first batch (spawn: one,
    unless ``second``: it keeps nothing in the process), and the first one's workers' memory."""
    ds = DATASETS[dataset](index)
    out: dict[str, Any] = {"first_batch_s": []}
    make = importlib.import_module(PACKAGE[loader]).DataLoader  # imported at this file's top already (``measure``)
    for k in range(1 if method == "spawn" and not second else 2):
        t = time.perf_counter()
        mine = {"device": device} if loader == "cupy_nwt" else {}  # torch's batches are on the host
        dl = make(ds, batch_size=BATCHES.get(dataset, BATCH), num_workers=workers, multiprocessing_context=method, **mine)
        it = iter(dl)
        next(it)
        out["first_batch_s"].append(time.perf_counter() - t)
        for _ in range(workers - 1):  # batch i is worker i's first: then every worker is up
            next(it)
        out.setdefault("every_worker_s", []).append(time.perf_counter() - t)
        if k == 0:
            pids = [w.pid for w in it._workers] if loader == "torch" else dl.worker_pids()
            pss, uss = zip(*(memory(p) for p in pids))
            out["worker_pss_bytes"], out["worker_uss_bytes"] = statistics.median(pss), statistics.median(uss)
        del it
        if loader != "torch":
            dl.close()
        del dl
    if loader != "torch":
        import cupy_nwt  # noqa: PLC0415

        out["package"] = str(Path(cupy_nwt.__file__).parent.parent)
    return out


def measure(tree: Path | None, cell: dict[str, Any], index: int, second: bool = False,
            device: str = "cpu") -> dict[str, Any]:
    imports = ",".join(filter(None, [MAINS[cell["main"]], PACKAGE[cell["loader"]]]))
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "FIRST_BATCH_MAIN_IMPORTS": imports}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, __file__, "--one", cell["loader"], cell["method"], str(cell["workers"]), cell["dataset"],
           "--index", str(index), "--device", device, *(["--spawn-second"] if second else [])]
    proc = subprocess.run(cmd, env=env, cwd=tree or ROOT, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"first_batch_vs_torch: {cell} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def cells(workers: list[int], methods: list[str], mains: list[str], index_workers: int,
          jax_workers: list[int], datasets: tuple[str, ...] = ("tiny",)) -> list[dict[str, Any]]:
    """Every (dataset, main, method, workers) of ``datasets`` (the ``jax`` main at ``jax_workers`` only), and
    both indexes at ``index_workers`` under a light main."""
    out = [{"dataset": d, "main": m, "method": s, "workers": w}
           for d, m, s, w in itertools.product(datasets, mains, methods, workers) if m != "jax" or w in jax_workers]
    out += [{"dataset": d, "main": "light", "method": s, "workers": index_workers}
            for d in ("index", "array-index") for s in methods]
    return out


def interval(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell and runner: the first and second loader's first batch, and memory where read (median, range)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["main"], r["method"], r["workers"], r["runner"]), []).append(r)
    out = []
    for (dataset, main, method, workers, runner), rs in groups.items():
        s: dict[str, Any] = {"dataset": dataset, "main": main, "method": method, "workers": workers, "runner": runner,
                             "first_loader_s": interval([r["first_batch_s"][0] for r in rs]),
                             "second_loader_s": interval([r["first_batch_s"][1] for r in rs if len(r["first_batch_s"]) > 1]
                                                         or [float("nan")])}
        if all("every_worker_s" in r for r in rs):
            s["every_worker_first_loader_s"] = interval([r["every_worker_s"][0] for r in rs])
        for key in ("worker_pss_bytes", "worker_uss_bytes"):
            s[key.replace("bytes", "mib")] = interval([r[key] / 2**20 for r in rs])
        out.append(s)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", help="a folder holding an older cupy_nwt/ to measure beside this checkout")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", default="2,8,16")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--mains", default=",".join(MAINS))
    p.add_argument("--datasets", default="tiny", help=f"the datasets of the (main, method, workers) cells, from {','.join(SMALL)}")
    p.add_argument("--index", type=int, default=1_200_000, help="entries in the index dataset's list (0: no index cells)")
    p.add_argument("--index-workers", type=int, default=16)
    p.add_argument("--jax-workers", default="16", help="worker counts of the cells whose __main__ imports JAX too")
    p.add_argument("--spawn-second", action="store_true", help="time a second loader under spawn too")
    p.add_argument("--device", choices=["cpu", "auto", "cuda"], default="cpu",
                   help="cupy_nwt's device (torch's batches stay on the host): cpu compares like with like")
    p.add_argument("--no-torch", action="store_true", help="cupy_nwt alone (torch's loader not measured)")
    p.add_argument("--output", help="where to write the JSON (default: beside this file, named for the host)")
    p.add_argument("--one", nargs=4, metavar=("LOADER", "METHOD", "WORKERS", "DATASET"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        loader, method, workers, dataset = args.one
        print(json.dumps(one(loader, method, int(workers), dataset, args.index, args.spawn_second, args.device)))
        return 0
    try:
        workers = [int(w) for w in args.workers.split(",")]
        jax_workers = [int(w) for w in args.jax_workers.split(",")]
    except ValueError:
        workers = jax_workers = []
    methods, mains = args.methods.split(","), args.mains.split(",")
    problems = [*(["--workers takes counts >= 1, comma-separated"] if not workers or min(workers) < 1 else []),
                *([f"--methods from {','.join(METHODS)}"] if set(methods) - set(METHODS) else []),
                *([f"--mains from {','.join(MAINS)}"] if set(mains) - set(MAINS) else []),
                *([f"--datasets from {','.join(SMALL)}"] if set(args.datasets.split(",")) - set(SMALL) else []),
                *(["--rounds and --index-workers must be >= 1, --index >= 0"]
                  if min(args.rounds, args.index_workers) < 1 or args.index < 0 else []),
                *([f"--before {args.before} holds no cupy_nwt/"]
                  if args.before and not (Path(args.before) / "cupy_nwt").is_dir() else [])]
    if problems:
        print(f"first_batch_vs_torch: {'; '.join(problems)}", file=sys.stderr)
        return 2
    runners: dict[str, Path | None] = {"cupy_nwt": ROOT}
    if args.before:
        runners = {"cupy_nwt (before)": Path(args.before).resolve(), **runners}
    if not args.no_torch:
        runners["torch"] = None
    todo = cells(workers, methods, mains, args.index_workers, jax_workers, tuple(args.datasets.split(",")))
    if args.index == 0:
        todo = [c for c in todo if c["dataset"] in SMALL]
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    sys.path.insert(0, str(ROOT))
    from cupy_nwt import system  # noqa: PLC0415
    from cupy_nwt.reporting import tables as report  # noqa: PLC0415

    out = Path(args.output) if args.output else HERE / f"first_batch_vs_torch-{system.host_tag()}.json"
    names = {k: str(v) if v else "torch " + _torch_version() for k, v in runners.items()}
    for r in range(args.rounds):
        for cell in todo:
            order = list(runners) if r % 2 == 0 else list(runners)[::-1]
            for runner in order:
                loader = "torch" if runners[runner] is None else "cupy_nwt"
                got = measure(runners[runner], {**cell, "loader": loader}, args.index, args.spawn_second, args.device)
                rows.append({**cell, "runner": runner, **got})
                second = f"{got['first_batch_s'][1]:.2f} s" if len(got["first_batch_s"]) > 1 else "-"
                print(f"round {r + 1} {time.monotonic() - started:6.0f}s {cell['dataset']:11s} {cell['main']:5s} "
                      f"{cell['method']:10s} {cell['workers']:2d}w {runner:18s} first {got['first_batch_s'][0]:.2f} s, "
                      f"second {second}, worker USS {got['worker_uss_bytes'] / 2**20:.0f} MiB",
                      file=sys.stderr, flush=True)
        doc = {"host": system.host_info().to_dict(), "rounds": r + 1, "batch_size": BATCH, "batch_sizes": BATCHES, "index": args.index,
               "device": args.device,
               "runners": names, "summary": summarize(rows), "runs": rows, "seconds": time.monotonic() - started,
               "load_average": list(os.getloadavg())}
        report.write_json(doc, out)  # after every round: an interrupted run keeps its whole rounds
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _torch_version() -> str:
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    return proc.stdout.strip() or "?"


if __name__ == "__main__":
    raise SystemExit(main())
