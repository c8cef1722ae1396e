"""The tuner's result drawn like the NWT paper's Fig. 2 and 3: time and memory against worker count.

Built on a bare matplotlib ``Figure`` (Agg canvas, no pyplot), so it never changes the process-wide
backend and works headless; matplotlib is the optional ``plot`` extra.
"""

from __future__ import annotations

from pathlib import Path

from .tuner import TuneResult

MiB = 1024 * 1024


def plot_tune(result: TuneResult, path: str | Path) -> Path:
    """Left: milliseconds per iteration by worker count; right: peak PSS and USS (MiB).

    The pick is circled in red and the fastest measured count marked; a fast search shows only the
    counts it measured, which is the point of it.
    """
    try:
        from matplotlib.figure import Figure  # noqa: PLC0415 - optional dependency
        from matplotlib.ticker import MaxNLocator  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install 'cupy-nwt[plot]'") from exc

    trials = result.trials
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax_t, ax_m = fig.subplots(1, 2)
    if not trials:  # N = 1: the fast search picks 0 without measuring
        for ax in (ax_t, ax_m):
            ax.text(0.5, 0.5, f"nothing measured: only {result.max_workers} count possible, pick "
                    f"{result.best_workers}", ha="center", va="center", transform=ax.transAxes)
        return _save(fig, path)
    workers = [t.workers for t in trials]
    ms = [t.seconds_per_iteration * 1e3 for t in trials]
    fastest = min(trials, key=lambda t: (t.seconds_per_iteration, t.workers))
    pick = result.best_trial

    style = "-o" if result.strategy == "paper" else "o"
    ax_t.plot(workers, ms, style, markersize=4, color="tab:blue", label="time per iteration")
    ax_t.plot([fastest.workers], [fastest.seconds_per_iteration * 1e3], "v", markersize=9, color="tab:green",
              label=f"fastest: {fastest.workers}")
    if pick is not None:
        ax_t.plot([pick.workers], [pick.seconds_per_iteration * 1e3], "o", markersize=13, markerfacecolor="none",
                  markeredgecolor="tab:red", markeredgewidth=2, label=f"pick: {pick.workers}")
    ax_t.set_xlabel("worker processes")
    ax_t.set_ylabel("ms per iteration (batch delivered" + (" + H2D copy)" if result.device == "cuda" else ")"))
    ax_t.set_ylim(bottom=0)
    ax_t.grid(True, alpha=0.3)
    ax_t.legend(fontsize="small")
    ax_t.set_title(f"Time over workers ({result.strategy}, batch {result.batch_size})")

    pss = [(t.workers, t.peak_memory_bytes / MiB) for t in trials if t.peak_memory_bytes is not None]
    uss = [(t.workers, t.peak_uss_bytes / MiB) for t in trials if t.peak_uss_bytes is not None]
    if pss:
        ax_m.plot(*zip(*pss), style, markersize=4, color="tab:purple", label="peak PSS, all processes")
    if uss:
        ax_m.plot(*zip(*uss), "--" if result.strategy == "paper" else "x", color="tab:gray",
                  label="peak USS, all processes")
    if pick is not None and pick.peak_memory_bytes is not None:
        ax_m.plot([pick.workers], [pick.peak_memory_bytes / MiB], "o", markersize=13, markerfacecolor="none",
                  markeredgecolor="tab:red", markeredgewidth=2, label=f"pick: {pick.workers}")
    if not pss and not uss:
        ax_m.text(0.5, 0.5, "memory not measured", ha="center", va="center", transform=ax_m.transAxes)
    ax_m.set_xlabel("worker processes")
    ax_m.set_ylabel("MiB")
    ax_m.set_ylim(bottom=0)
    ax_m.grid(True, alpha=0.3)
    ax_m.legend(fontsize="small")
    ax_m.set_title("Memory over workers (main process + workers)")
    for ax in (ax_t, ax_m):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))

    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=110)
    return out
