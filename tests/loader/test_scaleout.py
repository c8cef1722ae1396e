"""One loader per rank: sharding, layout from the environment, device per rank, tuning once per node.

The first half runs ranks side by side in this process (explicit ``rank=``/``world_size=``, or the
launcher's variables set by monkeypatch). The second half launches real ranks with torchrun (the CPU
build of PyTorch) running ``launch_rank.py``; it skips with a reason where torchrun is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import psutil
import pytest
from launch_rank import Indexed, tag_seed

from cupy_nwt import DataLoader, cuda, system
from cupy_nwt.errors import LayoutError
from cupy_nwt.loader import LoaderParts
from cupy_nwt.loader.device.place import resolve_device
from cupy_nwt.loader.ring.ring import live_segments
from cupy_nwt.picks.pick import auto_fingerprint
from cupy_nwt.picks.store import ResultStore, TuneResult
from cupy_nwt.ranks import RankLayout

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID")


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    """These tests set the launcher's variables themselves (pytest may itself run under one)."""
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)


def epoch_indices(**kw) -> list[list[int]]:
    """Labels (= sample indices) each of two epochs delivers, and check the transform saw every batch."""
    n = kw.pop("n", 103)
    with DataLoader(Indexed(n), batch_size=kw.pop("batch_size", 8), device="cpu", batch_transform=tag_seed,
                    **kw) as dl:
        return [[i for _, labels, _ in dl for i in labels.tolist()] for _ in range(2)]


def transform_seeds(**kw) -> list[int]:
    with DataLoader(Indexed(kw.pop("n", 103)), batch_size=8, device="cpu", batch_transform=tag_seed, **kw) as dl:
        return [int(s[0]) for _, _, s in dl]


