"""The overlap experiment over stream (chunk) counts and sizes, in rounds: is async within 10 % of the ideal?

``cupy-nwt overlap`` measures one shape (by default 16 MiB over 4 streams, one chunk each). This runs
it for every stream count of ``--streams`` and total size of ``--sizes``, all shapes once per round
and ``--rounds`` rounds one after the other (so a drift of the GPU's clocks or a neighbour's load
falls on every shape alike). Per shape and pipelined version, the rounds' ratios to the ideal
pipelined time (the experiment's ``vs_ideal``) give a median, a 90 % bootstrap interval and a
verdict on the target (``vs_ideal`` < 1.10: ``met``, ``missed`` or ``undecided`` where the interval
holds 1.10). Writes one JSON file (``--output``):

    PYTHONPATH=. python bench/studies/are_transfers_as_fast_as_cuda_c/overlap_sweep.py --streams 2,4,8 --sizes 16MiB,64MiB --rounds 3 --output overlap_sweep.json

Exit 0 done, 2 bad arguments, 3 no usable GPU (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cupy_nwt.reporting.figures import figure
from cupy_nwt.reporting.tables import write_json

TARGET = 1.10  # DESIGN.md: v1 and v2 within 10 % of the ideal pipelined time
VERSIONS = ("async_v1", "async_v2")
UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def parse_sizes(text: str) -> list[int]:
    """``16MiB,64MiB`` -> bytes; each a whole multiple of 4 (float32 elements)."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        unit = next((u for u in UNITS if part.endswith(u)), "")
        number = part[:-len(unit)] if unit else part
        if not number.isdigit() or int(number) < 1:
            raise ValueError(f"--sizes takes sizes such as 16MiB,64MiB, got {part!r}")
        nbytes = int(number) * UNITS.get(unit, 1)
        if nbytes % 4:
            raise ValueError(f"--sizes: {part} is not a whole number of float32 elements")
        out.append(nbytes)
    if not out:
        raise ValueError("--sizes names no size")
    return out


def parse_counts(text: str) -> list[int]:
    try:
        out = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"--streams takes counts such as 2,4,8, got {text!r}") from None
    if not out or min(out) < 1:
        raise ValueError(f"--streams takes counts >= 1, got {text!r}")
    return out


def run_on_gpu(streams: int, nbytes: int, repeats: int) -> dict[str, Any]:
    """One ``cupy-nwt overlap`` run of this shape, as its JSON document."""
    from cupy_nwt.experiments import overlap  # noqa: PLC0415
    from cupy_nwt.reporting import tables as report  # noqa: PLC0415

    result = overlap.run_overlap(overlap.OverlapConfig(streams=streams, elements=nbytes // 4, repeats=repeats))
    return json.loads(report.to_json(result))


def sweep(streams: Sequence[int], sizes: Sequence[int], rounds: int,
          run: Callable[[int, int], dict[str, Any]], progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Every shape once per round, ``rounds`` rounds; each shape's versions judged over the rounds."""
    seen: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in range(rounds):
        for s in streams:
            for n in sizes:
                doc = run(s, n)
                keep: dict[str, Any] = {"versions": [{"name": v["name"], "vs_ideal": v.get("vs_ideal"),
                                      "median_s": (v.get("seconds") or {}).get("median")} for v in doc.get("versions", [])],
                        "ideal_seconds": doc.get("ideal_seconds"), "correct": doc.get("correct")}
                seen.setdefault((s, n), []).append(keep)
                ratios = "  ".join(f"{v['name']} {v['vs_ideal']:.3f}" for v in keep["versions"]
                                   if v["name"] in VERSIONS and isinstance(v["vs_ideal"], (int, float)))
                progress(f"round {r + 1}/{rounds} streams={s} {n / 2**20:g} MiB: {ratios} x ideal")
    shapes: list[dict[str, Any]] = []
    for (s, n), runs in seen.items():
        judged: dict[str, dict[str, Any]] = {}
        for name in VERSIONS:
            values = [v["vs_ideal"] for one in runs for v in one["versions"] if v["name"] == name]
            judged[name] = figure([float(x) for x in values if isinstance(x, (int, float))], TARGET,
                                  higher_is_better=False)
        shapes.append({"streams": s, "chunks": s, "nbytes": n, "rounds": runs, "vs_ideal": judged,
                       "correct": all(bool(x["correct"]) for x in runs)})
    return {"format": "cupy_nwt.overlap_sweep/1", "target_vs_ideal_below": TARGET, "rounds": rounds,
            "shapes": shapes,
            "verdicts": {v: [f"{sh['streams']} streams {sh['nbytes']} B {name}" for sh in shapes
                             for name, f in sh["vs_ideal"].items() if f["verdict"] == v]
                         for v in ("met", "missed", "undecided")}}


def table(doc: dict[str, Any]) -> str:
    lines = [f"{'streams':>7} {'MiB':>5} {'version':9} {'x ideal':>7} {'90% interval':>13}  verdict (< {TARGET})"]
    for sh in doc["shapes"]:
        for name, f in sh["vs_ideal"].items():
            if f["median"] is None:
                continue
            lines.append(f"{sh['streams']:>7} {sh['nbytes'] / 2**20:>5g} {name:9} {f['median']:>7.3f} "
                         f"{f['low']:>6.3f}-{f['high']:<6.3f}  {f['verdict']} ({f['repeats']} rounds)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", default="2,4,8", help="stream counts, one chunk each (default 2,4,8)")
    p.add_argument("--sizes", default="16MiB,64MiB", help="total bytes per shape (default 16MiB,64MiB)")
    p.add_argument("--rounds", type=int, default=3, help="rounds over all shapes (default 3)")
    p.add_argument("--repeats", type=int, default=20, help="timed repeats inside each run (default 20)")
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        streams, sizes = parse_counts(args.streams), parse_sizes(args.sizes)
        if args.rounds < 1 or args.repeats < 1:
            raise ValueError("--rounds and --repeats must be >= 1")
        if any(n // 4 % s for s in streams for n in sizes):
            raise ValueError("every size must split into whole float32 chunks over every stream count")
    except ValueError as exc:
        print(f"overlap_sweep: {exc}", file=sys.stderr)
        return 2
    from cupy_nwt import cuda  # noqa: PLC0415

    try:
        cuda.require_gpu()
    except cuda.NoGPUError as exc:
        print(f"overlap_sweep: {exc}", file=sys.stderr)
        return 3
    doc = sweep(streams, sizes, args.rounds, lambda s, n: run_on_gpu(s, n, args.repeats))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_json(doc, args.output)
    print(table(doc))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
