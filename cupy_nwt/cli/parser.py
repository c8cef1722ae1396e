"""The ``cupy-nwt`` command line: one sub-command per experiment, with the options each takes."""

from __future__ import annotations

import argparse

from .. import __version__
from ..loader.workers.kinds import WORKER_TYPES
from .commands import cmd_bandwidth, cmd_info, cmd_overlap, cmd_reproduce, cmd_stats, cmd_tune
from .exits import DEBUG_ENV, EXIT_CODES

DESCRIPTION = "cupy-nwt (or python -m cupy_nwt): one sub-command per experiment."

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



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cupy-nwt", description=DESCRIPTION, epilog=EXIT_CODES,
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

