"""cupy-nwt (or python -m cupy_nwt): one sub-command per experiment.

Every failure a user can cause or meet (bad input, no GPU, bad data, a dead worker) ends as one
line on stderr and its own exit code (``EXIT_CODES``), never a traceback unless ``--debug`` (or
``CUPY_NWT_DEBUG=1``) asks for one.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__, cuda, system
from ._reporting import tables as report
from ._reporting.progress import Progress
from ._reporting.units import fmt_bytes, parse_size, size_sweep
from .loader.workers.kinds import WORKER_TYPES

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_GPU = 3
EXIT_BAD_DATA = 4
EXIT_WORKER = 5
EXIT_INTERRUPTED = 130
DEBUG_ENV = "CUPY_NWT_DEBUG"

EXIT_CODES = f"""exit codes:
  0    done
  1    a run's own check failed, or an unexpected error
  2    bad input: options, paths, arguments
  3    no usable GPU for a command that needs one
  4    bad data: a file, archive member or sample that cannot be read or does not fit
  5    the loader failed: a worker died or stopped delivering, or memory (or /dev/shm) has no room for its ring
  130  interrupted

Errors are one line on stderr; --debug (or {DEBUG_ENV}=1) adds the full traceback."""


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
        raise ValueError(f"{name} must be a whole number, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _size_option(text: str, name: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _check_writable(path: str | None, name: str) -> None:
    """Fail before a long GPU run, not after it, when a result file cannot be written.

    Only checks: nothing is created here, so a command that then fails (no GPU, bad input) leaves
    no folder behind; the writers create missing folders when they write.
    """
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{name} {path} is a directory, not a file")
    existing = target.absolute().parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{name} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {path}: {existing} is not writable")


def _check_outputs(args: argparse.Namespace) -> None:
    """The command's ``--output`` and ``--plot`` (where it has one), checked before its long run."""
    plot = getattr(args, "plot", None)
    if plot:
        from ._reporting import plots  # noqa: PLC0415 - only this command needs it

        if not plots.matplotlib_available():
            raise ValueError("--plot needs matplotlib: pip install 'cupy-nwt[plot]'")
    _check_writable(args.output, "--output")
    _check_writable(plot, "--plot")


def _run_with_progress(args: argparse.Namespace, total: int, desc: str, run):
    with Progress(total, desc, enabled=not args.no_progress) as bar:
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
    from ._reporting import plots  # noqa: PLC0415 - only this command needs it
    from .experiments import transfers  # noqa: PLC0415 - only this command needs it

    lo, hi = _size_option(args.min, "--min"), _size_option(args.max, "--max")
    if lo > hi:
        raise ValueError(f"--min ({fmt_bytes(lo)}) is larger than --max ({fmt_bytes(hi)})")
    sizes = size_sweep(lo, hi, _int_option(args.factor, "--factor", 2))
    config = transfers.BandwidthConfig(
        sizes=tuple(sizes), **_run_options(args),
        batch_total=_size_option(args.batch_total, "--batch-total"),
        batch_chunk=_size_option(args.batch_chunk, "--batch-chunk"))
    _check_outputs(args)
    result = _run_on_gpu(args, config, transfers.run_bandwidth)
    if args.plot:
        plots.plot_bandwidth(result, args.plot)
    return _finish(args, result, transfers.summary_text(result),
                   None if result.verified else "copied bytes differ from the source (see 'verified')")


def cmd_overlap(args: argparse.Namespace) -> int:
    from .experiments import overlap  # noqa: PLC0415 - only this command needs it

    config = overlap.OverlapConfig(
        streams=_int_option(args.streams, "--streams", 1),
        elements=None if args.elements is None else _int_option(args.elements, "--elements", 1),
        **_run_options(args))
    _check_outputs(args)
    result = _run_on_gpu(args, config, overlap.run_overlap)
    return _finish(args, result, overlap.summary_text(result), None if result.correct else
                   f"max error {result.max_error:.3g} exceeds {overlap.MAX_ERROR_TOLERANCE:g}")


