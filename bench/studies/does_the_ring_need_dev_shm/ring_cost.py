"""What making a ring costs, by where it lives: the part of a worker start that the ring's memory decides.

Each round makes and frees one ring of each kind in turn (so a neighbour's load hits all alike), the
layout ``worker_start.py``'s loaders get (32 rows of 1,024 float32, 4 slots): ``named``, the /dev/shm
segment (open, ``posix_fallocate``, the resource tracker's registration, unlink); ``memfd``, the
anonymous file a process pool makes and sizes (``memfd_create``, ``ftruncate``, ``posix_fallocate``,
seals); ``room``, the memory and cgroup check both now begin with. Wall and CPU microseconds per
kind, medians over the rounds. Writes ``<host>/ring_cost.json`` beside itself:

    .venv/bin/python bench/studies/does_the_ring_need_dev_shm/ring_cost.py --rounds 300
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cupy_nwt import system
from cupy_nwt.loader.ring.memory import RingFile, check_room
from cupy_nwt.loader.ring.ring import Ring, SlotLayout
from cupy_nwt.reporting import tables as report
from cupy_nwt.system import memory_room

RESULTS = Path(__file__).resolve().parent


def kinds(rows: int, width: int, slots: int) -> dict[str, Callable[[], None]]:
    layout = SlotLayout.for_batch((np.zeros((rows, width), np.float32),), rows)

    def named() -> None:
        Ring(layout, slots, shared=True).close()

    def memfd() -> None:
        file = RingFile.create()
        if file is None:
            raise SystemExit("ring_cost: memfd_create is not available here")
        try:
            Ring(layout, slots, file=file).close()
        finally:
            file.close()

    return {"named": named, "memfd": memfd, "room": lambda: check_room(1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--width", type=int, default=1024, help="float32 values per row")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--note", default="")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args(argv)
    if min(args.rounds, args.rows, args.width, args.slots) < 1:
        print("ring_cost: rounds, rows, width and slots must be >= 1", file=sys.stderr)
        return 2
    todo = kinds(args.rows, args.width, args.slots)
    wall: dict[str, list[float]] = {k: [] for k in todo}
    cpu: dict[str, list[float]] = {k: [] for k in todo}
    for _ in range(args.rounds):
        for name, make in todo.items():
            t, c = time.perf_counter(), time.process_time()
            make()
            wall[name].append((time.perf_counter() - t) * 1e6)
            cpu[name].append((time.process_time() - c) * 1e6)
    result = {"rounds": args.rounds, "rows": args.rows, "width": args.width, "slots": args.slots,
              "room": memory_room().bound, "host": system.host_info(), "note": args.note,
              "kinds": {k: {"wall_us_median": statistics.median(wall[k]), "cpu_us_median": statistics.median(cpu[k]),
                            "wall_us_min": min(wall[k]), "wall_us_max": max(wall[k])} for k in todo}}
    for k, v in result["kinds"].items():
        print(f"{k:6s} wall {v['wall_us_median']:8.0f} us (min {v['wall_us_min']:.0f})  cpu {v['cpu_us_median']:8.0f} us")
    path = report.write_json(result, args.output or RESULTS / system.host_tag() / "ring_cost.json")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
