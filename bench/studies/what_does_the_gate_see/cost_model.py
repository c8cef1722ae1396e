"""What does the gate's count see? Instructions, cache misses, page faults and system calls of the docs' pipeline
with each planted regression, beside its native CPU time; the cost model's weights chosen from them.

The pipeline is ``docs/ci-gate.md``'s (``SyntheticCIFAR10(n=4096)``, ``CifarTrainTransform``, batch 128), with
each plant of ``bench/gate_noise_proof.py --mode plants`` in turn. For each variant:

* its **counts** (``cupy_nwt.pytest_plugin._count.count_pipeline``, the gate's own: ``--count-samples``
  samples under callgrind with the simulated caches, system calls from valgrind's log, page faults from the
  region run natively), the unchanged one ``--repeats`` times: their spread is the count's floor;
* its **native CPU** per sample: the same batches made in this process, the variants interleaved,
  ``--timings`` times each, the median kept (user + system CPU of the process, ``getrusage``);
* two **kernel unit costs**, natively: CPU seconds of one minor page fault (a fresh anonymous page written)
  and of one ``stat`` of a file (the Python loop's own cost taken out of both).

The weights: cache misses at the usual cycle-estimate weights (10 an L1 miss, 100 a last-level miss:
callgrind's and CodSpeed's); one estimated cycle's native seconds from the unchanged variant (its CPU less its
faults' and system calls' share, over its instructions and weighted misses); a page fault's and a system
call's weight their native seconds over that. Each model (instructions alone; with cache misses; with the
kernel too) is then set against each plant's measured change of native CPU.

    python bench/studies/what_does_the_gate_see/cost_model.py --out bench/studies/what_does_the_gate_see/vm-2cpu/cost_model.json
"""

from __future__ import annotations

import argparse
import gc
import importlib
import mmap
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def variants(folder: Path) -> dict[str, Any]:
    """name -> the imported pipeline module of that plant (each its own module: PLANT is a module constant)."""
    import gate_noise_proof as gnp  # noqa: PLC0415

    out = {}
    sys.path.insert(0, str(folder))
    for i, (name, plant) in enumerate(gnp.MODES["plants"].items()):
        (folder / f"pipeline_{i}.py").write_text(gnp.pipeline_source("plants", plant))
        out[name] = importlib.import_module(f"pipeline_{i}")
    return out


def native_cpu(mods: dict[str, Any], samples: int, timings: int) -> dict[str, list[float]]:
    """CPU seconds per sample of making ``samples`` samples' batches, each variant in turn, ``timings`` times."""
    from cupy_nwt.loader.workers.maker import BatchMaker  # noqa: PLC0415
    from cupy_nwt.pytest_plugin._count import plan  # noqa: PLC0415

    makers = {n: BatchMaker(m.Data(n=4096), None, m.Transform(), batched=True, batch_size=128) for n, m in mods.items()}
    batches = plan(4096, 128, samples)
    for mk in makers.values():
        mk.make(*batches[0])
    out: dict[str, list[float]] = {n: [] for n in makers}
    for _ in range(timings):
        for n, mk in makers.items():
            gc.collect()
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            for idx, seed in batches:
                mk.make(idx, seed)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            out[n].append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / samples)
    return out


def fault_seconds(pages: int = 4096) -> float:
    def touch(m: mmap.mmap) -> float:
        t0 = time.process_time()
        for i in range(0, pages * 4096, 4096):
            m[i] = 1
        return time.process_time() - t0

    fresh = mmap.mmap(-1, pages * 4096)
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    first = touch(fresh)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    again = touch(fresh)  # the same writes, the pages present: the loop's own cost
    fresh.close()
    return (first - again) / max(1, faults)