def cmd_tune(args: argparse.Namespace) -> int:
    from ._pipeline import build_synthetic_apart, open_pipeline  # noqa: PLC0415 - only this command needs them
    from ._reporting.explain import summary_text  # noqa: PLC0415
    from .nwt import tune as nwt_tune  # noqa: PLC0415

    _check_outputs(args)
    synthetic_n = _int_option(args.synthetic_n, "--synthetic-n", 1)
    if not args.dataset:  # its first build in another process: the trials' memory is the tuner's alone
        build_synthetic_apart(synthetic_n, not args.no_progress)
    dataset, transform = open_pipeline(args, synthetic_n, progress=not args.no_progress)
    try:
        alpha, tolerance = float(args.alpha), float(args.tolerance)
    except ValueError:
        raise ValueError(f"--alpha and --tolerance must be numbers, got {args.alpha!r}, {args.tolerance!r}") from None
    result = nwt_tune.tune_num_workers(
        dataset, **_workload(args), alpha=alpha, tolerance=tolerance,
        strategy=args.strategy, device=args.device, pin_memory=args.pin_memory,
        prefetch_factor=_int_option(args.prefetch_factor, "--prefetch-factor", 1), batch_transform=transform,
        progress=not args.no_progress, main_process=args.main_process)
    outcome = None if args.no_save else result.save_pick()
    if args.plot:
        from ._reporting.plots import plot_tune  # noqa: PLC0415

        plot_tune(result, args.plot)
    from ._reporting.explain import explain_paper_pick  # noqa: PLC0415

    _emit(args, result, "\n\n".join(filter(None, [summary_text(result, outcome=outcome),
                                                     explain_paper_pick(result)])))
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from . import reproduce  # noqa: PLC0415

    config = reproduce.ReproduceConfig(
        out_dir=Path(args.out), synthetic_n=_int_option(args.synthetic_n, "--synthetic-n", 1), **_workload(args),
        compare_iterations=_int_option(args.compare_iterations, "--compare-iterations", 1),
        compare_repeats=_int_option(args.compare_repeats, "--compare-repeats", 1),
        judge_repeats=_int_option(args.judge_repeats, "--judge-repeats", 1),
        gpu_experiments=not args.no_gpu, progress=not args.no_progress)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a file, not a folder")
    rep = reproduce.run_reproduce(config)
    print(report.to_json(rep) if args.json else reproduce.summary_text(rep))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from . import watch  # noqa: PLC0415 - only this command needs them
    from ._pipeline import open_pipeline  # noqa: PLC0415

    config = watch.WatchConfig(batch_size=_int_option(args.batch_size, "--batch-size", 1),
                               num_workers=_int_option(args.num_workers, "--num-workers", 0),
                               worker_type=args.worker_type, device=args.device,
                               batches=_int_option(args.batches, "--batches", 1), every=_int_option(args.every, "--every", 1))
    _check_outputs(args)
    dataset, transform = open_pipeline(args, _int_option(args.synthetic_n, "--synthetic-n", 1), progress=False)
    on_row = None if args.json else watch.live_table()  # rows as they come; --json prints it all at the end
    result = _run_with_progress(args, config.batches, "stats", lambda step: watch.run_watch(
        dataset, args.dataset or "synthetic CIFAR-10", config, batch_transform=transform, step=step, on_row=on_row))
    if args.plot:
        watch.plot_watch(result, args.plot)
    _emit(args, result, watch.footer(result))
    return 0


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


