"""What does the gate's count see? Instructions, cache misses, page faults and system calls of the docs' pipeline
with each planted regression, beside its native CPU time; the cost model's weights chosen from them.

The pipeline is ``docs/ci-gate.md``'s (``SyntheticCIFAR10(n=4096)``, ``CifarTrainTransform``, batch 128), with
each plant of ``bench/studies/does_the_gate_hold/gate_noise_proof.py --mode plants`` in turn. For each variant:

* its **counts**, as the gate counted them in ``bench/studies/does_the_gate_hold/gate_noise_proof.py --mode plants`` (``--proof``, that
  proof's result files: ``count_samples`` samples under callgrind with the simulated caches, the system calls
  from valgrind's log, the page faults from the region run natively), and the spread of the unchanged runs'
  counts over that proof: the count's floor;
* its **native CPU** per sample: the same batches made in this process, the variants interleaved,
  ``--timings`` times each, the median kept (user + system CPU of the process, ``getrusage``);
* two **kernel unit costs**, natively: CPU seconds of one minor page fault (a fresh anonymous page written)
  and of one ``stat`` of a file (the Python loop's own cost taken out of both).

The weights: cache misses at the usual cycle-estimate weights (10 an L1 miss, 100 a last-level miss:
callgrind's and CodSpeed's); one estimated cycle's native seconds from the unchanged variant (its CPU less its
faults' and system calls' share, over its instructions and weighted misses); a page fault's and a system
call's weight their native seconds over that. Each model (instructions alone; with cache misses; with the
kernel too) is then set against each plant's measured change of native CPU.

    python bench/studies/what_does_the_gate_see/cost_model.py --proof bench/results/vm-2cpu/gate_noise_proof_plants/stream_*.json \
        --out bench/studies/what_does_the_gate_see/vm-2cpu/cost_model.json
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


def variants(folder: Path) -> dict[str, Any]:
    """name -> the imported pipeline module of that plant (each its own module: PLANT is a module constant)."""
    from bench import workloads as gnp  # noqa: PLC0415 - the gate's pipelines

    out = {}
    sys.path.insert(0, str(folder))
    for i, (name, plant) in enumerate(gnp.MODES["plants"].items()):
        (folder / f"pipeline_{i}.py").write_text(gnp.pipeline_source("plants", plant))
        out[name] = importlib.import_module(f"pipeline_{i}")
    return out


def native_cpu(mods: dict[str, Any], samples: int, timings: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """CPU seconds per sample of making ``samples`` samples' batches, each variant in turn, ``timings`` times;
    and each variant's minor page faults per sample meanwhile (the last timing's)."""
    from cupy_nwt.loader.workers.maker import BatchMaker  # noqa: PLC0415
    from cupy_nwt.pytest_plugin._count import plan  # noqa: PLC0415

    makers = {n: BatchMaker(m.Data(n=4096), None, m.Transform(), batched=True, batch_size=128) for n, m in mods.items()}
    batches = plan(4096, 128, samples)
    for mk in makers.values():
        mk.make(*batches[0])
    out: dict[str, list[float]] = {n: [] for n in makers}
    faults: dict[str, float] = {}
    for _ in range(timings):
        for n, mk in makers.items():
            gc.collect()
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            for idx, seed in batches:
                mk.make(idx, seed)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            out[n].append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / samples)
            faults[n] = (r1.ru_minflt - r0.ru_minflt) / samples
    return out, faults


def proof_counts(paths: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """group -> each counted run's components and cost (per sample), from gate_noise_proof result files."""
    import json  # noqa: PLC0415

    out: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        doc = json.loads(path.read_text())
        base = doc.get("baseline") or {}
        if base.get("cost_components"):
            out.setdefault("unchanged", []).append({**base["cost_components"], "cost": base["cost_per_sample"],
                                                    "seconds": base.get("count_seconds"), "from": f"{path.name} baseline"})
        for name, group in doc["groups"].items():
            for i, r in enumerate(group["runs"]):
                f = r["figures"]
                if f.get("cost_components"):
                    out.setdefault(name, []).append({**f["cost_components"], "cost": f["cost_per_sample"],
                                                     "seconds": f.get("count_seconds"), "from": f"{path.name} run {i + 1}"})
    return out


