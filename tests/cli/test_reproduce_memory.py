"""``reproduce``'s memory figures measure the tuner's runs alone.

On a machine's first ``reproduce`` the synthetic CIFAR-10 was built in the main process, so every
trial's peak (main process + workers) carried the build's buffers, and the first run's figures were
not comparable with later ones. The build now runs in a process of its own.
"""

from __future__ import annotations

from cupy_nwt.cli.reproduce import ReproduceConfig, run_reproduce
from cupy_nwt.nwt.trials import Measurement


def test_the_synthetic_dataset_is_built_outside_the_process_that_measures(tmp_path, monkeypatch):
    def no_build_here(self, out, progress):
        raise AssertionError("the synthetic dataset was built in the process whose memory the trials measure")

    class FakeMeasure:
        def __init__(self, dataset, **kwargs):
            assert not dataset.built_now  # the main process opened a cache another process built

        def __call__(self, workers, iterations, warmup):
            t = [0.04, 0.02, 0.025, 0.03][workers]
            return Measurement(t, t * (iterations + warmup), 10**9 + workers * 10**7)

    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("cupy_nwt.data._synthetic.SyntheticCIFAR10._build_into", no_build_here)
    monkeypatch.setattr("cupy_nwt.nwt.measure.LoaderMeasure", FakeMeasure)
    config = ReproduceConfig(out_dir=tmp_path / "out", synthetic_n=64, batch_size=16, max_workers=4, iterations=8,
                             compare_iterations=8, compare_repeats=2, judge_repeats=2, gpu_experiments=False,
                             progress=False)
    first = run_reproduce(config)
    assert "separate process" in first.dataset_build and "separate process" in first.to_dict()["dataset_build"]
    again = run_reproduce(config)
    assert again.dataset_build.startswith("already built")


def test_cli_tune_builds_the_synthetic_dataset_apart_too(tmp_path, monkeypatch, capsys):
    from cupy_nwt import cli  # noqa: PLC0415

    def no_build_here(self, out, progress):
        raise AssertionError("the synthetic dataset was built in the process whose memory the trials measure")

    class Loader:
        def __init__(self, dataset, **kwargs):
            pass

        def __call__(self, workers, iterations, warmup):
            return Measurement(0.01, 0.01 * (iterations + warmup), 10**9)

    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("cupy_nwt.data._synthetic.SyntheticCIFAR10._build_into", no_build_here)
    monkeypatch.setattr("cupy_nwt.nwt.measure.LoaderMeasure", Loader)
    assert cli.main(["tune", "--synthetic-n", "64", "--batch-size", "16", "--iterations", "8", "--max-workers", "2",
                     "--device", "cpu", "--no-progress", "--no-save"]) == 0
    assert "pick:" in capsys.readouterr().out
