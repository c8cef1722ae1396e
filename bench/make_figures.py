"""The manual's pictures and its headline figures, made from the committed result files by one command.

    python bench/make_figures.py           # docs/figures/*.png, docs/figures/sources.json, the generated blocks
    python bench/make_figures.py --check   # exit 1 naming what is stale; CI runs it

Every GPU run's folder under ``bench/results/`` (one with a ``<step>/step.json``) is read; the pictures
show the newest run that holds each file. The headline table is written between the markers
``<!-- generated: headline -->`` and ``<!-- end: headline -->`` of README.md, docs/results.md and
bench/results/README.md, so a figure is typed nowhere by hand. A PNG's bytes depend on the matplotlib
and FreeType that drew it, so ``--check`` compares what pictures are drawn from instead: the SHA-256 of
their result files and of the code that draws them (``sources.json``), and the generated text exactly.
Needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cupy_nwt.cli import plots  # noqa: E402 - the source tree's, not an installed copy

RESULTS = ROOT / "bench" / "results"
FIGURES = ROOT / "docs" / "figures"
SOURCES = FIGURES / "sources.json"
PAGES = {ROOT / "README.md": None, ROOT / "docs" / "results.md": "figures/",
         RESULTS / "README.md": "../../docs/figures/"}  # page: where its pictures are (the README shows none)
BEGIN, END = "<!-- generated: headline -->", "<!-- end: headline -->"
MiB = 1024 * 1024


@dataclass(frozen=True)
class Run:
    """One GPU run's folder: ``bench/results/<name>/<step>/``."""

    name: str
    path: Path

    def file(self, rel: str) -> Path | None:
        p = self.path / rel
        return p if p.is_file() else None

    def json(self, rel: str) -> Any:
        p = self.file(rel)
        return read_json(p) if p is not None else None

    def junit_suite(self) -> ET.Element | None:
        """The GPU tests' ``<testsuite>``, or None without a ``gpu-tests/junit.xml``."""
        junit = self.file("gpu-tests/junit.xml")
        if junit is None:
            return None
        try:
            suite = ET.parse(junit).getroot().find("testsuite")
        except ET.ParseError as exc:
            raise SystemExit(f"make_figures: {shown(junit)}: not valid JUnit XML ({exc})") from None
        if suite is None:
            raise SystemExit(f"make_figures: {shown(junit)}: no <testsuite> in it")
        return suite

    def glob(self, pattern: str) -> Path | None:
        found = sorted(self.path.glob(pattern))
        return found[0] if found else None

    def when(self) -> str:
        """When it ran, from the files it wrote: the tuner's ``created``, else the GPU tests' timestamp."""
        report = self.json("nwt/report.json")
        if report is not None:
            return str(guarded(self, "when it ran", lambda r: report["tune_paper"]["created"]))
        suite = self.junit_suite()
        return suite.get("timestamp", "") if suite is not None else ""


def read_json(path: Path) -> Any:
    """A result file's JSON; one line naming the file when it is cut short or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise SystemExit(f"make_figures: {shown(path)}: not a readable JSON result ({exc})") from None


def guarded(run: Run, what: str, make: Callable[[Run], Any]) -> Any:
    """``make(run)``, or one line naming the run and ``what`` when its files lack a field it reads."""
    try:
        return make(run)
    except (KeyError, TypeError, IndexError, ValueError, ZeroDivisionError, StopIteration) as exc:
        raise SystemExit(f"make_figures: {shown(run.path)}: {what}: its result files lack or garble a field "
                         f"({type(exc).__name__}: {exc})") from None


def gpu_runs() -> list[Run]:
    """Every GPU run's folder, oldest first."""
    runs = [Run(p.name, p) for p in sorted(RESULTS.iterdir()) if p.is_dir() and any(p.glob("*/step.json"))]
    return sorted(runs, key=lambda r: (r.when(), r.name))


def newest(runs: list[Run], rel: str) -> Run:
    for run in reversed(runs):
        if (run.glob(rel) if "*" in rel else run.file(rel)) is not None:
            return run
    raise SystemExit(f"make_figures: no GPU run under bench/results/ has {rel}")


# ------------------------------------------------------------------ the pictures


