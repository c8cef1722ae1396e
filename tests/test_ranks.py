"""Rank layouts from each launcher's variables, their errors, and the shard arithmetic."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cupy_nwt.ranks import (
    LayoutError,
    RankLayout,
    device_for_rank,
    rank_layout,
    samples_per_rank,
    shard,
    worker_budget,
)


@pytest.mark.parametrize(("env", "expected"), [
    ({}, RankLayout(0, 1, 0, 1, "single")),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, RankLayout(3, 8, 1, 2, "torchrun")),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, RankLayout(5, 6, 2, 3, "openmpi")),
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}, RankLayout(1, 4, 1, 4, "mpich")),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "5", "SLURM_LOCALID": "0", "SLURM_NODEID": "2",
      "SLURM_TASKS_PER_NODE": "2(x2),1", "SLURM_STEP_ID": "0"}, RankLayout(4, 5, 0, 1, "slurm")),
    # the batch script of `sbatch --ntasks=4` is no rank: only srun's job steps are
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "4"}, RankLayout(0, 1, 0, 1, "single")),
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, RankLayout(0, 2, 0, 2, "mpich")),
    # torchrun inside a SLURM allocation: torchrun's own variables describe this process
    ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, RankLayout(1, 2, 1, 2, "torchrun")),
])
def test_layout_from_each_launcher(env, expected):
    assert rank_layout(env=env) == expected


def test_explicit_arguments_win_over_environment():
    assert rank_layout(1, 3, env={"RANK": "0", "WORLD_SIZE": "2"}) == RankLayout(1, 3, 1, 3, "explicit")


@pytest.mark.parametrize(("kwargs", "env", "names"), [
    ({}, {"RANK": "0"}, ["RANK", "WORLD_SIZE"]),
    ({}, {"WORLD_SIZE": "2"}, ["WORLD_SIZE", "RANK"]),
    ({}, {"RANK": "2", "WORLD_SIZE": "2"}, ["RANK=2", "WORLD_SIZE"]),
    ({}, {"RANK": "0", "WORLD_SIZE": "0"}, ["WORLD_SIZE=0"]),
    ({}, {"RANK": "x", "WORLD_SIZE": "2"}, ["RANK='x'"]),
    ({}, {"RANK": "1_0", "WORLD_SIZE": "20"}, ["RANK='1_0' is not an integer"]),
    ({}, {"RANK": "\u0661", "WORLD_SIZE": "2"}, ["RANK='\u0661' is not an integer"]),
    ({}, {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, ["LOCAL_RANK=3"]),
    ({}, {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
     ["OMPI_COMM_WORLD_LOCAL_SIZE=4"]),
    ({}, {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "two", "SLURM_STEP_ID": "1"},
     ["SLURM_TASKS_PER_NODE"]),
    ({"rank": 0}, {}, ["rank=", "world_size="]),
    ({"rank": 3, "world_size": 3}, {}, ["rank=3"]),
    ({"rank": 0, "world_size": 2**40}, {}, ["world_size=1099511627776", "ranks"]),
    ({}, {"RANK": "0", "WORLD_SIZE": str(10**30)}, ["WORLD_SIZE="]),
])
def test_bad_layouts_name_the_variables(kwargs, env, names):
    with pytest.raises(LayoutError) as info:
        rank_layout(**kwargs, env=env)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize(("rank", "world_size"), [(1.5, 2), (1, 2.0), (True, 2), ("1", 2), (np.float64(0), 1)])
def test_a_rank_or_world_size_that_is_no_integer_is_refused_in_one_line(rank, world_size):
    with pytest.raises(ValueError, match=r"(rank|world_size) must be an integer"):
        rank_layout(rank, world_size, env={})
    assert rank_layout(np.int64(1), np.int32(2), env={}) == RankLayout(1, 2, 1, 2, "explicit")
    assert type(rank_layout(np.int64(1), np.int32(2), env={}).rank) is int


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 500), world=st.integers(1, 17), drop_last=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_shards_are_equal_disjoint_and_complete(n, world, drop_last, seed):
    order = np.random.default_rng(seed).permutation(n)
    shards = [shard(order, r, world, drop_last) for r in range(world)]
    per = samples_per_rank(n, world, drop_last)
    assert all(len(s) == per for s in shards)
    together = np.concatenate(shards) if shards else np.array([], dtype=int)
    if drop_last:
        # disjoint, and only the tail that does not divide evenly is left out
        assert len(set(together.tolist())) == len(together) == n - n % world
    else:
        # complete, and the only repeats are the wrapped-around padding
        assert set(together.tolist()) == set(range(n))
        assert len(together) - n == (per * world - n if n else 0)
        assert len(together) - n < world or n == 0


def test_shard_matches_distributed_sampler_layout():
    order = np.arange(10)
    assert shard(order, 0, 4, False).tolist() == [0, 4, 8]
    assert shard(order, 2, 4, False).tolist() == [2, 6, 0]  # padded by wrapping
    assert shard(order, 3, 4, True).tolist() == [3, 7]
    assert shard(np.arange(3), 4, 5, False).tolist() == [1]  # more ranks than samples: wrapped, as torch pads
    assert shard(order, 1, 1 << 24, False).tolist() == [1]  # no array of every rank's positions


def test_budget_and_device_per_rank():
    layout = RankLayout(5, 8, 1, 4, "torchrun")
    assert worker_budget(layout, cpus=16) == 4
    assert worker_budget(layout, cpus=2) == 1
    assert device_for_rank(layout, device_count=1) == 0
    assert device_for_rank(RankLayout(3, 4, 3, 4, "torchrun"), device_count=2) == 1
    with pytest.raises(ValueError):
        device_for_rank(layout, 0)


@pytest.mark.parametrize(("env", "expected"), [
    # Lightning's launcher: WORLD_SIZE, LOCAL_RANK and NODE_RANK, no RANK
    ({"WORLD_SIZE": "2", "LOCAL_RANK": "1", "NODE_RANK": "0"}, RankLayout(1, 2, 1, 2, "lightning")),
    ({"WORLD_SIZE": "4", "LOCAL_RANK": "1", "NODE_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
     RankLayout(3, 4, 1, 2, "lightning")),
    # a half-set torchrun layout beside a complete Open MPI one: the complete one tells
    ({"WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, RankLayout(1, 2, 1, 2, "openmpi")),
])
def test_lightnings_layout_and_a_half_set_one_beside_a_complete_one(env, expected):
    assert rank_layout(env=env) == expected


@pytest.mark.parametrize("env", [
    {"WORLD_SIZE": "4", "LOCAL_RANK": "1", "NODE_RANK": "1"},  # past node 0 the devices a node are needed
    {"WORLD_SIZE": "2", "NODE_RANK": "0"},
])
def test_a_half_set_layout_with_nothing_else_is_refused(env):
    with pytest.raises(LayoutError, match="WORLD_SIZE is set but RANK is not"):
        rank_layout(env=env)


class FakeGroup:
    """``torch.distributed`` as DistributedSampler asks it: initialised, rank 1 of 2."""

    def __init__(self, rank: int = 1, world_size: int = 2, initialised: bool = True) -> None:
        self.rank, self.world_size, self.initialised = rank, world_size, initialised

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialised

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.world_size


def test_an_initialised_process_group_comes_before_the_environment(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed", FakeGroup())
    # the group tells the layout; a half-set environment beside it is no error
    assert rank_layout(env={"WORLD_SIZE": "2"}) == RankLayout(1, 2, 1, 2, "torch.distributed")
    assert rank_layout(env={"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}) == RankLayout(1, 2, 0, 1, "torch.distributed")
    assert rank_layout(0, 1, env={}) == RankLayout(0, 1, 0, 1, "explicit")
    monkeypatch.setitem(sys.modules, "torch.distributed", FakeGroup(initialised=False))
    assert rank_layout(env={}) == RankLayout(0, 1, 0, 1, "single")


def test_a_loader_made_before_the_group_follows_it_and_its_sampler_sets_the_epoch(monkeypatch):
    from cupy_nwt import DataLoader

    loader = DataLoader(np.arange(40), batch_size=4, shuffle=True, device="cpu")  # rank 0 of 1, a drawn seed
    full = len(loader)
    monkeypatch.setitem(sys.modules, "torch.distributed", FakeGroup(1, 2))  # then Trainer.fit initialised the group
    assert (len(loader), full) == (5, 10) and (loader.rank, loader.world_size) == (1, 2)
    assert loader.seed == 0  # what every rank without a communicator uses
    loader.sampler.set_epoch(3)  # where Lightning calls DistributedSampler.set_epoch
    assert loader.epoch == 3
    pinned = DataLoader(np.arange(40), batch_size=4, rank=0, world_size=1, device="cpu")
    assert len(pinned) == 10  # rank= and world_size= given: kept
