"""PCIe link arithmetic and the Linux sysfs reading of a link: host-side facts that need no GPU.

``cuda.pcie_link`` asks NVML first and falls back to :func:`sysfs_pcie_link`; inside a VM both may
have nothing to say, and every caller then reports the link limit as unknown.

Two maxima are kept. NVML's ``max_gen``/``max_width`` are "the most possible with this device and
system", which behind a VM's virtual root port can read below what the link really runs at (then a
copy measures over 100% of it). ``gpu_max_gen``/``gpu_max_width`` are the GPU's own capability
(NVML's GPU maximum generation; the width from the GPU's own PCIe capability in sysfs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PcieLink:
    """A PCIe link as NVML (or sysfs) reports it; GB/s are per direction, after line coding."""

    current_gen: int | None
    current_width: int | None
    max_gen: int | None
    max_width: int | None
    source: str
    gpu_max_gen: int | None = None
    gpu_max_width: int | None = None

    @property
    def current_gbps(self) -> float | None:
        return pcie_theoretical_gbps(self.current_gen, self.current_width)

    @property
    def max_gbps(self) -> float | None:
        return pcie_theoretical_gbps(self.max_gen, self.max_width)

    @property
    def gpu_max_gbps(self) -> float | None:
        """The GPU's own top rate: what the link would run at in a slot that limits nothing."""
        return pcie_theoretical_gbps(self.gpu_max_gen, self.gpu_max_width)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["current_gbps"] = self.current_gbps
        d["max_gbps"] = self.max_gbps
        d["gpu_max_gbps"] = self.gpu_max_gbps
        return d


# Per-lane payload rate in GB/s, after line coding: gen1/2 use 8b/10b, gen3..5 use 128b/130b,
# gen6 runs PAM4 with 242B/256B FLIT framing.
_LANE_GBPS = {
    1: 2.5 * 8 / 10 / 8,
    2: 5.0 * 8 / 10 / 8,
    3: 8.0 * 128 / 130 / 8,
    4: 16.0 * 128 / 130 / 8,
    5: 32.0 * 128 / 130 / 8,
    6: 64.0 * 242 / 256 / 8,
}


def pcie_theoretical_gbps(gen: int | None, width: int | None) -> float | None:
    """Theoretical one-direction bandwidth of a PCIe link (Gen5 x16 -> ~63.0 GB/s)."""
    if gen is None or width is None or gen not in _LANE_GBPS or width <= 0:
        return None
    return _LANE_GBPS[gen] * width


def sysfs_pcie_link(dev_dir: Path) -> PcieLink | None:
    """Read a link from sysfs files such as ``current_link_speed = '32.0 GT/s PCIe'``."""
    gts_to_gen = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}

    def read(name: str) -> str | None:
        try:
            return (dev_dir / name).read_text().strip()
        except OSError:
            return None

    def gen(text: str | None) -> int | None:
        try:
            return gts_to_gen.get(float(text.split()[0])) if text else None
        except ValueError:
            return None

    def width(text: str | None) -> int | None:
        return int(text) if text and text.isdigit() else None

    cur_s, max_s = read("current_link_speed"), read("max_link_speed")
    if cur_s is None and max_s is None:
        return None
    # sysfs's max_* read the device's own link capability: they are the GPU's maximum too.
    max_gen, max_width = gen(max_s), width(read("max_link_width"))
    return PcieLink(gen(cur_s), width(read("current_link_width")), max_gen, max_width, "sysfs", max_gen, max_width)


def gpu_own_max(sysfs_dir: Path, nvml_gen: int | None) -> tuple[int | None, int | None]:
    """(generation, width) the GPU itself supports: NVML's GPU maximum generation when it gave one,
    else sysfs's; the width from sysfs (NVML has no GPU-only width). Missing pieces are None."""
    link = sysfs_pcie_link(sysfs_dir)
    return (nvml_gen if nvml_gen is not None else (link.max_gen if link else None)), (link.max_width if link else None)


def nvml_pcie_link(bus_id: str, sysfs_dir: Path) -> PcieLink:
    """The link as NVML reports it for the device at ``bus_id``, with the GPU's own maximum (NVML where it
    knows, else sysfs); raises whatever NVML raises (no library, no such call)."""
    import pynvml  # noqa: PLC0415 - on GPU machines only

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        current_gen = int(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h))
        current_width = int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(h))
        max_gen = int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h))
        max_width = int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(h))
        try:
            nvml_gpu_gen: int | None = int(pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(h))
        except Exception:  # noqa: BLE001 - older NVML: sysfs may still say
            nvml_gpu_gen = None
    finally:
        pynvml.nvmlShutdown()
    gpu_gen, gpu_width = gpu_own_max(sysfs_dir, nvml_gpu_gen)
    return PcieLink(current_gen, current_width, max_gen, max_width, "nvml", gpu_gen, gpu_width)