def check_shards(shards: list[list[int]], n: int, drop_last: bool, batch_size: int = 8) -> None:
    """DistributedSampler's promises for one epoch: equal counts, disjoint, complete (or only tails dropped)."""
    world = len(shards)
    assert len({len(s) for s in shards}) == 1, [len(s) for s in shards]
    together = [i for s in shards for i in s]
    if drop_last:  # the n % world tail of the order, then each rank's short last batch
        assert len(set(together)) == len(together) == world * ((n // world) // batch_size * batch_size)
    else:
        assert set(together) == set(range(n))
        assert len(together) - n == -n % world  # the padding: wrapped-around repeats, fewer than world


# ---------------------------------------------------------------- ranks side by side, in this process


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
def test_rank_shards_are_equal_disjoint_and_complete_every_epoch(world, drop_last, shuffle):
    n = 103
    runs = [epoch_indices(n=n, shuffle=shuffle, seed=5, drop_last=drop_last, rank=r, world_size=world)
            for r in range(world)]
    for epoch in range(2):
        check_shards([run[epoch] for run in runs], n, drop_last)
    assert (runs[0][0] != runs[0][1]) == shuffle  # a new permutation per epoch, the same one on every rank
    if not shuffle:
        assert runs[1][0][:3] == [1, 1 + world, 1 + 2 * world]  # sharded even in order
    lengths = {len(DataLoader(Indexed(n), batch_size=8, drop_last=drop_last, rank=r, world_size=world, device="cpu"))
               for r in range(world)}
    assert len(lengths) == 1


def test_padding_is_documented_count_of_repeats():
    dl = DataLoader(Indexed(10), batch_size=4, rank=2, world_size=4, device="cpu")
    assert dl.sampler.samples == 3 and dl.sampler.padding == 2 and len(dl) == 1
    assert [i for _, y in dl for i in y.tolist()] == [2, 6, 0]  # 0 is padding: rank 0 also has it
    dropped = DataLoader(Indexed(10), batch_size=4, drop_last=True, rank=2, world_size=4, device="cpu")
    assert dropped.sampler.samples == 2 and dropped.sampler.padding == 0 and len(dropped) == 0


def test_a_rank_sees_the_same_batches_with_any_num_workers_and_its_own_transform_seeds():
    kw = dict(shuffle=True, seed=11, rank=1, world_size=3)
    assert epoch_indices(num_workers=2, **kw) == epoch_indices(num_workers=0, **kw)
    seeds = transform_seeds(num_workers=2, **kw)
    assert seeds == transform_seeds(num_workers=0, **kw)
    other = transform_seeds(num_workers=0, **{**kw, "rank": 2})
    assert not set(seeds) & set(other)  # ranks augment differently
    assert transform_seeds(seed=11, shuffle=True) == transform_seeds(seed=11, shuffle=True, rank=0, world_size=1)


def test_layout_comes_from_the_launcher_and_explicit_arguments_win(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    dl = DataLoader(Indexed(30), batch_size=4, device="cpu")
    assert (dl.rank, dl.world_size, dl.rank_layout.launcher) == (2, 3, "torchrun")
    assert [i for _, y in dl for i in y.tolist()] == list(range(2, 30, 3))
    explicit = DataLoader(Indexed(30), batch_size=4, device="cpu", rank=0, world_size=1)
    assert (explicit.rank, explicit.world_size, len(explicit)) == (0, 1, 8)
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(LayoutError, match="RANK is set but WORLD_SIZE is not"):
        DataLoader(Indexed(30), device="cpu")
    with pytest.raises(LayoutError, match="rank= and world_size="):
        DataLoader(Indexed(30), device="cpu", rank=1)
    with pytest.raises(LayoutError, match="rank=3 is outside"):
        DataLoader(Indexed(30), device="cpu", rank=3, world_size=3)
    with pytest.raises(ValueError, match="rank must be an integer"):
        DataLoader(Indexed(30), device="cpu", rank="0", world_size=1)


def fake_torch_distributed(world: int, rank: int):
    """Stands in for an initialised torch.distributed whose collectives would wait for every rank."""
    def broadcast_object_list(box, src):
        raise AssertionError("a collective from a loader: a loader made on one rank alone would hang here")

    return types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                 get_world_size=lambda: world, get_rank=lambda: rank,
                                 broadcast_object_list=broadcast_object_list)


def test_seed_none_on_several_ranks_is_zero_without_asking_the_others(monkeypatch, tmp_path):
    assert DataLoader(Indexed(8), device="cpu", rank=1, world_size=2).seed == 0
    monkeypatch.setitem(sys.modules, "torch.distributed", fake_torch_distributed(2, 1))
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))
    assert DataLoader(Indexed(8), device="cpu", rank=1, world_size=2).seed == 0
    assert DataLoader(Indexed(8), device="cpu", rank=1, world_size=2, seed=4).seed == 4
    grouped = DataLoader(Indexed(8), device="cpu")  # the initialised group tells the layout, as DistributedSampler asks it
    assert (grouped.rank, grouped.world_size, grouped.seed) == (1, 2, 0)
    auto = DataLoader(Indexed(64), batch_size=8, device="cpu", num_workers="auto")  # reads its store, asks no one
    assert auto.num_workers >= 0
    auto.close()


def test_device_per_rank_and_device_argument(monkeypatch):
    with pytest.raises(ValueError, match="cuda:N"):
        DataLoader(Indexed(8), device="gpu1")
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 2))
    layout = RankLayout(5, 8, 3, 4, "torchrun")
    assert resolve_device("cuda", layout) == ("cuda", 1)  # local rank 3 % 2 GPUs
    assert resolve_device("auto", layout) == ("cuda", 1)
    assert resolve_device("cuda:0", layout) == ("cuda", 0)
    assert resolve_device("cpu", layout) == ("cpu", None)
    with pytest.raises(ValueError, match="sees 2 CUDA device"):
        resolve_device("cuda:2", layout)


def test_cuda_index_without_a_gpu_says_why(monkeypatch):
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(False, "no usable GPU: test"))
    with pytest.raises(cuda.NoGPUError, match="test"):
        DataLoader(Indexed(8), device="cuda:0")
    assert DataLoader(Indexed(8), device="auto", rank=1, world_size=2).device_id is None


