"""Rank layout from the launcher already in use, and DistributedSampler-style sharding.

cupy_nwt has no cluster layer of its own: an initialised ``torch.distributed`` process group, or torchrun,
Lightning, SLURM, Open MPI and MPICH/Hydra through environment variables, already tell each process who it
is; we read them, check they agree, and shard.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ._checks import check_int
from .errors import ArgumentError, LayoutError
from .system import usable_cpus

_log = logging.getLogger(__name__)
MAX_WORLD_SIZE = 1 << 24  # far more ranks than any job runs; keeps a rank's sample positions in 64-bit arithmetic

@dataclass(frozen=True)
class RankLayout:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: str  # "torch.distributed" | "torchrun" | "lightning" | "openmpi" | "mpich" | "slurm" | "explicit" | "single"

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# (launcher, rank, world size, local rank, local world size); the first launcher whose rank or
# world-size variable is present wins. SLURM comes last: its variables leak into processes that
# mpiexec or torchrun started inside an allocation, and those launchers know better.
_LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
)


def _int(env: Mapping[str, str], name: str | None) -> int | None:
    raw = env.get(name) if name is not None else None
    if raw is None or raw.strip() == "":
        return None
    text = raw.strip()
    if not (text.isascii() and text.lstrip("+-").isdigit()):  # int() takes '1_0' and other scripts' digits too
        raise LayoutError(f"{name}={raw!r} is not an integer")
    return int(text)


def slurm_tasks_on_this_node(env: Mapping[str, str]) -> int | None:
    """Tasks on this node from SLURM_TASKS_PER_NODE ('2(x3),1') indexed by SLURM_NODEID."""
    spec = env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return _int(env, "SLURM_NTASKS_PER_NODE")
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise LayoutError(f"SLURM_TASKS_PER_NODE={spec!r} is not in SLURM's 'N(xM),K' form")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    node = _int(env, "SLURM_NODEID") or 0
    if node >= len(counts):
        raise LayoutError(f"SLURM_NODEID={node} but SLURM_TASKS_PER_NODE={spec!r} lists {len(counts)} nodes")
    return counts[node]


def rank_layout(rank: int | None = None, world_size: int | None = None,
                env: Mapping[str, str] | None = None) -> RankLayout:
    """This process's place among the ranks: explicit arguments, else an initialised ``torch.distributed``
    process group (as ``DistributedSampler`` asks it), else the launcher's variables.

    No launcher variables at all means a single process. Local rank and local world size default
    to the global ones when a launcher does not give them (one node). Lightning's launcher sets
    ``WORLD_SIZE``, ``LOCAL_RANK`` and ``NODE_RANK`` but not ``RANK``: on node 0 the rank is the local
    rank, on another node ``LOCAL_WORLD_SIZE`` (the devices a node) must say how many ranks precede it.
    A half-set layout is refused only when no later launcher's variables are complete. SLURM's
    variables count only inside a job step that srun started (``SLURM_STEP_ID`` set): the batch script
    of an ``sbatch --ntasks=4`` job also sees ``SLURM_PROCID=0`` and ``SLURM_NTASKS=4``, and a plain
    ``python train.py`` there must not load a quarter of the data.

    Args:
        rank: this process's rank (with ``world_size``; an integer, else ``ArgumentTypeError``).
        world_size: the number of ranks.
        env: the variables to read (default: ``os.environ``).
    """
    env = os.environ if env is None else env
    rank = check_int("rank", rank, optional=True)
    world_size = check_int("world_size", world_size, optional=True)
    if (rank is None) != (world_size is None):
        raise LayoutError("give both rank= and world_size=, or neither (then the launcher's environment is used)")
    if rank is not None and world_size is not None:
        return _checked(RankLayout(rank, world_size, rank, world_size, "explicit"), "rank", "world_size")
    group = process_group_layout(env)
    if group is not None:
        return group
    half_set: str | None = None
    for launcher, r_name, w_name, lr_name, lw_name in _LAUNCHERS:
        if launcher == "slurm" and not (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")):
            continue  # an sbatch script itself is "task 0 of N" too: only srun's job steps are ranks
        r, w = _int(env, r_name), _int(env, w_name)
        if r is None and w is None:
            continue
        if r is None or w is None:
            lightning = _lightning_layout(env) if launcher == "torchrun" else None
            if lightning is not None:
                return lightning
            have, missing = (r_name, w_name) if r is not None else (w_name, r_name)
            half_set = half_set or f"{have} is set but {missing} is not: the {launcher} rank layout is half-set"
            continue
        lr = _int(env, lr_name)
        lw = slurm_tasks_on_this_node(env) if launcher == "slurm" else _int(env, lw_name)
        layout = RankLayout(r, w, r if lr is None else lr, w if lw is None else lw, launcher)
        return _checked(layout, r_name, w_name, lr_name, lw_name or "SLURM_TASKS_PER_NODE")
    if half_set is not None:
        raise LayoutError(half_set)
    return RankLayout(0, 1, 0, 1, "single")


def _lightning_layout(env: Mapping[str, str]) -> RankLayout | None:
    """Lightning's launcher's layout (``WORLD_SIZE``, ``LOCAL_RANK``, ``NODE_RANK``; no ``RANK``), when complete:
    the rank is ``NODE_RANK * devices + LOCAL_RANK``, and the devices a node are needed only past node 0."""
    w, lr = _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK")
    node = _int(env, "NODE_RANK") or _int(env, "GROUP_RANK") or 0
    lw = _int(env, "LOCAL_WORLD_SIZE")
    if w is None or lr is None or (node > 0 and lw is None):
        return None
    rank = node * lw + lr if node > 0 and lw is not None else lr
    layout = RankLayout(rank, w, lr, w if lw is None else lw, "lightning")
    return _checked(layout, "NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK", "WORLD_SIZE", "LOCAL_RANK",
                    "LOCAL_WORLD_SIZE" if lw is not None else "WORLD_SIZE")


def process_group_layout(env: Mapping[str, str] | None = None) -> RankLayout | None:
    """The layout of an initialised ``torch.distributed`` default process group; None without one.

    Rank and world size are the group's, as ``DistributedSampler`` reads them; the local rank and local
    world size come from ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` where a launcher set them (else one node).
    torch is never imported here: only a program that initialised a group has ``torch.distributed``.
    """
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        r, w = int(dist.get_rank()), int(dist.get_world_size())
    except (AttributeError, RuntimeError, ValueError):  # a half-imported or torn-down torch
        return None
    env = os.environ if env is None else env
    lr, lw = _int(env, "LOCAL_RANK"), _int(env, "LOCAL_WORLD_SIZE")
    lr, lw = r if lr is None else lr, w if lw is None else lw
    if not 0 <= lr < lw <= w:  # variables of another layout: the group knows better
        lr, lw = r, w
    return RankLayout(r, w, lr, lw, "torch.distributed")


def _checked(layout: RankLayout, r_name: str, w_name: str,
             lr_name: str | None = None, lw_name: str | None = None) -> RankLayout:
    if layout.world_size < 1:
        raise LayoutError(f"{w_name}={layout.world_size}: the world size must be at least 1")
    if layout.world_size > MAX_WORLD_SIZE:
        raise LayoutError(f"{w_name}={layout.world_size}: more than {MAX_WORLD_SIZE:,} ranks is not a world size")
    if not 0 <= layout.rank < layout.world_size:
        raise LayoutError(f"{r_name}={layout.rank} is outside 0..{w_name}-1 (world size {layout.world_size})")
    if lr_name and lw_name:
        if not 1 <= layout.local_world_size <= layout.world_size:
            raise LayoutError(f"{lw_name}={layout.local_world_size} must be in 1..{w_name} ({layout.world_size})")
        if not 0 <= layout.local_rank < layout.local_world_size:
            raise LayoutError(f"{lr_name}={layout.local_rank} is outside 0..{lw_name}-1 "
                              f"(local world size {layout.local_world_size})")
    return layout


def samples_per_rank(n: int, world_size: int, drop_last: bool) -> int:
    """Samples each rank gets per epoch, as DistributedSampler counts them."""
    if world_size < 1:
        raise ArgumentError("world_size must be at least 1")
    if drop_last:
        return n // world_size
    return -(-n // world_size)


def shard(order: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """This rank's share of one epoch's index order (the same order on every rank).

    Without ``drop_last`` the order is padded by wrapping around to its start until it divides
    evenly, so a few samples are seen twice per epoch (by different ranks); with ``drop_last`` the
    tail that does not divide evenly is left out this epoch. Rank r takes every world_size-th index
    starting at r, so shards are disjoint apart from the padding and every rank gets the same count.
    """
    if not 0 <= rank < world_size:
        raise ArgumentError(f"rank {rank} outside 0..{world_size - 1}")
    order = np.asarray(order)
    per = samples_per_rank(len(order), world_size, drop_last)
    if not len(order) or not per:
        return order[:0]
    # positions rank, rank + world_size, ... wrapped around the order: the padding, without an array of them all
    return order[(rank + world_size * np.arange(per, dtype=np.int64)) % len(order)]


def worker_budget(layout: RankLayout, cpus: int | None = None) -> int:
    """CPUs one rank may use for its loader: the usable CPUs split among the node's ranks."""
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, cpus // max(1, layout.local_world_size))


def device_for_rank(layout: RankLayout, device_count: int) -> int:
    """The GPU a rank uses by default: its local rank modulo the GPUs on the node."""
    if device_count < 1:
        raise ArgumentError("no CUDA device to assign")
    return layout.local_rank % device_count
