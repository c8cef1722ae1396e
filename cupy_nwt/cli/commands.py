"""The ``cupy-nwt`` sub-commands (each parses its options, runs, prints and writes its result) and the parser
that names them with their options."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .. import __version__, cuda, system
from .._checks import check_number
from .._files import check_writable, same_file
from ..errors import ArgumentError, SavedPickError
from ..loader.workers.kinds import WORKER_TYPES
from ..nwt.fast import MIN_FAST_ITERATIONS, OPEN_CAP_MAX, open_cap
from ..reporting import tables as report
from ..reporting.progress import ProgressBar
from ..reporting.units import fmt_bytes, parse_size, size_sweep
from ._parser import Parser
from .exits import DEBUG_ENV, EXIT_CODES


def cmd_info(args: argparse.Namespace) -> int:
    host = system.host_info()
    status = cuda.gpu_status()
    devices = cuda.all_device_info()
    if args.json:
        print(report.to_json({"host": host, "gpu": status, "devices": devices}))
        return 0
    print(report.key_values([
        ("CPU", host.cpu_model),
        ("cores", f"{host.logical_cpus} logical, {host.physical_cpus} physical, {host.usable_cpus} usable"),
        ("memory", f"{fmt_bytes(host.memory_total_bytes)} total, {fmt_bytes(host.memory_available_bytes)} available"),
        ("python", f"{host.python} on {host.platform}"),
        ("CuPy", status.cupy_version or "not installed"),
    ], title="host"))
    print()
    if not status.available:
        print(f"GPU: none usable: {(status.reason or '').removeprefix('no usable GPU: ')}")
        return 0
    for d in devices:
        link = d.link
        link_text = "unknown (no NVML, no sysfs entry)"
        if link is not None:
            link_text = (f"Gen{link.current_gen} x{link.current_width} now ({_gb(link.current_gbps)}), "
                         f"Gen{link.max_gen} x{link.max_width} max ({_gb(link.max_gbps)}) per direction [{link.source}]")
        print(report.key_values([
            ("name", d.name),
            ("compute capability", d.compute_capability),
            ("memory", fmt_bytes(d.total_memory_bytes)),
            ("copy engines", d.copy_engines),
            ("SMs", d.multiprocessors),
            ("PCI bus", d.pci_bus_id),
            ("PCIe link", link_text),
        ], title=f"GPU {d.index}"))
    return 0


def _gb(x: float | None) -> str:
    return "?" if x is None else f"{x:.1f} GB/s"


def _int_option(text: str, name: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ArgumentError(f"{name} must be a whole number, got {text!r}") from None
    if value < minimum:
        raise ArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


def _number_option(text: str, name: str, **bounds: Any) -> float:
    """A real-number option, checked as the function it feeds checks it, but named as typed (``--alpha``)."""
    try:
        value = float(text)
    except ValueError:
        raise ArgumentError(f"{name} must be a number, got {text!r}") from None
    return check_number(name, value, **bounds)


def _size_option(text: str, name: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ArgumentError(f"{name}: {exc}") from None


def _check_outputs(args: argparse.Namespace) -> None:
    """The command's ``--output`` and ``--plot`` (where it has one), checked before its long run."""
    plot = getattr(args, "plot", None)
    if plot:
        from . import plots  # noqa: PLC0415 - only this command needs it

        if not plots.matplotlib_available():
            raise ArgumentError("--plot needs matplotlib: pip install 'cupy-nwt[plot]'")
        if Path(plot).suffix.lower() != ".png":  # the figure is PNG whatever the name says
            raise ArgumentError(f"--plot {plot}: the plot is a PNG image, so its name must end in .png")
    if args.output:
        check_writable(args.output, "--output")
    if plot:
        check_writable(plot, "--plot")
    _refuse_one_file_twice([("--output", args.output), ("--plot", plot)], getattr(args, "dataset", None))


def _refuse_one_file_twice(outputs: list[tuple[str, str | None]], dataset: str | None) -> None:
    """Two results written to one file keep only the last, and a result written over the dataset destroys it."""
    given = [(name, path) for name, path in outputs if path]
    for i, (name, path) in enumerate(given):
        for other, other_path in given[i + 1:]:
            if same_file(path, other_path):
                raise ArgumentError(f"{name} and {other} name one file, {path}: give each its own")
        if dataset and same_file(path, dataset):
            raise ArgumentError(f"{name} {path} is the --dataset itself: writing the result there would destroy it")


def _run_with_progress(args: argparse.Namespace, total: int, desc: str, run):
    with ProgressBar(total, desc, enabled=not args.no_progress) as bar:
        return run(bar.step)