def test_every_cuda_call_of_a_rank_loader_runs_on_its_device():
    """Stand-in CUDA (test_prefetch's lazy streams, two GPUs) that notes the current device at every call."""
    from test_prefetch import LazyCuda

    current = [0]
    calls: list[tuple[str, int]] = []

    class Noting(LazyCuda):
        def __getattribute__(self, name):
            if name in ("current_stream", "new_stream", "record", "wait", "empty", "h2d", "register", "pinned"):
                calls.append((name, current[0]))
            return super().__getattribute__(name)

        @contextlib.contextmanager
        def device_scope(self, device):
            before, current[0] = current[0], device
            try:
                yield
            finally:
                current[0] = before

    ops = Noting()
    kw = dict(batch_size=8, shuffle=True, seed=3, rank=1, world_size=2)
    ref = [y.tolist() for _, y in DataLoader(Indexed(40), device="cpu", **kw)]
    dl = DataLoader(Indexed(40), num_workers=1, device="cuda", pin_memory=True, multiprocessing_context="fork",
                    parts=LoaderParts(ops=ops), output="cupy", **kw)
    assert dl.device_id == 1  # local rank 1 of 2 stand-in GPUs
    got = []
    with dl:
        for batch in dl:
            assert current[0] == 0  # the caller's device between batches
            got.append(ops.consume(batch)[1].tolist())
    assert got == ref
    assert {n for n, _ in calls} >= {"register", "new_stream", "empty", "h2d", "wait"}
    assert {d for _, d in calls} == {1}


@pytest.mark.gpu
def test_each_rank_loads_onto_its_own_gpu_and_leaves_the_current_device_alone():
    count = cuda.device_count()
    before = cuda.current_device()
    rank = count - 1  # local rank count-1 of count ranks: the last GPU (GPU 0 on a one-GPU machine)
    ref = epoch_indices(n=64, shuffle=True, seed=2, rank=rank, world_size=count)[0]
    for kw in (dict(device="cuda"), dict(device=f"cuda:{rank}")):
        with DataLoader(Indexed(64), batch_size=8, shuffle=True, seed=2, rank=rank, world_size=count,
                        num_workers=1, pin_memory=True, batch_transform=tag_seed, output="cupy", **kw) as dl:
            assert dl.device_id == rank
            got = []
            for images, labels, _ in dl:
                assert images.device.id == labels.device.id == rank
                assert cuda.current_device() == before  # the caller's device between batches
                got += cuda.as_numpy(labels).tolist()
        assert got == ref


# ---------------------------------------------------------------- num_workers="auto" per node


def _as_rank(monkeypatch, rank: int, local_world_size: int, cpus: int) -> None:
    """This process as rank ``rank`` of a torchrun launch with ``local_world_size`` ranks on a ``cpus``-CPU node."""
    for name, value in (("RANK", rank), ("WORLD_SIZE", 8), ("LOCAL_RANK", rank % local_world_size),
                        ("LOCAL_WORLD_SIZE", local_world_size)):
        monkeypatch.setenv(name, str(value))
    monkeypatch.setattr("cupy_nwt.ranks.usable_cpus", lambda: cpus)


