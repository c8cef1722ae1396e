"""Does the GPU wait for data? cupy_nwt (prefetcher on and off) beside torch's DataLoader, one run.

Each mode feeds the same dataset, batch transform, batch size and worker count to a simulated
training step (``cupy_nwt.experiments.step_sim``: a kernel of known duration that reads the batch)
in two loops, one after the other on the same loader and workers:

* ``synced``: each step ends in a host sync (a loss read back every step), so the main process's
  hand-over of the next batch is GPU idle time every step, whatever the loader does;
* ``queued``: each step is enqueued and the host goes on to take the next batch while the GPU runs
  it, waiting only on the step ``--queue-depth`` back (default 2: one running, one queued), as a
  training loop that reads nothing back does. Idle is timed by the steps' CUDA events alone.

Reported per mode and loop: samples/s delivered to the GPU and the GPU's idle fraction in the steady
state, and apart from them the start-up (the wait for the first batch). A throwaway loader goes
first (``first_loader_seconds``), so no row's start-up holds the forkserver server's own start.

Every loader keeps its workers between epochs (``persistent_workers=True``, both libraries): with CUDA
in use cupy_nwt starts workers by forkserver, 0.76-0.84 s a restart on the 2-core VM (fork 0.17 s,
persistent under 0.01 s), so the epoch boundaries within each loop's steps would otherwise make the
idle fraction a measure of restarts, not of prefetching.

* ``cupy_nwt``: ``DataLoader(device="cuda", pin_memory=True)``: registered ring, the copy of batch
  n+1 in flight on a side stream while batch n is used.
* ``cupy_nwt-noprefetch``: the same loader on the host (``zero_copy`` views), then a blocking
  ``cudaMemcpy`` of each batch from that pageable memory before its step (``cuda.to_device``): the
  "retrieve -> copy -> train" pipeline of the seed issue, with no asynchronous path in it.
* ``torch``: ``torch.utils.data.DataLoader(pin_memory=True)`` and ``.to("cuda", non_blocking=True)``.
* ``torch-nopin``: the same without pinning, blocking copies.

Writes ``gpu_feed-<host>.json`` beside this script (or into ``--out-dir``). Needs a GPU (and a CUDA build of torch
for the torch modes, which are skipped with the reason otherwise):

    PYTHONPATH=. python bench/studies/does_the_gpu_wait_for_batches/gpu_feed.py --workers 4,8,15 --step-ms 5

``--repeats N`` measures every row N times with a fresh loader each (rows interleaved within a
repeat, so a neighbour's load falls on every mode alike) and ``--seconds S`` makes each loop at least
S seconds of steps; ``summary`` then holds, per workload, workers, mode and loop, the GPU idle fraction's
median, 90 % bootstrap interval and verdict on the target (idle < 5 % a step: ``met``, ``missed``, or
``undecided`` where the interval holds 5 %), and samples/s the same way. ``bench/gpu_session.sh``'s
gpu-feed step runs the queued loop, 5-s loops, 3 repeats. ``--tuned`` adds, per workload, the count
the tuner picks for this step (``tune_num_workers(..., step=--step-ms, strategy="fast")``, in
``tuned``): the GPU wait at the tuner's pick, in the same rows and summary.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent  # this study's folder
ROOT = Path(__file__).resolve().parents[3]  # the repository: bench/studies/<study>/ is three below
sys.path.insert(0, str(ROOT))  # the shared workloads: bench.workloads

from bench.workloads import TorchCollate, endless, make_workloads, parse_workers  # noqa: E402
from cupy_nwt import DataLoader, cuda, system  # noqa: E402
from cupy_nwt.experiments.step_sim import QUEUE_DEPTH, FeedResult, SimulatedStep, feed, feed_queued  # noqa: E402
from cupy_nwt.reporting import tables as report  # noqa: E402
from cupy_nwt.reporting.figures import figure  # noqa: E402

MODES = ("cupy_nwt", "cupy_nwt-noprefetch", "torch", "torch-nopin")
LOOPS = ("synced", "queued")
IDLE_TARGET = 0.05  # DESIGN.md: GPU idle < 5 % a step


def steps_for(steps: int, seconds: float, step_ms: float) -> int:
    """Timed steps a loop: ``steps``, or more where ``seconds`` of ``step_ms`` steps need more."""
    return max(steps, math.ceil(seconds * 1e3 / step_ms)) if seconds > 0 else steps


def tuned_workers(workload: Any, batch_size: int, step_ms: float, device: str = "cuda", iterations: int = 40,
                  tune: Callable[..., Any] | None = None) -> dict[str, Any]:
    """The tuner's pick for ``workload`` fed to a ``step_ms`` step (the fast strategy), why, and its seconds."""
    if tune is None:
        from cupy_nwt import tune_num_workers as tune  # noqa: PLC0415
    start = time.perf_counter()
    result = tune(workload.dataset, batch_size=batch_size, step=step_ms / 1e3, strategy="fast", device=device,
                  batch_transform=workload.batch_transform, iterations=iterations, progress=False, warn=False)
    return {"workers": int(result.best_workers), "why": str(getattr(result, "why", "")),
            "seconds": time.perf_counter() - start}