def _run_on_gpu(args: argparse.Namespace, config, run):
    """``run(config, step)`` under a progress bar, which a machine without a GPU never gets to see."""
    cuda.require_gpu()
    return _run_with_progress(args, config.steps, args.command, lambda step: run(config, step))


def _emit(args: argparse.Namespace, result, text: str) -> None:
    if args.output:
        report.write_json(result, args.output)
    print(report.to_json(result) if args.json else text)


def _finish(args: argparse.Namespace, result, text: str, failed_check: str | None) -> int:
    """Print (and write) the result; exit 1 with one line when the run's own check failed."""
    _emit(args, result, text)
    if failed_check:
        print(f"cupy-nwt {args.command}: {failed_check}", file=sys.stderr)
        return 1
    return 0


def _run_options(args: argparse.Namespace) -> dict[str, int]:
    """The parsed ``_experiment_options`` every GPU experiment's config takes."""
    return {"repeats": _int_option(args.repeats, "--repeats", 1), "warmup": _int_option(args.warmup, "--warmup", 0),
            "device": _int_option(args.device, "--device", 0)}


def cmd_bandwidth(args: argparse.Namespace) -> int:
    from ..experiments import transfers  # noqa: PLC0415 - only this command needs it
    from . import plots  # noqa: PLC0415 - only this command needs it

    lo, hi = _size_option(args.min, "--min"), _size_option(args.max, "--max")
    if lo > hi:
        raise ArgumentError(f"--min ({fmt_bytes(lo)}) is larger than --max ({fmt_bytes(hi)})")
    sizes = size_sweep(lo, hi, _int_option(args.factor, "--factor", 2))
    config = transfers.BandwidthConfig(
        sizes=tuple(sizes), **_run_options(args),
        batch_total=_size_option(args.batch_total, "--batch-total"),
        batch_chunk=_size_option(args.batch_chunk, "--batch-chunk"))
    _check_outputs(args)
    result = _run_on_gpu(args, config, transfers.run_bandwidth)
    if args.plot:
        plots.plot_bandwidth(result, args.plot)
    return _finish(args, result, transfers.bandwidth_summary(result),
                   None if result.verified else "copied bytes differ from the source (see 'verified')")


def cmd_overlap(args: argparse.Namespace) -> int:
    from ..experiments import overlap  # noqa: PLC0415 - only this command needs it

    config = overlap.OverlapConfig(
        streams=_int_option(args.streams, "--streams", 1),
        elements=None if args.elements is None else _int_option(args.elements, "--elements", 1),
        **_run_options(args))
    _check_outputs(args)
    result = _run_on_gpu(args, config, overlap.run_overlap)
    return _finish(args, result, overlap.overlap_summary(result), result.problem)


def cmd_tune(args: argparse.Namespace) -> int:
    from ..nwt import tune as nwt_tune  # noqa: PLC0415
    from ._pipeline import build_synthetic_apart, open_pipeline, pipeline  # noqa: PLC0415 - only this command needs them
    from .explain import explain_paper_pick, paper_decisions, tune_summary, verdict  # noqa: PLC0415

    # every option before any work: building the synthetic dataset takes a while and leaves a cache
    _check_outputs(args)
    if not args.no_save:
        _check_store(bool(args.dataset))
    synthetic_n = _int_option(args.synthetic_n, "--synthetic-n", 1)
    step = _step_option(args.step)
    alpha = _number_option(args.alpha, "--alpha", ge=0, unit="seconds per 100 iterations")
    tolerance = _number_option(args.tolerance, "--tolerance", ge=0, lt=0.5)
    options = {**_workload(args), "alpha": alpha, "tolerance": tolerance, "strategy": args.strategy,
               "device": args.device, "prefetch_factor": _int_option(args.prefetch_factor, "--prefetch-factor", 1),
               "main_process": args.main_process, "step": step}
    nwt_tune.check_tune_arguments(**options)
    transforms = pipeline(args, synthetic_default=not args.dataset)
    if not args.dataset:  # its first build in another process: the trials' memory is the tuner's alone
        build_synthetic_apart(synthetic_n, not args.no_progress)
    dataset, transform = open_pipeline(args, synthetic_n, not args.no_progress, transforms)
    result = nwt_tune.tune_num_workers(dataset, **options, pin_memory=args.pin_memory, batch_transform=transform,
                                       progress=not args.no_progress, warn=False)
    unsaved = None
    try:
        outcome = None if args.no_save else result.save_pick()
    except (SavedPickError, ArgumentError) as exc:  # a lock held past its wait, a folder that stopped taking files:
        outcome, unsaved = None, exc  # the search's result is still shown and written
    if args.plot:
        from .plots import plot_tune  # noqa: PLC0415

        plot_tune(result, args.plot)
    doc = {**result.to_dict(), "verdict": verdict(result, outcome)}
    if result.strategy == "paper":  # the walk the text prints: why Algorithm 1 stopped where it did
        doc["paper_decisions"] = [d.to_dict() for d in paper_decisions(result)]
    if args.output:
        report.write_json(doc, args.output)
    if args.json:
        print(report.to_json(doc))
        if result.warning:  # the text summary carries it; beside JSON it goes to stderr
            print(f"cupy-nwt tune: warning: {result.warning}", file=sys.stderr)
    else:
        print("\n\n".join(filter(None, [tune_summary(result, outcome=outcome), explain_paper_pick(result)])))
    if unsaved is not None:
        raise unsaved
    return 0