def count_cpu(mod: Any, samples: int) -> dict[str, float]:
    """CPU seconds (all children: valgrind and the native run) and wall seconds of one count: its CI time."""
    from cupy_nwt.pytest_plugin._count import count_pipeline  # noqa: PLC0415

    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    count_pipeline(mod.Data(n=4096), batch_size=128, collate_fn=None, batch_transform=mod.Transform(), samples=samples)
    r1, t1 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    return {"samples": samples, "cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, "wall_s": t1 - t0}


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
    ap.add_argument("--proof", type=Path, nargs="+", required=True, metavar="JSON",
                    help="bench/studies/does_the_gate_hold/gate_noise_proof.py --mode plants result files: the counts")
    ap.add_argument("--timings", type=int, default=7, help="native timings of each variant, interleaved")
    ap.add_argument("--native-samples", type=int, default=512)
    ap.add_argument("--count-cpu", type=int, nargs="*", default=[128, 512], metavar="SAMPLES",
                    help="count the unchanged pipeline at these sample counts for the CPU a count costs")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if min(args.timings, args.native_samples) < 1:
        ap.error("--timings and --native-samples must be >= 1")
    from cupy_nwt.picks.fingerprint import machine_fingerprint  # noqa: PLC0415
    from cupy_nwt.pytest_plugin import _cost  # noqa: PLC0415
    from cupy_nwt.reporting.tables import write_json  # noqa: PLC0415

    started = time.time()
    counts = proof_counts(args.proof)
    with tempfile.TemporaryDirectory(prefix="what_does_the_gate_see_") as tmp:
        mods = variants(Path(tmp))
        missing = [n for n in mods if not counts.get(n)]
        if missing:
            ap.error(f"the proof files hold no counted run of: {', '.join(missing)}")
        cpu, native_faults = native_cpu(mods, args.native_samples, args.timings)
        count_costs = [count_cpu(mods["unchanged"], n) for n in args.count_cpu]
    faults = [fault_seconds() for _ in range(7)]
    stats = [stat_seconds() for _ in range(7)]
    s_fault, s_stat = statistics.median(faults), statistics.median(stats)
    base = counts["unchanged"][0]
    base_cpu = statistics.median(cpu["unchanged"])
    est = base["instructions"] + _cost.W_L1 * base["l1_misses"] + _cost.W_LL * base["ll_misses"]
    # the native loop's own faults (a warm process faults less than the counted region, made first in a fresh one)
    s_cycle = (base_cpu - s_fault * native_faults["unchanged"] - s_stat * base["syscalls"]) / est
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
                    "native_page_faults_a_sample": native_faults[n],
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
        "proof": [str(p) for p in args.proof], "native_samples": args.native_samples, "timings": args.timings,
        "unit_costs_s": {"page_fault": s_fault, "page_fault_rounds": faults, "stat_syscall": s_stat,
                         "stat_syscall_rounds": stats, "estimated_cycle": s_cycle},
        "measured_weights": weights, "gate_weights": dict(_cost.WEIGHTS), "gate_model": _cost.MODEL,
        "count_costs": count_costs,
        "unchanged_costs": unchanged, "unchanged_spread_pct": spread, "variants": table,
        "counts": {n: c[:3] for n, c in counts.items()}, "counted_runs": {n: len(c) for n, c in counts.items()},
    }
    write_json(doc, args.out)
    print(f"unit costs: page fault {1e9 * s_fault:,.0f} ns, stat {1e9 * s_stat:,.0f} ns, estimated cycle "
          f"{1e9 * s_cycle:.4f} ns -> weights page fault {weights['page_faults']:,.0f}, syscall {weights['syscalls']:,.0f}")
    print(f"unchanged, {len(unchanged)} counts: cost spread {spread['cost']:.4f}%")
    for c in count_costs:
        print(f"a count of {c['samples']} samples: {c['cpu_s']:.1f} s of CPU, {c['wall_s']:.0f} s of wall clock")
    for n, row in table.items():
        mc = row["model_change_pct"]
        print(f"{n:>17}: native CPU {row['native_cpu_change_pct']:+6.1f}%  instructions {mc['instructions']:+6.2f}%  "
              f"+cache {mc['with_cache']:+6.2f}%  +kernel {mc['with_cache_and_kernel']:+6.2f}%  "
              f"gate's cost {mc['gate_cost']:+6.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