def summarize_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload, workers, mode and loop over the repeats: idle fraction (judged against 5 %) and samples/s."""
    groups: dict[tuple[str, int, str, str], list[dict[str, Any]]] = {}
    for row in results:
        for loop, r in row["loops"].items():
            groups.setdefault((row["workload"], row["num_workers"], row["mode"], loop), []).append(r)
    return [{"workload": w, "num_workers": n, "mode": m, "loop": loop,
             "idle_fraction": figure([r["idle_fraction"] for r in rs], IDLE_TARGET, higher_is_better=False),
             "samples_per_second": figure([r["samples_per_second"] for r in rs]),
             "loop_seconds": [r["wall_seconds"] for r in rs]}
            for (w, n, m, loop), rs in groups.items()]


def batches(mode: str, workload: Any, workers: int, batch_size: int, seed: int) -> tuple[Any, Iterator[Any]]:
    """(loader, endless device batches) for ``mode``; workers persist across epochs; the caller closes the loader."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: use {', '.join(MODES)}")
    persistent = workers > 0
    if mode.startswith("cupy_nwt"):
        on_gpu = mode == "cupy_nwt"
        loader = DataLoader(workload.dataset, batch_size=batch_size, shuffle=True, seed=seed, num_workers=workers,
                            device="cuda" if on_gpu else "cpu", pin_memory=on_gpu, zero_copy=not on_gpu,
                            batch_transform=workload.batch_transform, persistent_workers=persistent,
                            output="cupy" if on_gpu else "numpy")  # torch runs in this process too: CuPy steps here
        if on_gpu:
            return loader, _epochs(loader, lambda b: b)
        return loader, _epochs(loader, lambda b: tuple(cuda.to_device(a) for a in b))
    import torch

    pinned = mode == "torch"
    loader = torch.utils.data.DataLoader(
        workload.dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
        collate_fn=TorchCollate(workload.batch_transform), pin_memory=pinned,
        prefetch_factor=2 if workers else None, generator=torch.Generator().manual_seed(seed),
        persistent_workers=persistent, multiprocessing_context="fork" if workers else None)
    return loader, _epochs(loader, lambda b: tuple(t.to("cuda", non_blocking=pinned) for t in b))


def first_loader_seconds(workload: Any, batch_size: int, device: str = "cuda") -> float:
    """Seconds to the first batch of a throwaway one-worker loader: what only the first loader of a process pays.

    With CUDA in use workers start by forkserver, and the server starts once per process and imports
    ``__main__`` (here torch with it) before its first fork. Taken before the rows, so no mode's
    start-up holds it (on the H100 run the first row's 4.98 s against the next one's 0.28 s).
    """
    start = time.perf_counter()
    loader = DataLoader(workload.dataset, batch_size=batch_size, num_workers=1, device=device,
                        pin_memory=device == "cuda", batch_transform=workload.batch_transform)
    try:
        next(iter(loader))
        return time.perf_counter() - start
    finally:
        loader.close()