def _check_store(own_dataset: bool) -> None:
    """The picks' folder, checked before the search: a pick that cannot be saved ends the run after it.
    ``--no-save`` is offered only with ``own_dataset``: the synthetic CIFAR-10 is kept in that folder too."""
    from ..picks.store_file import ResultStore  # noqa: PLC0415 - only this command needs it

    try:
        ResultStore().check_writable()
    except ArgumentError as exc:
        raise ArgumentError(f"{exc}, or pass --no-save" if own_dataset else str(exc)) from None


def _step_option(text: str | None) -> Any:
    """``--step``: seconds per training step, or MODULE:ATTR naming a callable that takes a batch."""
    if text is None:
        return None
    if ":" in text:
        from ._pipeline import load_callable, named_step  # noqa: PLC0415

        return named_step(load_callable(text, "--step"), f"--step {text}")
    try:
        seconds = float(text)
    except ValueError:
        raise ArgumentError(f"--step must be seconds per step (e.g. 0.005) or MODULE:ATTR, got {text!r}") from None
    from ..picks.pick import MAX_STEP_S  # noqa: PLC0415

    return check_number("--step", seconds, gt=0, le=MAX_STEP_S, unit="seconds")


def cmd_reproduce(args: argparse.Namespace) -> int:
    from . import reproduce  # noqa: PLC0415

    config = reproduce.ReproduceConfig(
        out_dir=Path(args.out), synthetic_n=_int_option(args.synthetic_n, "--synthetic-n", 1), **_workload(args),
        compare_iterations=_int_option(args.compare_iterations, "--compare-iterations", 1),
        compare_repeats=_int_option(args.compare_repeats, "--compare-repeats", 1),
        judge_repeats=_int_option(args.judge_repeats, "--judge-repeats", 1),
        gpu_experiments=not args.no_gpu, progress=not args.no_progress)
    reproduce.check_out_dir(args.out, "--out")  # in the option's name; run_reproduce checks it again
    rep = reproduce.run_reproduce(config)
    print(report.to_json(rep) if args.json else reproduce.reproduce_summary(rep))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from ..loader._options import check_worker_room  # noqa: PLC0415 - only this command needs them
    from . import stats  # noqa: PLC0415
    from ._pipeline import open_pipeline, pipeline  # noqa: PLC0415

    config = stats.WatchConfig(batch_size=_int_option(args.batch_size, "--batch-size", 1),
                               num_workers=_int_option(args.num_workers, "--num-workers", 0),
                               worker_type=args.worker_type, device=args.device,
                               batches=_int_option(args.batches, "--batches", 1), every=_int_option(args.every, "--every", 1))
    _check_outputs(args)
    synthetic_n = _int_option(args.synthetic_n, "--synthetic-n", 1)
    if args.device == "cuda":  # before the dataset is built and the table begins, as the loader would refuse it
        cuda.require_gpu()
    check_worker_room(config.num_workers, worker_type=config.worker_type, device=args.device)
    transforms = pipeline(args, synthetic_default=not args.dataset)
    dataset, transform = open_pipeline(args, synthetic_n, not args.no_progress, transforms)
    on_row = None if args.json else stats.live_table()  # rows as they come; --json prints it all at the end
    result = _run_with_progress(args, config.batches, "stats", lambda step: stats.run_watch(
        dataset, args.dataset or "synthetic CIFAR-10", config, batch_transform=transform, step=step, on_row=on_row))
    if args.plot:
        stats.plot_watch(result, args.plot)
    _emit(args, result, stats.footer(result))
    if result.interrupted:
        raise KeyboardInterrupt(f"after {result.rows[-1].batches} of {config.batches} batches (what it saw so far "
                                "is above" + (f" and in {args.output}" if args.output else "") + ")")
    return 0


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed ``_workload_options`` but ``--synthetic-n`` (``tune`` reads it only without ``--dataset``)."""
    return {"batch_size": _int_option(args.batch_size, "--batch-size", 1),
            "max_workers": None if args.max_workers is None else _int_option(args.max_workers, "--max-workers", 1),
            "iterations": _int_option(args.iterations, "--iterations", 1)}


DESCRIPTION = "cupy-nwt (or python -m cupy_nwt): one sub-command per experiment."
#: each command's one-line help, in ``--help`` and in the short help of a bare ``cupy-nwt``
COMMANDS = {
    "info": "host facts, and the GPU with its PCIe link (or why there is none)",
    "bandwidth": "H2D/D2H GB/s, pageable vs pinned, over a size sweep; one vs many copies",
    "overlap": "copy/compute overlap over N streams: sequential, async v1, async v2",
    "tune": "Num Worker Tuner: measure the loader over worker counts and pick one",
    "stats": "run the loader on a dataset and print where its time goes, stage by stage",
    "reproduce": "everything: info, transfer experiments (GPU), the tuner both ways, picks judged against "
                 "every count; files into one folder",
}


def _experiment_options(s: argparse.ArgumentParser) -> None:
    """The GPU experiments' shared options; ``_run_options`` parses the first three."""
    s.add_argument("--repeats", default="20", help="timed repeats; the median is reported (default 20)")
    s.add_argument("--warmup", default="3", help="untimed runs first (default 3)")
    s.add_argument("--device", default="0", help="GPU index (default 0)")
    _output_options(s, "tables")