def stat_seconds(n: int = 20000) -> float:
    t0 = time.process_time()
    for _ in range(n):
        os.stat(__file__)
    t1 = time.process_time()
    for _ in range(n):
        pass
    return ((t1 - t0) - (time.process_time() - t1)) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count-samples", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="counts of the unchanged pipeline (its spread)")
    ap.add_argument("--timings", type=int, default=7, help="native timings of each variant, interleaved")
    ap.add_argument("--native-samples", type=int, default=512)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if min(args.count_samples, args.repeats, args.timings, args.native_samples) < 1:
        ap.error("every count must be >= 1")
    from cupy_nwt.nwt.fingerprint import machine_fingerprint  # noqa: PLC0415
    from cupy_nwt.nwt.store import write_json_atomic  # noqa: PLC0415
    from cupy_nwt.pytest_plugin import _cost  # noqa: PLC0415
    from cupy_nwt.pytest_plugin._count import count_pipeline  # noqa: PLC0415

    started = time.time()
    with tempfile.TemporaryDirectory(prefix="what_does_the_gate_see_") as tmp:
        mods = variants(Path(tmp))
        counts: dict[str, list[dict[str, Any]]] = {n: [] for n in mods}
        for r in range(args.repeats):
            for n, m in mods.items():
                if r and n != "unchanged":
                    continue
                c = count_pipeline(m.Data(n=4096), batch_size=128, collate_fn=None, batch_transform=m.Transform(),
                                   samples=args.count_samples)
                assert c.cost is not None
                counts[n].append({**c.cost.to_dict(), "cost": c.cost.total, "seconds": c.seconds})
                print(f"counted {n}: cost {c.cost.total:,.0f} a sample, {c.seconds:.0f} s", flush=True)
        cpu = native_cpu(mods, args.native_samples, args.timings)
    faults = [fault_seconds() for _ in range(7)]
    stats = [stat_seconds() for _ in range(7)]
    s_fault, s_stat = statistics.median(faults), statistics.median(stats)
    base = counts["unchanged"][0]
    base_cpu = statistics.median(cpu["unchanged"])
    est = base["instructions"] + _cost.W_L1 * base["l1_misses"] + _cost.W_LL * base["ll_misses"]
    s_cycle = (base_cpu - s_fault * base["page_faults"] - s_stat * base["syscalls"]) / est
    weights = {"page_faults": s_fault / s_cycle, "syscalls": s_stat / s_cycle}

    def models(c: dict[str, Any]) -> dict[str, float]:
        cache = c["instructions"] + _cost.W_L1 * c["l1_misses"] + _cost.W_LL * c["ll_misses"]
        return {"instructions": c["instructions"], "with_cache": cache,
                "with_cache_and_kernel": cache + weights["page_faults"] * c["page_faults"]
                + weights["syscalls"] * c["syscalls"], "gate_cost": c["cost"]}

    base_models = models(base)
    table = {}
    for n in mods:
        c = counts[n][0]
        m = models(c)
        med = statistics.median(cpu[n])
        table[n] = {"native_cpu_us_a_sample": 1e6 * med, "native_cpu_us_rounds": [1e6 * x for x in cpu[n]],
                    "native_cpu_change_pct": 100.0 * (med / base_cpu - 1.0),
                    "components": {k: c[k] for k, _ in _cost.COMPONENTS},
                    "model_change_pct": {k: 100.0 * (v / base_models[k] - 1.0) for k, v in m.items()}}
    unchanged = [c["cost"] for c in counts["unchanged"]]
    spread = {k: 100.0 * (max(c[k] for c in counts["unchanged"]) - min(c[k] for c in counts["unchanged"]))
              / min(c[k] for c in counts["unchanged"]) for k in ("cost", *(k for k, _ in _cost.COMPONENTS))}
    doc = {
        "what": "the docs' pipeline with each planted regression: counted components, native CPU, the cost model",
        "command": "python bench/studies/what_does_the_gate_see/cost_model.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine_fingerprint().to_dict(), "load_1min_at_end": os.getloadavg()[0],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "minutes": (time.time() - started) / 60,
        "count_samples": args.count_samples, "native_samples": args.native_samples, "timings": args.timings,
        "unit_costs_s": {"page_fault": s_fault, "page_fault_rounds": faults, "stat_syscall": s_stat,
                         "stat_syscall_rounds": stats, "estimated_cycle": s_cycle},
        "measured_weights": weights, "gate_weights": dict(_cost.WEIGHTS), "gate_model": _cost.MODEL,
        "unchanged_costs": unchanged, "unchanged_spread_pct": spread, "counts": counts, "variants": table,
    }
    write_json_atomic(args.out, doc)
    print(f"unit costs: page fault {1e9 * s_fault:,.0f} ns, stat {1e9 * s_stat:,.0f} ns, estimated cycle "
          f"{1e9 * s_cycle:.4f} ns -> weights page fault {weights['page_faults']:,.0f}, syscall {weights['syscalls']:,.0f}")
    print(f"unchanged, {args.repeats} counts: cost spread {spread['cost']:.4f}%")
    for n, row in table.items():
        mc = row["model_change_pct"]
        print(f"{n:>17}: native CPU {row['native_cpu_change_pct']:+6.1f}%  instructions {mc['instructions']:+6.2f}%  "
              f"+cache {mc['with_cache']:+6.2f}%  +kernel {mc['with_cache_and_kernel']:+6.2f}%  "
              f"gate's cost {mc['gate_cost']:+6.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