def _workload_options(s: argparse.ArgumentParser) -> None:
    """The tuner's workload and search size, shared by ``tune`` and ``reproduce``."""
    s.add_argument("--synthetic-n", default="50000", help="images in the synthetic CIFAR-10 (default 50000)")
    s.add_argument("--batch-size", default="128", help="samples per batch (default 128)")
    s.add_argument("--max-workers", default=None, help="the paper's N: counts 0..N-1 (default: usable CPUs)")
    s.add_argument("--iterations", default="100", help="batches per trial of the paper's search (default 100)")


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed ``_workload_options`` but ``--synthetic-n`` (``tune`` reads it only without ``--dataset``)."""
    return {"batch_size": _int_option(args.batch_size, "--batch-size", 1),
            "max_workers": None if args.max_workers is None else _int_option(args.max_workers, "--max-workers", 1),
            "iterations": _int_option(args.iterations, "--iterations", 1)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cupy-nwt", description=__doc__.splitlines()[0], epilog=EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"cupy-nwt {__version__}")
    p.add_argument("--debug", action="store_true", help=f"print the traceback of an error (or {DEBUG_ENV}=1)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("info", help="host facts, and the GPU with its PCIe link (or why there is none)")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("bandwidth", help="H2D/D2H GB/s, pageable vs pinned, over a size sweep; one vs many copies")
    s.add_argument("--min", default="4KiB", help="smallest copy (default 4KiB)")
    s.add_argument("--max", default="256MiB", help="largest copy (default 256MiB)")
    s.add_argument("--factor", default="2", help="size step factor (default 2)")
    s.add_argument("--batch-total", default="64MiB", help="bytes of the one-vs-many test (default 64MiB)")
    s.add_argument("--batch-chunk", default="64KiB", help="small-copy size of that test (default 64KiB)")
    s.add_argument("--plot", metavar="FILE.png", help="also draw GB/s against size into this PNG")
    _experiment_options(s)
    s.set_defaults(func=cmd_bandwidth)

    s = sub.add_parser("overlap", help="copy/compute overlap over N streams: sequential, async v1, async v2")
    s.add_argument("--streams", default="4", help="streams, one chunk each (default 4)")
    s.add_argument("--elements", default=None, help="float32 elements in all (default 4*1024*256 per stream)")
    _experiment_options(s)
    s.set_defaults(func=cmd_overlap)

    s = sub.add_parser("tune", help="Num Worker Tuner: measure the loader over worker counts and pick one")
    s.add_argument("--dataset", metavar="PATH", help="image folder, .tar(.gz) shard, CIFAR-10 batches, .npy/.npz "
                   "(default: the embedded synthetic CIFAR-10)")
    _pipeline_options(s)
    s.add_argument("--strategy", choices=("fast", "paper"), default="fast",
                   help="fast: coarse-to-fine within a cost budget (default); paper: Algorithm 1 over 0..N-1")
    _workload_options(s)
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
    s.add_argument("--no-save", action="store_true", help="do not record the pick in the machine-wide store")
    s.add_argument("--plot", metavar="FILE.png", help="also draw time and memory against workers (paper Fig. 2/3)")
    _output_options(s, "the table")
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("stats", help="run the loader on a dataset and print where its time goes, stage by stage")
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

    s = sub.add_parser("reproduce", help="everything: info, transfer experiments (GPU), the tuner both ways, "
                       "picks judged against every count; files into one folder")
    s.add_argument("--out", default="nwt-report", help="folder for the results (default nwt-report)")
    _workload_options(s)
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _loading_failure(exc: BaseException, args: argparse.Namespace) -> str:
    """One line for a batch that failed to load: the file, member or sample, and what is wrong."""
    from .datasets import DataError, sample_source  # noqa: PLC0415
    from .loader.ring.collate import BatchLayoutError  # noqa: PLC0415 - only on the error path

    cause = exc.__cause__
    index = getattr(cause, "sample_index", None)
    index = getattr(exc, "sample_index", None) if index is None else index
    where = getattr(args, "dataset", None) or "the dataset"
    if isinstance(cause, DataError):
        what = _first_line(cause)
    elif isinstance(cause, BatchLayoutError):
        if index is not None:
            where = sample_source(getattr(args, "opened_dataset", None), index)
        what = f"{where}: {_first_line(cause)}"
    else:
        at = f"sample {index}" if index is not None else f"batch {getattr(exc, 'batch_index', '?')}"
        kind = getattr(exc, "exc_type", None) or type(cause).__name__
        detail = _first_line(cause) if cause is not None else _first_line(exc).partition(f"{kind}: ")[2]
        what = f"{where}, {at}: {kind}: {detail or _first_line(exc)}"
    return _with_index(what, index)


def _with_index(what: str, index: int | None) -> str:
    if index is None or f"sample {index}" in what or f"sample index {index}" in what:
        return what
    return f"{what} (sample {index})"


def _failure(exc: BaseException, args: argparse.Namespace) -> tuple[int, str]:
    """The exit code and the one line for the error a command ended with."""
    from .datasets import DataError  # noqa: PLC0415 - only on the error path
    from .errors import LoaderError, LoaderTimeoutError, WorkerDiedError, WorkerError  # noqa: PLC0415

    if isinstance(exc, cuda.NoGPUError):
        return EXIT_NO_GPU, str(exc)
    if isinstance(exc, WorkerError):  # before DataError: it may be one too (the dataset's own type)
        return EXIT_BAD_DATA, f"bad data: {_loading_failure(exc, args)}"
    if isinstance(exc, DataError):
        return EXIT_BAD_DATA, f"bad data: {_with_index(_first_line(exc), getattr(exc, 'sample_index', None))}"
    if isinstance(exc, (WorkerDiedError, LoaderTimeoutError)):
        return EXIT_WORKER, f"loader worker failed: {_first_line(exc)}"
    if isinstance(exc, LoaderError):  # e.g. RingMemoryError: no room in memory for the ring
        return EXIT_WORKER, f"loader failed: {_first_line(exc)}"
    if isinstance(exc, (ValueError, FileNotFoundError)):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    return EXIT_FAILED, f"unexpected error: {type(exc).__name__}: {_first_line(exc)} (--debug shows where)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - every error ends as one line and a code
        code, line = _failure(exc, args)
        if args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            traceback.print_exception(exc)
        print(f"cupy-nwt {args.command}: {line}", file=sys.stderr)
        return code