def _output_options(s: argparse.ArgumentParser, printed: str) -> None:
    """What a measuring command prints, where it also writes its JSON, and its progress bar."""
    s.add_argument("--json", action="store_true", help=f"print JSON instead of {printed}")
    s.add_argument("--output", metavar="FILE.json", help="also write the JSON result to this file")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _pipeline_options(s: argparse.ArgumentParser) -> None:
    """The user's pipeline for ``tune`` and ``stats`` (``_pipeline.py``): no transform unless named."""
    s.add_argument("--transform", metavar="MODULE:ATTR", help="per-sample transform of --dataset, as the "
                   "dataset's transform= (a class is instantiated); none by default")
    s.add_argument("--batch-transform", metavar="MODULE:ATTR", help="the loader's batch_transform (a class is "
                   "instantiated; 'cifar' = the CIFAR training augmentation); none by default with --dataset")
    s.add_argument("--no-transform", action="store_true", help="without --dataset: no CIFAR augmentation on the "
                   "synthetic CIFAR-10 (its default); with --dataset there is none unless asked")


def _workload_options(s: argparse.ArgumentParser, default_range: str) -> None:
    """The tuner's workload and search size, shared by ``tune`` and ``reproduce``; ``default_range`` says
    which counts the command searches without ``--max-workers``."""
    s.add_argument("--synthetic-n", default="50000", help="images in the synthetic CIFAR-10 (default 50000)")
    s.add_argument("--batch-size", default="128", help="samples per batch (default 128)")
    s.add_argument("--max-workers", default=None, help=f"the paper's N: counts 0..N-1 (default: {default_range})")
    s.add_argument("--iterations", default="100", help="batches timed per trial of the paper's search; the fast "
                   "search times a fifth to a tenth of them per trial and spends at most a quarter of the paper "
                   "search's cost at this count (default 100; the fast search needs >= "
                   f"{MIN_FAST_ITERATIONS})")