def release(loader: Any, stream: Generator[Any, None, None]) -> None:
    """Stop a mode's workers before the next mode starts, so no idle persistent worker loads the host.

    cupy_nwt's loader has ``close()``; torch's persistent workers stop when their iterator is
    collected, which the caller allows by dropping its last references (``del loader, stream``).
    """
    stream.close()
    if hasattr(loader, "close"):
        loader.close()
    gc.collect()


def _epochs(loader: Any, to_gpu) -> Iterator[Any]:
    for b in endless(loader):
        yield to_gpu(b)


def measure(stream: Iterator[Any], step: Any, loops: list[str], *, steps: int, warmup: int, depth: int,
            batch_size: int, label: str, step_seconds: float,
            clock: Callable[[], float] = time.perf_counter) -> dict[str, FeedResult]:
    """Each of ``loops`` in turn on one loader's batches: ``step`` is called (synced) or enqueued (queued).

    The loops share the loader, so its workers start once; each has its own warm-up, and the second
    one's start-up is only the hand-over of a batch already made.
    """
    out: dict[str, FeedResult] = {}
    for loop in loops:
        if loop == "synced":
            out[loop] = feed(stream, step, steps=steps, warmup=warmup, batch_size=batch_size, label=label,
                             step_seconds=step_seconds, clock=clock)
        elif loop == "queued":
            out[loop] = feed_queued(stream, step, steps=steps, warmup=warmup, batch_size=batch_size, label=label,
                                    step_seconds=step_seconds, depth=depth, clock=clock)
        else:
            raise ValueError(f"unknown loop {loop!r}: use {', '.join(LOOPS)}")
    return out


def row_cells(row: dict[str, Any], loops: list[str]) -> list[Any]:
    """One text-table row: the loops' samples/s, GPU idle and host ms per take side by side, then the start-up."""
    cells: list[Any] = [row["workload"], row["num_workers"], row["mode"]]
    for loop in loops:
        r = row["loops"][loop]
        cells += [round(r["samples_per_second"]), f"{r['idle_fraction']:.1%}",
                  f"{1e3 * r.get('take_seconds', 0.0) / r['steps']:.2f}"]
    return cells + [round(row["startup_seconds"], 3)]