def bandwidth_picture(run: Run) -> Any:
    """The transfer sweep, drawn by the same code as ``cupy-nwt bandwidth --plot``."""
    d = run.json("transfers/bandwidth.json")
    points = [SimpleNamespace(direction=p["direction"], memory=p["memory"], nbytes=p["nbytes"],
                              gbps=SimpleNamespace(**{k: p["gbps"][k] for k in ("median", "p25", "p75")}))
              for p in d["points"]]
    link = d.get("link_after_warmup") or d["device"].get("link") or {}
    label = (f"Gen{link['max_gen']} x{link['max_width']}: {d['link_gbps']:.1f} GB/s per direction"
             if d.get("link_gbps") and link.get("max_gen") else "link")
    device = SimpleNamespace(name=d["device"]["name"], index=d["device"]["index"])
    result = SimpleNamespace(points=points, link_gbps=d.get("link_gbps"), link_label=label, device=device)
    return plots.bandwidth_figure(result)  # type: ignore[arg-type]


def overlap_picture(run: Run) -> Any:
    """Top: the ideal pipelined schedule over the streams from the stages timed alone; bottom: each version's
    measured time against that ideal and the one rebuilt from the measured duplex copies and hand-off."""
    d = run.json("transfers/overlap.json")
    streams = d["config"]["streams"]
    stage = {k: d["stages"][k]["median"] * 1e3 for k in ("h2d", "kernel", "d2h")}
    fig = plots.figure_class()(figsize=(11, 6.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[3, 2])
    colors = {"h2d": "tab:blue", "kernel": "tab:green", "d2h": "tab:orange"}
    engine_free = {"h2d": 0.0, "kernel": 0.0, "d2h": 0.0}
    for s in range(streams):
        t = 0.0
        for name in ("h2d", "kernel", "d2h"):
            t = max(t, engine_free[name])
            top.barh(s, stage[name], left=t, color=colors[name], edgecolor="white",
                     label=name.upper() if s == 0 else None)
            t += stage[name]
            engine_free[name] = t
    top.set_yticks(range(streams), [f"stream {s}" for s in range(streams)])
    top.invert_yaxis()
    top.set_xlabel("ms")
    top.set_title(f"{run.name}: the ideal schedule of {streams} chunks, each stage timed alone (medians)")
    plots.legend_outside(top)
    versions = [(v["name"], v["seconds"]["median"] * 1e3) for v in d["versions"]]
    names = [n for n, _ in versions]
    bottom.barh(range(len(versions)), [ms for _, ms in versions], color="tab:gray")
    for i, (_, ms) in enumerate(versions):
        bottom.text(ms, i, f" {ms:.3f} ms", va="center")
    bottom.axvline(d["ideal_seconds"] * 1e3, color="black", linestyle=":", label="ideal from stages alone")
    rebuilt = d.get("ideal_from_measured_stages")
    if rebuilt:
        bottom.axvline(rebuilt["seconds"] * 1e3, color="tab:red", linestyle="--",
                       label="ideal with measured duplex and hand-off")
    bottom.set_yticks(range(len(versions)), names)
    bottom.invert_yaxis()
    bottom.set_xlim(0, max(ms for _, ms in versions) * 1.25)
    bottom.set_xlabel("ms, median of the measured runs")
    bottom.set_title("Measured: sequential against async v1 and v2")
    plots.legend_outside(bottom)
    return fig


def tuner_picture(run: Run) -> Any:
    """Samples/s over worker counts: the paper search's trials and every count again, warm; both picks."""
    d = run.json("nwt/report.json")
    paper, fast, comp = d["tune_paper"], d["tune_fast"], d["comparison"]
    steady = sorted((int(w), rate) for w, rate in comp["samples_per_s"].items())
    trials = sorted((t["workers"], t["samples_per_second"]) for t in paper["trials"])
    fig = plots.figure_class()(figsize=(11, 5), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(*zip(*steady), "-o", markersize=4, color="tab:blue", label="every count again, warm, interleaved")
    ax.plot(*zip(*trials), "--s", markersize=4, color="tab:gray", label="Algorithm 1's trials (start-up included)")
    rate = dict(steady)
    for who, workers, color in (("fast search", fast["best_workers"], "tab:red"),
                                ("Algorithm 1", paper["best_workers"], "tab:purple")):
        ax.plot([workers], [rate[workers]], "o", markersize=14, markerfacecolor="none", markeredgewidth=2,
                markeredgecolor=color, linestyle="none", label=f"{who} picks {workers}")
    ax.set_xlabel("worker processes")
    ax.set_ylabel("samples/s")
    ax.set_ylim(0, plots._top([r for _, r in steady + trials]))
    ax.set_title(f"{run.name}: the tuner on synthetic CIFAR-10, batch {paper['batch_size']}, device {paper['device']}")
    ax.grid(True, alpha=0.3)
    plots.legend_outside(ax)
    return fig


def gpu_wait_picture(run: Run) -> Any:
    """GPU idle per 5-ms step for each loader, workload and worker count, synced and queued steps."""
    path = run.glob("gpu-feed/gpu_feed-*.json")
    assert path is not None
    d = read_json(path)
    rows = d["results"]
    cells = sorted({(r["workload"], r["num_workers"]) for r in rows})
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    loops = [loop for loop in ("synced", "queued") if all("loops" in r and loop in r["loops"] for r in rows)] or [None]
    fig = plots.figure_class()(figsize=(11, 4.5 * len(loops)), layout="constrained")
    axes = fig.subplots(len(loops), 1, squeeze=False)[:, 0]
    width = 0.8 / len(modes)
    for ax, loop in zip(axes, loops):
        for m, mode in enumerate(modes):
            idle = []
            for workload, workers in cells:
                r = next(r for r in rows if r["mode"] == mode and (r["workload"], r["num_workers"]) == (workload, workers))
                idle.append(100 * (r["loops"][loop] if loop else r)["idle_fraction"])
            ax.bar([i + (m - (len(modes) - 1) / 2) * width for i in range(len(cells))], idle, width, label=mode)
        ax.axhline(5, color="black", linestyle=":", label="target: 5%")
        ax.set_xticks(range(len(cells)), [f"{w}, {n} workers" for w, n in cells])
        ax.set_ylabel("GPU idle, % of the loop")
        step_ms = d["config"]["step_ms"]
        ax.set_title(f"{run.name}: GPU waiting for batches, {step_ms:g}-ms step" + (f", {loop} step" if loop else ""))
        ax.grid(True, axis="y", alpha=0.3)
        plots.legend_outside(ax)
    return fig


PICTURES: dict[str, tuple[str, Callable[[Run], Any]]] = {
    "bandwidth.png": ("transfers/bandwidth.json", bandwidth_picture),
    "overlap.png": ("transfers/overlap.json", overlap_picture),
    "tuner.png": ("nwt/report.json", tuner_picture),
    "gpu_wait.png": ("gpu-feed/gpu_feed-*.json", gpu_wait_picture),
}


def sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.relative_to(ROOT).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def sources(runs: list[Run]) -> dict[str, Any]:
    """What each picture is drawn from: its result file and the code, with their SHA-256."""
    code = [Path(__file__).resolve(), Path(plots.__file__).resolve()]
    out = {}
    for name, (rel, _) in PICTURES.items():
        run = newest(runs, rel)
        data = run.glob(rel) if "*" in rel else run.file(rel)
        assert data is not None
        out[name] = {"from": data.relative_to(ROOT).as_posix(), "sha256": sha256([data, *code])}
    return out


# ------------------------------------------------------------------ the headline table


def _range(values: list[float], fmt: str) -> str:
    if not values:
        return "—"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def pinned_at_64(run: Run, direction: str) -> str:
    d = run.json("transfers/bandwidth.json")
    if d is None:
        return "—"
    gbps = [p["gbps"]["median"] for p in d["points"]
            if p["direction"] == direction and p["memory"] == "pinned" and p["nbytes"] >= 64 * MiB]
    link = d.get("link_gbps")
    share = f" ({_range([100 * g / link for g in gbps], '{:.1f}')}% of {link:.1f})" if link else ""
    return _range(gbps, "{:.2f}") + " GB/s" + share


def native_share(run: Run) -> str:
    d = run.json("transfers/native_vs_cupy_nwt.json")
    if d is None:
        return "—"
    shares = [100 * r["share"] for r in d["rows"] if re.fullmatch(r"(h2d|d2h) pinned (\d+) B", r["figure"])
              and int(r["figure"].split()[2]) >= 64 * MiB]
    return _range(shares, "{:.1f}") + "%"


def overlap_excess(run: Run) -> str:
    d = run.json("transfers/overlap.json")
    if d is None:
        return "—"
    v = {x["name"]: x for x in d["versions"]}
    text = " / ".join(f"{v[n]['vs_ideal']:.2f}x" for n in ("async_v1", "async_v2") if n in v)
    rebuilt = d.get("ideal_from_measured_stages")
    if rebuilt:
        vs = " / ".join(f"{v[n]['seconds']['median'] / rebuilt['seconds']:.2f}x" for n in ("async_v1", "async_v2") if n in v)
        text += f"; {vs} the ideal rebuilt from measured duplex copies and hand-off"
    return text


def gpu_idle(run: Run, mode: str, loop: str) -> str:
    path = run.glob("gpu-feed/gpu_feed-*.json")
    if path is None:
        return "—"
    rows = read_json(path)["results"]
    idle = [100 * (r["loops"][loop] if "loops" in r else (r if loop == "synced" else None) or {}).get("idle_fraction", float("nan"))
            for r in rows if r["mode"] == mode and ("loops" in r and loop in r["loops"] or ("loops" not in r and loop == "synced"))]
    return _range(idle, "{:.1f}") + "%" if idle else "—"


def tuner_picks(run: Run) -> str:
    d = run.json("nwt/report.json")
    if d is None:
        return "—"
    c = d["comparison"]
    return (f"fast {d['tune_fast']['best_workers']} ({100 * c['fast_pick_vs_steady_best']:.1f}% of the steady best), "
            f"Algorithm 1 {d['tune_paper']['best_workers']} ({100 * c['paper_pick_vs_steady_best']:.1f}%); "
            f"cost {100 * d['fast_cost_vs_paper']:.0f}%")


def gpu_tests(run: Run) -> str:
    suite = run.junit_suite()
    if suite is None:
        return "—"
    n, bad = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return f"{n - bad} of {n} passed"


ROWS: list[tuple[str, str, Callable[[Run], str]]] = [
    ("pinned H2D at >= 64 MiB", ">= 85% of the PCIe link", lambda r: pinned_at_64(r, "h2d")),
    ("pinned D2H at >= 64 MiB", ">= 85% of the PCIe link", lambda r: pinned_at_64(r, "d2h")),
    ("those copies against the native CUDA C build", ">= 97%", native_share),
    ("async v1 / v2 against the ideal pipelined time", "within 1.10x", overlap_excess),
    ("GPU idle per step, prefetcher on, synced step", "< 5%", lambda r: gpu_idle(r, "cupy_nwt", "synced")),
    ("the same, queued step", "< 5%", lambda r: gpu_idle(r, "cupy_nwt", "queued")),
    ("torch's pinned loader, synced step", "(beside it)", lambda r: gpu_idle(r, "torch", "synced")),
    ("NWT picks on 0..15 workers", "fast pick >= 95% of the best at <= 30% of the cost", tuner_picks),
    ("GPU tests", "all pass", gpu_tests),
]


def headline(runs: list[Run], figures: str | None) -> str:
    """The generated block: one column per GPU run, oldest first, and the pictures where ``figures`` says."""
    head = "| figure | target | " + " | ".join(f"`{r.name}`" for r in runs) + " |"
    lines = [BEGIN, "", f"GPU runs so far: {len(runs)}, each a folder under `bench/results/` (oldest first). "
             "Written by `python bench/make_figures.py` from those files; do not edit by hand.", "",
             head, "| " + " | ".join(["---"] * (len(runs) + 2)) + " |"]
    for what, target, cell in ROWS:
        lines.append(f"| {what} | {target} | " + " | ".join(guarded(r, what, cell) for r in runs) + " |")
    if figures is not None:
        lines += ["", f"![The transfer sweep]({figures}bandwidth.png) ![The overlap timeline]({figures}overlap.png)",
                  f"![The tuner's curve and picks]({figures}tuner.png) ![GPU wait per step]({figures}gpu_wait.png)"]
    lines += ["", END]
    return "\n".join(lines)


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def with_block(text: str, block: str, page: Path) -> str:
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"make_figures: {shown(page)} has no {BEGIN} ... {END} block")
    return pattern.sub(lambda _m: block, text, count=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming what is stale")
    args = ap.parse_args(argv)
    runs = gpu_runs()
    want_sources = json.dumps(sources(runs), indent=2, sort_keys=True) + "\n"
    pages = {page: with_block(page.read_text(encoding="utf-8"), headline(runs, rel), page) for page, rel in PAGES.items()}
    if args.check:
        stale = [shown(p) for p, text in pages.items() if p.read_text(encoding="utf-8") != text]
        have = SOURCES.read_text(encoding="utf-8") if SOURCES.is_file() else ""
        if have != want_sources or not all((FIGURES / n).is_file() for n in PICTURES):
            stale.append("docs/figures/")
        if stale:
            print(f"make_figures: stale, run python bench/make_figures.py: {', '.join(stale)}", file=sys.stderr)
            return 1
        print("make_figures: the pictures and the generated blocks match the result files")
        return 0
    FIGURES.mkdir(parents=True, exist_ok=True)
    for name, (rel, draw) in PICTURES.items():
        plots.save_figure(guarded(newest(runs, rel), name, draw), FIGURES / name, dpi=90)
        print(f"docs/figures/{name}")
    SOURCES.write_text(want_sources, encoding="utf-8")
    for page, text in pages.items():
        page.write_text(text, encoding="utf-8")
        print(shown(page))
    return 0


if __name__ == "__main__":
    sys.exit(main())
