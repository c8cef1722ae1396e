"""``cupy-nwt`` and ``python -m cupy_nwt``: one sub-command per experiment.

Every failure a user can cause or meet (bad input, no GPU) ends as one line on stderr and a
non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__, cuda, report, system
from .units import fmt_bytes

EXIT_USAGE = 2
EXIT_NO_GPU = 3


def cmd_info(args: argparse.Namespace) -> int:
    host = system.host_info()
    status = cuda.gpu_status()
    devices = [cuda.device_info(i) for i in range(status.device_count)] if status.available else []
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
        print(f"GPU: none usable: {status.reason.removeprefix('no usable GPU: ')}")
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cupy-nwt", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"cupy-nwt {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("info", help="host facts, and the GPU with its PCIe link (or why there is none)")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(func=cmd_info)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except cuda.NoGPUError as exc:
        print(f"cupy-nwt {args.command}: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    except (ValueError, FileNotFoundError) as exc:
        print(f"cupy-nwt {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"cupy-nwt {args.command}: interrupted", file=sys.stderr)
        return 130