def test_auto_tunes_online_within_the_rank_budget_and_keys_by_local_world_size(tmp_path, monkeypatch):
    """A miss tunes online within the rank's share of the node's CPUs less its own main process (the old
    search's counts 0 .. share-1), from half of it; a share of one CPU means 0 workers, as the search's
    only count did; the pick is keyed by how many ranks share the node."""
    def search(*args, **kwargs):
        raise AssertionError("num_workers='auto' ran the offline search")

    monkeypatch.setattr("cupy_nwt.nwt.tune.tune_num_workers", search)
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))
    for rank, local, cpus, budget, start in ((1, 4, 8, 1, 1), (5, 2, 16, 7, 4), (0, 1, 8, 7, 4)):
        _as_rank(monkeypatch, rank, local, cpus)
        with DataLoader(Indexed(64), batch_size=8, num_workers="auto", device="cpu", seed=0) as dl:
            (start_decision,) = dl.decisions
            assert dl.num_workers == start == start_decision.workers
            assert f"budget {budget} workers" in start_decision.reason
            assert "tuning online" in dl.stats().num_workers_why
    _as_rank(monkeypatch, 2, 4, 4)  # 4 CPUs shared by 4 ranks: one each, for the rank's main process
    with DataLoader(Indexed(64), batch_size=8, num_workers="auto", device="cpu", seed=0) as dl:
        assert dl.num_workers == 0 and dl.decisions == ()
        assert "its main process makes the batches (0 workers)" in dl.stats().num_workers_why
        assert len(list(dl)) == 1  # its shard: 64 samples over 8 ranks, one batch
    keys = {auto_fingerprint(Indexed(64), batch_size=8, device="cpu", layout=RankLayout(r, 8, r % n, n, "torchrun"))
            .work.local_world_size for r, n in ((1, 4), (6, 4), (0, 1))}
    assert keys == {1, 4}


_SAVER = """
import sys
from cupy_nwt.picks.pick import OnlinePick, auto_fingerprint
from cupy_nwt.ranks import RankLayout
sys.path.insert(0, sys.argv[2])
from launch_rank import Indexed

fp = auto_fingerprint(Indexed(64), batch_size=8, device="cpu", layout=RankLayout(0, 4, 0, 4, "torchrun"))
pick = OnlinePick(fp, 8, 2, False, "process")
for i in range(20):
    pick.save(1 + int(sys.argv[1]) % 2, steps=16, elapsed_s=0.1 * (1 + i % 3), wait_s=0.01, budget=2,
              search_end="online: a rank of a node saving at once")
"""


def test_ranks_of_one_node_saving_their_online_picks_at_once_leave_one_sound_pick(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}, "CUPY_NWT_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", _SAVER, str(r), str(HERE)], env=env) for r in range(4)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    (record,) = ResultStore(tmp_path).records().values()  # one key: the same machine, work and node layout
    saved = TuneResult.from_dict(record)
    assert saved.strategy == "online" and saved.best_workers in (1, 2)
    assert not list(tmp_path.glob("*.tmp*")) and not list(tmp_path.glob("*.bad-*"))


# ---------------------------------------------------------------- real ranks under torchrun


def _torchrun() -> str | None:
    local = Path(sys.executable).with_name("torchrun")
    return str(local) if local.is_file() else shutil.which("torchrun")


TORCHRUN = _torchrun()
needs_torchrun = pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed (pip install torch for it)")


