"""bench/workloads.py (loader_compare.py's, the other studies' and the suites' workloads) times no batch that the workers made during start-up.

On the H200, torch at 15 workers read 1,030,522 samples/s on PNG decode: its 30 timed batches were
the 15 x 2 its workers had queued while the first batch was awaited.
"""

from pathlib import Path

import pytest


@pytest.fixture
def loader_compare(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    from bench import workloads

    return workloads


@pytest.fixture
def study(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "is_the_loader_faster_than_torch"))
    import loader_compare

    return loader_compare


def test_the_warm_up_takes_every_batch_made_at_start_up(loader_compare):
    assert loader_compare.timed_after(3, 0) == 3
    assert loader_compare.timed_after(3, 15) == 3 + 15 * loader_compare.PREFETCH_FACTOR
    assert loader_compare.timed_after(1, 4, prefetch_factor=3) == 13


@pytest.mark.parametrize("args", [(0, 2), (3, -1), (3, 2, 0)])
def test_bad_warm_up_arguments_are_refused(loader_compare, args):
    with pytest.raises(ValueError, match="need warmup"):
        loader_compare.timed_after(*args)


@pytest.mark.parametrize("kind", ["cupy_nwt", "cupy_nwt-thread", "torch"])
def test_workers_persist_so_the_drained_warm_up_may_pass_an_epoch_end(loader_compare, study, kind, tmp_path):
    if kind == "torch":
        pytest.importorskip("torch", reason="the torch loader needs torch")
    workload = next(w for w in loader_compare.make_workloads(tmp_path, decode_images=8, array_images=64)
                    if w.name == "numba-array")
    loader = loader_compare.make_loader(kind, workload, 2, 16, "cpu", seed=0)
    try:
        assert loader.persistent_workers is True
        assert loader.prefetch_factor == loader_compare.PREFETCH_FACTOR
        run = None if kind != "cupy_nwt-thread" else study.measure(kind, workload, 2, 16, batches=4, warmup=1)
    finally:
        loader_compare.close_loader(loader)
    if run is not None:  # 64 samples = 4 batches an epoch: the 5 drained and 4 timed ones pass two epoch ends
        assert run.samples == 4 * 16


def test_the_stream_reads_on_past_an_epochs_end_reshuffled(loader_compare):
    """scaleout's ranks time 300 batches with it, more than one rank's shard holds."""
    from cupy_nwt import DataLoader

    loader = DataLoader(list(range(6)), batch_size=2, shuffle=True, seed=0, device="cpu")
    stream = loader_compare.endless(loader)
    first, second = [[int(x) for b in (next(stream) for _ in range(3)) for x in b] for _ in range(2)]
    stream.close()
    assert sorted(first) == sorted(second) == list(range(6)) and first != second  # two epochs, reshuffled


def test_a_bad_worker_list_in_the_environment_is_named(monkeypatch):
    """The suites read their worker counts from CUPY_NWT_BENCH_WORKERS at collection: a bad one names it."""
    from bench.workloads import default_workers

    monkeypatch.setenv("CUPY_NWT_BENCH_WORKERS", "0,two")
    with pytest.raises(ValueError, match=r"^CUPY_NWT_BENCH_WORKERS: workers must be comma-separated integers, got "):
        default_workers()
    monkeypatch.setenv("CUPY_NWT_BENCH_WORKERS", "4,0")
    assert default_workers() == [0, 4]