def build_parser() -> Parser:
    """The parser of every command; its errors are one line and exit 2 (``_parser.Parser``)."""
    p = Parser(prog="cupy-nwt", description=DESCRIPTION, epilog=EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"cupy-nwt {__version__}")
    p.add_argument("--debug", action="store_true", help=f"print the traceback of an error (or {DEBUG_ENV}=1)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")  # none: main() prints the short help

    s = sub.add_parser("info", help=COMMANDS["info"])
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("bandwidth", help=COMMANDS["bandwidth"])
    s.add_argument("--min", default="4KiB", help="smallest copy (default 4KiB)")
    s.add_argument("--max", default="256MiB", help="largest copy (default 256MiB)")
    s.add_argument("--factor", default="2", help="size step factor (default 2)")
    s.add_argument("--batch-total", default="64MiB", help="bytes of the one-vs-many test (default 64MiB)")
    s.add_argument("--batch-chunk", default="64KiB", help="small-copy size of that test (default 64KiB)")
    s.add_argument("--plot", metavar="FILE.png", help="also draw GB/s against size into this PNG")
    _experiment_options(s)
    s.set_defaults(func=cmd_bandwidth)

    s = sub.add_parser("overlap", help=COMMANDS["overlap"])
    s.add_argument("--streams", default="4", help="streams, one chunk each (default 4)")
    s.add_argument("--elements", default=None, help="float32 elements in all (default 4*1024*256 per stream)")
    _experiment_options(s)
    s.set_defaults(func=cmd_overlap)

    s = sub.add_parser("tune", help=COMMANDS["tune"])
    s.add_argument("--dataset", metavar="PATH", help="image folder, .tar(.gz) shard, CIFAR-10 batches, .npy/.npz "
                   "(default: the embedded synthetic CIFAR-10)")
    _pipeline_options(s)
    s.add_argument("--strategy", choices=("fast", "paper"), default="fast",
                   help="fast: coarse-to-fine within a cost budget (default); paper: Algorithm 1 over 0..N-1")
    _workload_options(s, "the paper search takes N = usable CPUs (a rank's share of the node under a "
                      "launcher); the fast one measures 0..usable CPUs and "
                      "goes on while throughput still rises, up to 4 workers per usable CPU, at least "
                      f"{open_cap(1)}, at most {OPEN_CAP_MAX}")
    s.add_argument("--prefetch-factor", default="2", help="batches in flight per worker (default 2)")
    s.add_argument("--alpha", default="0.5", help="paper: ignore gains below this many s per 100 iterations")
    s.add_argument("--tolerance", default="0.02", help="fast: counts within this fraction of the best are equal")
    s.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="where batches go; auto = cuda when a GPU is usable")
    s.add_argument("--pin-memory", action="store_true", help="page-locked host memory for the H2D copy, as "
                   "DataLoader(pin_memory=True); off by default, as in the DataLoader")
    s.add_argument("--main-process", choices=("auto", "waits", "busy"), default="auto",
                   help="the main process during training: waits (a GPU step) or busy (a CPU step, one CPU kept "
                   "busy in every trial); auto: waits with a GPU, busy without")
    s.add_argument("--step", metavar="SECONDS|MODULE:ATTR", help="your training step, run on every batch of every "
                   "trial: its time in seconds (slept for a GPU step, spun for a CPU one), or a callable taking a "
                   "batch; the pick is then the fewest workers that leave it waiting least (default: none, fastest "
                   "loader)")
    s.add_argument("--no-save", action="store_true", help="do not record the pick in the machine-wide store")
    s.add_argument("--plot", metavar="FILE.png", help="also draw time and memory against workers (paper Fig. 2/3) "
                   "into this PNG")
    _output_options(s, "the table")
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("stats", help=COMMANDS["stats"])
    s.add_argument("--dataset", metavar="PATH", help="as for tune (default: the embedded synthetic CIFAR-10)")
    s.add_argument("--synthetic-n", default="5000", help="images in the synthetic CIFAR-10 (default 5000)")
    s.add_argument("--batch-size", default="128", help="samples per batch (default 128)")
    s.add_argument("--num-workers", default="2", help="loader workers (default 2)")
    s.add_argument("--worker-type", choices=WORKER_TYPES, default="process", help="(default process)")
    s.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="where batches go (default auto)")
    s.add_argument("--batches", default="200", help="batches to load in all, over epochs (default 200)")
    s.add_argument("--every", default="20", help="a row of figures every this many batches (default 20)")
    _pipeline_options(s)
    s.add_argument("--plot", metavar="FILE.png", help="also draw the figures over time into this PNG")
    _output_options(s, "the table")
    s.set_defaults(func=cmd_stats)

    s = sub.add_parser("reproduce", help=COMMANDS["reproduce"])
    s.add_argument("--out", default="nwt-report", help="folder for the results (default nwt-report)")
    _workload_options(s, "N = usable CPUs, for both searches")
    s.add_argument("--compare-iterations", default="50", help="batches per count when judging picks (default 50)")
    s.add_argument("--compare-repeats", default="3", help="interleaved rounds of every count, to find the steady best (default 3)")
    s.add_argument("--judge-repeats", default="9",
                   help="fresh paired rounds of the best counts and the picks, to judge the picks (default 9)")
    s.add_argument("--no-gpu", action="store_true", help="skip the transfer experiments even with a GPU")
    s.add_argument("--json", action="store_true", help="print the JSON report instead of the summary")
    s.add_argument("--no-progress", action="store_true", help="no progress output on stderr")
    s.set_defaults(func=cmd_reproduce)
    for s in sub.choices.values():  # --debug before or after the command; SUPPRESS keeps the global value
        s.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p

