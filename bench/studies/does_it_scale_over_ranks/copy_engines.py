"""Do two processes' H2D copies share one copy engine? Aggregate GB/s of one process copying and of two at once.

Two ranks on one GPU made 0.86x one rank's samples (the H100 run, ``scaleout.py``). One suspect: each
process copies its batches host-to-device on its own stream, and a GPU may give the copies of both
one engine per direction, in turns. This measures it directly: two worker processes (spawned, each
with its own CUDA context, as two ranks have), each with a page-locked ``--mib`` MiB buffer and a
device buffer, copy H2D in a loop for ``--seconds``. Each round times process 0 alone, then both at
once (started at the same monotonic instant); ``--rounds`` rounds in turn. Reported per round: one
process's GB/s, the pair's aggregate (all bytes over the span from the first start to the last end)
and each of the pair's own GB/s; over the rounds the aggregate's ratio to one process, its median,
90 % interval and a reading: near 1.0 the two share what one process already fills (one engine or
the link), near 2.0 they do not. Writes one JSON file (``--output``):

    PYTHONPATH=. python bench/studies/does_it_scale_over_ranks/copy_engines.py --output copy_engines.json

Exit 0 done, 2 bad arguments, 3 no usable GPU (one line).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cupy_nwt.reporting.figures import figure
from cupy_nwt.reporting.tables import write_json

FORMAT = "cupy_nwt.copy_engines/1"
Copy = tuple[int, float, float]  # bytes copied, start, end (time.monotonic: one clock for all processes)


def copier(nbytes: int, orders: Any, replies: Any) -> None:
    """A worker: page-locked and device buffers once, then one timed copy loop per order until None."""
    from cupy_nwt import cuda  # noqa: PLC0415 - in the spawned process, not at the parent's import

    src, dst = cuda.pinned_empty(nbytes), cuda.device_empty(nbytes)
    src[:] = 1
    side = cuda.stream()
    cuda.memcpy_h2d(dst, src, side)  # the first copy pays the context's and the mapping's set-up
    side.synchronize()
    replies.put(("ready", 0, 0.0, 0.0))
    while (order := orders.get()) is not None:
        start_at, seconds = order
        while time.monotonic() < start_at:
            pass
        t0 = time.monotonic()
        copies = 0
        while time.monotonic() - t0 < seconds:
            cuda.memcpy_h2d(dst, src, side)
            side.synchronize()
            copies += 1
        replies.put(("done", copies * nbytes, t0, time.monotonic()))


def gbps(copies: Sequence[Copy]) -> float:
    """All bytes over the span from the first start to the last end, in GB/s."""
    span = max(c[2] for c in copies) - min(c[1] for c in copies)
    return sum(c[0] for c in copies) / span / 1e9 if span > 0 else 0.0


def rounds(run: Callable[[int], list[Copy]], count: int) -> dict[str, Any]:
    """``count`` rounds of one process alone, then two at once (``run(n)``: the copies of n processes)."""
    per_round = []
    for _ in range(count):
        alone, both = run(1), run(2)
        per_round.append({"one_gbps": gbps(alone), "two_aggregate_gbps": gbps(both),
                          "two_each_gbps": [gbps([c]) for c in both]})
    ratio = [r["two_aggregate_gbps"] / r["one_gbps"] for r in per_round if r["one_gbps"] > 0]
    summary = figure(ratio)
    reading = None
    if summary["median"] is not None:
        reading = ("the two share what one process fills (one engine per direction, or the link)"
                   if summary["high"] < 1.5 else "the two copy side by side (an engine each)"
                   if summary["low"] >= 1.5 else "undecided between sharing and copying side by side")
    return {"rounds": per_round, "one_gbps": figure([r["one_gbps"] for r in per_round]),
            "two_aggregate_gbps": figure([r["two_aggregate_gbps"] for r in per_round]),
            "two_over_one": summary, "reading": reading}


class Copiers:
    """Two spawned copier processes; ``run(n)`` has the first n copy ``seconds`` from the same instant."""

    def __init__(self, nbytes: int, seconds: float) -> None:
        ctx = mp.get_context("spawn")
        self.seconds = seconds
        self.orders = [ctx.Queue() for _ in range(2)]
        self.replies = ctx.Queue()
        self.procs = [ctx.Process(target=copier, args=(nbytes, q, self.replies), daemon=True) for q in self.orders]
        for p in self.procs:
            p.start()
        for _ in self.procs:
            self.replies.get(timeout=120)

    def run(self, n: int) -> list[Copy]:
        start_at = time.monotonic() + 0.2
        for q in self.orders[:n]:
            q.put((start_at, self.seconds))
        got = [self.replies.get(timeout=self.seconds + 60) for _ in range(n)]
        return [(int(b), float(t0), float(t1)) for _, b, t0, t1 in got]

    def close(self) -> None:
        for q in self.orders:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=256, help="page-locked MiB each process copies (default 256)")
    p.add_argument("--seconds", type=float, default=2.0, help="seconds of copies per process and phase (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of one alone, then two (default 3)")
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    if args.mib < 1 or args.seconds <= 0 or args.rounds < 1:
        print("copy_engines: need --mib >= 1, --seconds > 0 and --rounds >= 1", file=sys.stderr)
        return 2
    from cupy_nwt import cuda  # noqa: PLC0415

    try:
        cuda.require_gpu()
    except cuda.NoGPUError as exc:
        print(f"copy_engines: {exc}", file=sys.stderr)
        return 3
    copiers = Copiers(args.mib * 2**20, args.seconds)
    try:
        doc = {"format": FORMAT, "device": cuda.device_info(0).name, "config": vars(args) | {"output": str(args.output)},
               **rounds(copiers.run, args.rounds)}
    finally:
        copiers.close()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_json(doc, args.output)
    for i, r in enumerate(doc["rounds"]):
        print(f"round {i + 1}: one process {r['one_gbps']:.1f} GB/s; two at once {r['two_aggregate_gbps']:.1f} GB/s "
              f"in all ({', '.join(f'{x:.1f}' for x in r['two_each_gbps'])} each)")
    f = doc["two_over_one"]
    print(f"two over one: {f['median']:.2f}x (90% interval {f['low']:.2f}-{f['high']:.2f}): {doc['reading']}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