def launch(out: Path, nproc: int, *args: str, expect_ok: bool = True) -> list[dict]:
    """Run launch_rank.py on ``nproc`` ranks with torchrun; the per-rank records it wrote."""
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(CUPY_NWT_CACHE_DIR=str(out.parent / "cache"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", "--monitor-interval=0.1",
           str(HERE / "launch_rank.py"), "--out", str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if not expect_ok:
        assert proc.returncode != 0
        return []
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def check_run(records: list[dict], n: int, drop_last: bool, seed: int, launcher: str = "torchrun") -> None:
    world = len(records)
    assert [r["layout"]["rank"] for r in records] == list(range(world))
    assert {r["layout"]["launcher"] for r in records} == {launcher}
    assert {r["layout"]["local_world_size"] for r in records} == {world}
    assert len({r["batches"] for r in records}) == 1
    for epoch in range(2):
        check_shards([r["epochs"][epoch] for r in records], n, drop_last)
    for r in records:  # exactly what an in-process loader with explicit rank/world_size delivers
        assert r["epochs"] == epoch_indices(n=n, shuffle=True, seed=seed, drop_last=drop_last,
                                            rank=r["layout"]["rank"], world_size=world)


@needs_torchrun
def test_two_ranks_under_torchrun_shard_alike_across_runs_and_worker_counts(tmp_path):
    with_workers = launch(tmp_path / "a", 2, "--workers", "1", "--samples", "101")
    check_run(with_workers, 101, drop_last=False, seed=7)
    assert [r["num_workers"] for r in with_workers] == [1, 1] and all(r["worker_pids"] for r in with_workers)
    inline = launch(tmp_path / "b", 2, "--workers", "0", "--samples", "101")
    assert [r["epochs"] for r in inline] == [r["epochs"] for r in with_workers]
    assert [r["transform_seeds"] for r in inline] == [r["transform_seeds"] for r in with_workers]


@needs_torchrun
def test_three_ranks_starting_together_tune_online_save_one_pick_and_reuse_it(tmp_path):
    args = ("--workers", "auto", "--quick-online", "--samples", "101", "--drop-last", "--also-seed-none")
    first = launch(tmp_path / "a", 3, *args, "--gloo")
    tuned = [r["why"].startswith("no saved pick for this machine and work") for r in first]  # tunes online
    assert any(tuned)  # and a rank starting after another saved (each reads its node's store) may take that pick
    check_run(first, 101, drop_last=True, seed=7, launcher="torch.distributed")  # the initialised group decides
    budget = max(1, system.usable_cpus() // 3 - 1)  # each rank's share of the node, less its main process
    assert all(1 <= r["num_workers"] <= budget for r in first)
    assert {r["seed_none"] for r in first} == {0}  # DistributedSampler's seed, asked of no other rank
    saved = list(ResultStore(tmp_path / "cache").records().values())
    assert [r["fingerprint"]["work"]["local_world_size"] for r in saved] == [3]  # one pick for the node
    assert saved[0]["strategy"] == "online" and saved[0]["max_workers"] == budget
    again = launch(tmp_path / "b", 3, *args)  # no process group this time: each rank reads the store
    assert all(not r["why"].startswith("no saved pick") for r in again)
    assert [r["epochs"] for r in again] == [r["epochs"] for r in first]
    assert {r["num_workers"] for r in again} == {saved[0]["best_workers"]}
    assert {r["seed_none"] for r in again} == {0}


RANK_0_ALONE = """
import datetime, json, os, sys

import torch.distributed as dist

import cupy_nwt

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
if rank == 0:  # the validation set, evaluated on rank 0 alone while the others wait at the barrier
    for kw in ({}, {"num_workers": "auto"}, {"rank": 0, "world_size": 1}):
        val = cupy_nwt.DataLoader(list(range(10)), batch_size=5, device="cpu", **kw)
        print(json.dumps([kw, val.seed, sorted(i for b in val for i in b.tolist())]), flush=True)
        val.close()
dist.barrier()
dist.destroy_process_group()
"""


@needs_torchrun
def test_a_loader_made_on_rank_0_alone_does_not_wait_for_the_other_ranks(tmp_path):
    """A script's rank-0 validation loader (YOLOv5-style): nothing in making or reading it is a collective,
    so rank 1's barrier is met at once; the loader used to broadcast its seed (and its saved pick) from
    ``__init__``, pairing rank 0's broadcast with rank 1's barrier until the group timed out."""
    (tmp_path / "val.py").write_text(RANK_0_ALONE)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(CUPY_NWT_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node=2", "--monitor-interval=0.1", "val.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    runs = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("[")]
    assert [r[0] for r in runs] == [{}, {"num_workers": "auto"}, {"rank": 0, "world_size": 1}]
    assert runs[0][1] == 0 and runs[0][2] == [0, 2, 4, 6, 8]  # rank 0's shard of 2, as documented
    assert runs[2][2] == list(range(10))  # read whole where the script says so


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@needs_torchrun
@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_failed_rank_leaves_no_segment_or_process_on_any_rank(tmp_path, how):
    out = tmp_path / "run"
    launch(out, 2, "--workers", "1", "--samples", "4000", "--fail", how, "--delay", "0.05", expect_ok=False)
    pids = [p for r in range(2) for p in json.loads((out / f"rank{r}.pids").read_text())]
    assert len(pids) >= 4  # two ranks, each with a worker and the resource tracker
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if not _gone(p)] == []
    assert [s for p in pids for s in live_segments(p)] == []


@needs_torchrun
@pytest.mark.slow  # builds the 50 000-image synthetic CIFAR-10 and tunes: about 15 s on 2 CPUs
def test_the_docs_torchrun_recipe_runs_as_written(tmp_path):
    section = (ROOT / "docs" / "several-gpus.md").read_text(encoding="utf-8")
    script = section.split("```python\n", 1)[1].split("```", 1)[0]
    commands = section.split("```bash\n", 1)[1].split("```", 1)[0]
    line = next(c for c in commands.splitlines() if c.startswith("torchrun --standalone"))
    argv = shlex.split(line.split("#", 1)[0])
    assert argv[-1] == "train.py"
    (tmp_path / "train.py").write_text(script, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(CUPY_NWT_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    proc = subprocess.run([TORCHRUN, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = sorted(x for x in proc.stdout.splitlines() if x.startswith("rank "))
    assert [x.split(":")[0] for x in lines] == ["rank 0 of 2", "rank 1 of 2"]
    assert lines[0].split(":")[1] == lines[1].split(":")[1]  # the same batches per epoch and workers on both


def test_scaleout_bench_sums_rank_rates_and_spans_the_wall_clock():
    spec = importlib.util.spec_from_file_location("bench_scaleout", ROOT / "bench" / "studies" / "does_it_scale_over_ranks" / "scaleout.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rank = dict(budget=1, num_workers=0, samples=100)
    one = bench.aggregate(1, 0, [{**rank, "budget": 2, "start": 0.0, "end": 1.0, "samples_per_second": 100.0}])
    two = bench.aggregate(2, 0, [{**rank, "start": 0.0, "end": 1.0, "samples_per_second": 100.0},
                                 {**rank, "start": 0.5, "end": 2.0, "samples_per_second": 200 / 3}])
    assert two["sum_samples_per_second"] == pytest.approx(100 + 200 / 3)
    assert two["wall_samples_per_second"] == pytest.approx(100.0)  # 200 samples from t=0 to t=2
    rows = bench.summarize_runs([one, two])
    assert [(r["ranks"], r["budget_per_rank"], r["workers_per_rank"]) for r in rows] == [(1, 2, [0]), (2, 1, [0])]
    assert rows[1]["speedup_vs_1_rank"] == pytest.approx((100 + 200 / 3) / 100)


# ---------------------------------------------------------------- real ranks under mpiexec (Open MPI + mpi4py)

MPIEXEC = shutil.which("mpiexec")
needs_mpi = pytest.mark.skipif(
    MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
    reason="mpiexec and mpi4py are not installed (apt-get install openmpi-bin libopenmpi-dev; pip install mpi4py)")


def mpi_launch(out: Path, nproc: int, *args: str) -> list[dict]:
    """Run launch_rank.py on ``nproc`` ranks with Open MPI's mpiexec; the per-rank records it wrote."""
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(CUPY_NWT_CACHE_DIR=str(out.parent / "cache"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [MPIEXEC, "-n", str(nproc), "--oversubscribe", sys.executable, str(HERE / "launch_rank.py"),
           "--out", str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@needs_mpi
def test_three_ranks_under_mpiexec_shard_tune_online_and_reuse_the_node_s_saved_pick(tmp_path):
    args = ("--workers", "auto", "--quick-online", "--samples", "101", "--also-seed-none")
    records = mpi_launch(tmp_path / "a", 3, *args)
    check_run(records, 101, drop_last=False, seed=7, launcher="openmpi")
    assert any(r["why"].startswith("no saved pick for this machine and work") for r in records)  # as above
    (saved,) = ResultStore(tmp_path / "cache").records().values()
    records = mpi_launch(tmp_path / "b", 3, *args)
    assert {r["num_workers"] for r in records} == {saved["best_workers"]}
    assert {r["seed_none"] for r in records} == {0}  # DistributedSampler's seed on every rank