def torch_cuda_reason() -> str | None:
    """Why the torch modes cannot run here, or None."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} has no usable CUDA"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="4", help="comma-separated worker counts (default 4)")
    p.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    p.add_argument("--step-ms", type=float, default=5.0, help="simulated step length (default 5 ms)")
    p.add_argument("--steps", type=int, default=150, help="timed steps per mode and loop (default 150)")
    p.add_argument("--seconds", type=float, default=0.0, help="at least this many seconds of steps a loop (default 0)")
    p.add_argument("--repeats", type=int, default=1, help="fresh loaders per row, rows interleaved (default 1)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before each loop (default 10)")
    p.add_argument("--loops", default=",".join(LOOPS), help=f"subset of {','.join(LOOPS)}, run in this order")
    p.add_argument("--queue-depth", type=int, default=QUEUE_DEPTH,
                   help=f"steps in flight at most in the queued loop (default {QUEUE_DEPTH})")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workloads", default="numba-array,decode-png", help="which of loader_compare's workloads")
    p.add_argument("--fmt", choices=("png", "jpeg"), default="png", help="the decode workload's images (decode-<fmt>)")
    p.add_argument("--tuned", action="store_true", help="also each workload's count as the tuner picks it for this step")
    p.add_argument("--out-dir", default=str(RESULTS))
    args = p.parse_args(argv)
    try:
        workers = parse_workers(args.workers)
        modes = [m for m in args.modes.split(",") if m]
        if unknown := set(modes) - set(MODES):
            raise ValueError(f"unknown mode(s) {sorted(unknown)}: use {', '.join(MODES)}")
        loops = [m for m in args.loops.split(",") if m]
        if not loops or (unknown := set(loops) - set(LOOPS)):
            raise ValueError(f"unknown or no loop(s) {args.loops!r}: use {', '.join(LOOPS)}")
        if args.queue_depth < 1 or args.steps < 1 or args.warmup < 0 or args.repeats < 1 or args.seconds < 0:
            raise ValueError("need --queue-depth >= 1, --steps >= 1, --warmup >= 0, --repeats >= 1 and --seconds >= 0")
        steps = steps_for(args.steps, args.seconds, args.step_ms)
        cuda.require_gpu()
    except (ValueError, cuda.NoGPUError) as exc:
        print(f"gpu_feed: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, cuda.NoGPUError) else 2
    skipped = {}
    if (why := torch_cuda_reason()) is not None:
        skipped = {m: why for m in modes if m.startswith("torch")}
        modes = [m for m in modes if m not in skipped]

    step = SimulatedStep(args.step_ms / 1e3)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        chosen = [w for w in make_workloads(Path(tmp), fmt=args.fmt) if w.name in args.workloads.split(",")]
        first_loader = None
        if chosen and any(m.startswith("cupy_nwt") for m in modes) and max(workers) > 0:
            first_loader = first_loader_seconds(chosen[0], args.batch_size)
            print(f"first loader in this process (forkserver server and preload, paid once): {first_loader:.2f} s",
                  file=sys.stderr)
        tuned = {}
        if args.tuned:
            for wl in chosen:
                tuned[wl.name] = tuned_workers(wl, args.batch_size, args.step_ms)
                print(f"tuner's pick for {wl.name} at a {args.step_ms:g}-ms step: {tuned[wl.name]['workers']} workers "
                      f"({tuned[wl.name]['seconds']:.1f} s)", file=sys.stderr)
        cells = [(wl, w) for wl in chosen
                 for w in [*workers, *([tuned[wl.name]["workers"]] if wl.name in tuned
                                       and tuned[wl.name]["workers"] not in workers else [])]]
        for repeat, (wl, w), mode in itertools.product(range(args.repeats), cells, modes):
            loader, stream = batches(mode, wl, w, args.batch_size, seed=repeat)
            try:
                got = measure(stream, step, loops, steps=steps, warmup=args.warmup, depth=args.queue_depth,
                              batch_size=args.batch_size, label=mode, step_seconds=args.step_ms / 1e3)
            finally:
                release(loader, stream)
                del loader, stream
            row = {"workload": wl.name, "num_workers": w, "mode": mode, "repeat": repeat, "persistent_workers": w > 0,
                   "startup_seconds": got[loops[0]].startup_seconds,
                   "loops": {loop: r.to_dict() for loop, r in got.items()}}
            results.append(row)
            print(f"{repeat + 1}/{args.repeats} {wl.name:12} workers={w:<3} {mode:20} "
                  + "  ".join(f"{loop} {r.samples_per_second:6.0f} samples/s idle {r.idle_fraction:6.1%}"
                              f" take {1e3 * r.take_seconds / r.steps:5.2f} ms" for loop, r in got.items())
                  + f"  start-up {row['startup_seconds']:.2f} s", file=sys.stderr)
    doc = {"host": system.host_info(), "device": cuda.device_info(cuda.current_device()),
           "config": vars(args), "steps_per_loop": steps, "skipped": skipped, "first_loader_seconds": first_loader,
           "tuned": tuned,
           "results": results, "summary": summarize_rows(results)}
    for g in doc["summary"]:
        g["tuned_pick"] = tuned.get(g["workload"], {}).get("workers") == g["num_workers"]
    out = Path(args.out_dir) / f"gpu_feed-{system.host_tag()}.json"
    report.write_json(doc, out)
    heads = [h for loop in loops for h in (f"samples/s {loop}", f"GPU idle {loop}", f"take ms {loop}")]
    print(report.table(["workload", "workers", "mode", *heads, "start-up s"], [row_cells(r, loops) for r in results]))
    print(report.table(["workload", "workers", "mode", "loop", "repeats", "GPU idle median", "90% interval", "< 5%?"],
                       [[g["workload"], g["num_workers"], g["mode"], g["loop"], g["idle_fraction"]["repeats"],
                         f"{g['idle_fraction']['median']:.1%}",
                         f"{g['idle_fraction']['low']:.1%}-{g['idle_fraction']['high']:.1%}",
                         g["idle_fraction"]["verdict"]] for g in doc["summary"]]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
