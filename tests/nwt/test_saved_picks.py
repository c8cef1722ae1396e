"""The saved-pick store read back as an operator might leave it, and picks that agree.

Each damaged or hostile store is refused the same way: set aside as ``num_workers.json.bad-<time>``
with one warning naming the file and why, then a miss (``num_workers="auto"`` tunes online), or one
``CupyNwtError`` for a caller that asked not to search. A saved pick is replaced only by one faster
beyond both measurements' uncertainty.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import subprocess
import sys

import numpy as np
import pytest

from cupy_nwt.data.datasets import ArrayDataset
from cupy_nwt.errors import CupyNwtError
from cupy_nwt.nwt.trials import Measurement
from cupy_nwt.nwt.tune import tune_num_workers
from cupy_nwt.picks import pick
from cupy_nwt.picks.store import STORE_FORMAT, ResultStore, TuneResult, lookup

DATA = ArrayDataset(np.zeros((64, 4, 4, 3), np.uint8), np.arange(64) % 10)


def _measure(scale: float = 1.0, err: float = 0.005):
    return lambda w, i, u: Measurement(scale * [1.0, 0.5, 0.4][min(w, 2)] * (1 + 0.1 * max(0, w - 2)),
                                       1.0, None, None, err)


def _tuned(scale: float = 1.0, err: float = 0.005, data=DATA) -> TuneResult:
    return tune_num_workers(data, batch_size=8, max_workers=3, iterations=8, strategy="fast", device="cpu",
                            progress=False, measure=_measure(scale, err))


def _fp():
    return _tuned().fingerprint


@pytest.fixture
def saved(tmp_path):
    """A store holding one good pick; returns (its path, the stored document)."""
    r = _tuned()
    path = r.save(cache_dir=tmp_path)
    return path, json.loads(path.read_text())


def _record(doc):
    (rec,) = doc["results"].values()
    return rec


def _edit(key: str, value):
    def edit(doc):
        _record(doc)[key] = value
        return json.dumps(doc)
    return edit


def _nested(doc):
    return '{"format": "%s", "results": %s%s}' % (STORE_FORMAT, "[" * 100000, "]" * 100000)


def _infinity(doc):
    text = re.sub(r'"best_workers": \d+', '"best_workers": Infinity', json.dumps(doc))
    assert "Infinity" in text
    return text


HOSTILE = {
    "garbage bytes": (lambda doc: b"\xff\xfe\x00\x9c garbage \x00", "not UTF-8"),
    "a record that is a string": (lambda doc: json.dumps({"format": STORE_FORMAT, "results": {"k": "oops"}}),
                                  "is a str, not an object"),
    "best_workers lots": (_edit("best_workers", "lots"), "best_workers must be a whole number"),
    "best_workers Infinity": (_infinity, "Infinity is not a number JSON allows"),
    "deeply nested JSON": (_nested, "nested deeper"),
    "best_workers 10**30": (_edit("best_workers", 10**30), "best_workers must be 0..1024"),
    "best_workers 100000": (_edit("best_workers", 100000), "best_workers must be 0..1024"),
    "best_workers -5": (_edit("best_workers", -5), "best_workers must be 0..1024"),
    "best_workers true": (_edit("best_workers", True), "best_workers must be a whole number"),
    "worker_type rm -rf /": (_edit("worker_type", "rm -rf /"), "worker_type must be one of"),
    "throughput NaN": (_edit("samples_per_second", float("nan")), "NaN is not a number JSON allows"),
    "throughput negative": (_edit("samples_per_second", -3.0), "samples_per_second must be a finite number >= 0"),
    "throughput a string": (_edit("samples_per_second", "fast"), "samples_per_second must be a number"),
    "uncertainty NaN": (_edit("rel_error", float("nan")), "NaN is not a number JSON allows"),
    "uncertainty negative": (_edit("rel_error", -0.1), "rel_error must be a finite number >= 0"),
    "uncertainty a string": (_edit("rel_error", "small"), "rel_error must be a number"),
    "a trial with a string time": (lambda doc: (_record(doc)["runs"][0].update(seconds_per_iteration="1")
                                                or json.dumps(doc)), "runs[0].seconds_per_iteration"),
    "a fingerprint with a list device": (lambda doc: (_record(doc)["fingerprint"]["work"].update(device=["cpu"])
                                                      or json.dumps(doc)), "fingerprint.work.device"),
}


def _write(path, content) -> None:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())


def _aside(path):
    return sorted(path.parent.glob(path.name + ".bad-*"))


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_bad_store_is_set_aside_with_one_warning_and_counts_as_a_miss(case, saved, tmp_path, caplog):
    path, doc = saved
    make, why = HOSTILE[case]
    _write(path, make(doc))
    caplog.set_level(logging.WARNING, logger="cupy_nwt.tuner")
    assert pick.saved_pick(_fp(), cache_dir=tmp_path) is None  # a miss: the loader tunes online
    _tuned().save_pick(tmp_path)  # what settles next is saved in a fresh store
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    line = warnings[0].getMessage()
    assert str(path) in line and why in line and "\n" not in line
    assert len(_aside(path)) == 1
    assert TuneResult.from_dict(_record(json.loads(path.read_text()))).best_workers == 2  # the new store is sound


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_caller_that_will_not_search_gets_one_cupy_nwt_error(case, saved, tmp_path):
    path, doc = saved
    make, why = HOSTILE[case]
    _write(path, make(doc))
    with pytest.raises(CupyNwtError, match=re.escape(why)) as info:
        lookup(_fp(), tmp_path, strict=True)
    assert str(path) in str(info.value) and "set aside" in str(info.value)
    assert not path.exists() and len(_aside(path)) == 1


def test_a_saved_result_file_that_does_not_validate_names_the_file(tmp_path):
    p = _tuned().save(tmp_path / "r.json")
    doc = json.loads(p.read_text())
    doc["best_workers"] = 10**30
    p.write_text(json.dumps(doc))
    with pytest.raises(CupyNwtError, match=f"{p}: best_workers must be 0..1024, got a 31-digit number"):
        TuneResult.load(p)
    p.write_bytes(b"\x00\xff")
    with pytest.raises(CupyNwtError, match=f"{p}: not UTF-8"):
        TuneResult.load(p)


def test_a_good_store_from_before_throughputs_were_kept_still_reads(saved, tmp_path, caplog):
    path, doc = saved
    for key in ("samples_per_second", "rel_error", "main_process", "usable_cpus", "search_end"):
        del _record(doc)[key]
    path.write_text(json.dumps(doc))
    assert lookup(_fp(), tmp_path).best_workers == 2
    assert not _aside(path) and not caplog.records


_SAVER = """
import sys
sys.path.insert(0, sys.argv[3])
import numpy as np
from test_saved_picks import _tuned
from cupy_nwt.data.datasets import ArrayDataset
for i in range(int(sys.argv[4])):
    data = ArrayDataset(np.zeros((64, 4, 4, int(sys.argv[2]) * 100 + i + 1), np.uint8), np.arange(64) % 10)
    _tuned(data=data).save(cache_dir=sys.argv[1])
"""


def test_two_processes_saving_picks_at_once_both_land(tmp_path):
    here = str(__import__("pathlib").Path(__file__).parent)
    procs = [subprocess.Popen([sys.executable, "-c", _SAVER, str(tmp_path), str(k), here, "8"]) for k in range(2)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    records = ResultStore(tmp_path).records()
    sizes = sorted(r["fingerprint"]["work"]["sample_bytes"] for r in records.values())
    assert sizes == sorted(16 * (k * 100 + i + 1) + 8 for k in range(2) for i in range(8))  # + the int64 label
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.bad-*"))


# ---------------------------------------------------------------- picks that agree


def _on(curve, max_workers: int = 3, err: float = 0.005) -> TuneResult:
    """A search over ``curve`` (seconds per batch by count) for DATA's fingerprint."""
    return tune_num_workers(DATA, batch_size=8, max_workers=max_workers, iterations=100, strategy="fast",
                            device="cpu", progress=False,
                            measure=lambda w, i, u: Measurement(curve[w], curve[w] * (i + u), None, None, err))


def test_the_same_count_found_again_keeps_the_saved_pick(tmp_path):
    first = _tuned(scale=1.0)
    assert first.save_pick(tmp_path).replaced
    assert first.best_workers == 2 and first.samples_per_second == pytest.approx(8 / 0.4) and first.rel_error
    out = _tuned(scale=0.8).save_pick(tmp_path)  # everything faster today, the same best count
    assert not out.replaced and out.in_force == first and "same count" in out.reason


def test_a_search_that_measured_the_saved_count_judges_it_in_its_own_trials(tmp_path):
    """The saved figure came from another day; the new search measured both counts under the same conditions."""
    first = _on([1.0, 0.5, 0.4])
    first.save_pick(tmp_path)
    close = _on([1.0, 0.395, 0.4])  # 1 is 1.3% faster than 2 in this search: within the tolerance
    assert close.best_workers == 1
    out = close.save_pick(tmp_path)
    assert not out.replaced and "kept the saved pick 2" in out.reason and lookup(first.fingerprint, tmp_path) == first
    clear = _on([1.0, 0.5, 0.6])  # 2 is now 20% slower than 1, by the same search: beyond any doubt
    assert clear.best_workers == 1 and clear.save_pick(tmp_path).replaced
    assert lookup(first.fingerprint, tmp_path) == clear
    vague = _on([1.0, 1.0, 0.9], err=0.2)  # 2 now beats the saved 1 by 10%, but each figure is +-20%
    assert vague.best_workers == 2 and not vague.save_pick(tmp_path).replaced


def test_a_search_that_did_not_measure_the_saved_count_compares_throughputs(tmp_path):
    first = _on([1.0, 0.5, 0.4])
    first.save_pick(tmp_path)
    assert not _on([1.0, 0.399], max_workers=2).save_pick(tmp_path).replaced  # 0.25% faster than the saved 2
    faster = _on([1.0, 0.3], max_workers=2)  # counts 0 and 1 only; 1 at 33% above the saved figure for 2
    assert faster.save_pick(tmp_path).replaced and lookup(first.fingerprint, tmp_path) == faster


def test_a_search_a_busy_neighbour_made_unreliable_does_not_replace_a_reliable_pick(tmp_path):
    """The new search finds 1 worker 20% faster than the saved 2, but its trials of 1 ran beside a neighbour
    (the search says its pick is unreliable): the saved pick, measured on a quiet machine, stays."""
    first = _on([1.0, 0.5, 0.4])
    assert first.warning is None and first.save_pick(tmp_path).replaced
    busy = tune_num_workers(DATA, batch_size=8, max_workers=3, iterations=100, strategy="fast", device="cpu",
                            progress=False, measure=lambda w, i, u: Measurement(
                                [1.0, 0.5, 0.6][w], [1.0, 0.5, 0.6][w] * (i + u), None, None, 0.005,
                                other_cpus=1.0 if w == 1 else 0.0))
    assert busy.best_workers == 1 and busy.warning is not None
    out = busy.save_pick(tmp_path)
    assert not out.replaced and "unreliable" in out.reason and lookup(first.fingerprint, tmp_path) == first


def test_another_machine_or_pipeline_is_saved_beside_the_pick(tmp_path):
    first = _tuned()
    first.save_pick(tmp_path)
    slower = _tuned(scale=2.0)
    machine = dataclasses.replace(slower.fingerprint.machine, usable_cpus=slower.fingerprint.machine.usable_cpus + 1)
    moved = dataclasses.replace(slower, fingerprint=dataclasses.replace(slower.fingerprint, machine=machine))
    assert moved.save_pick(tmp_path).replaced
    assert lookup(first.fingerprint, tmp_path) == first and lookup(moved.fingerprint, tmp_path) == moved


def test_cli_tune_twice_keeps_the_first_pick_and_says_so(tmp_path, monkeypatch, capsys):
    from cupy_nwt import cli  # noqa: PLC0415

    scale = [1.0]

    class Loader:  # stands in for the real loader's trials: the second run measures 1% faster, the same best
        def __init__(self, dataset, **kwargs):
            pass

        def __call__(self, workers, iterations, warmup):
            return _measure(scale[0])(workers, iterations, warmup)

    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("cupy_nwt.nwt.measure.LoaderMeasure", Loader)
    path = tmp_path / "d.npy"
    np.save(path, np.zeros((64, 4), np.float32))
    argv = ["tune", "--dataset", str(path), "--batch-size", "8", "--iterations", "8", "--device", "cpu",
            "--no-progress", "--max-workers", "3"]
    assert cli.main(argv) == 0
    assert "saved to" in capsys.readouterr().out
    scale[0] = 0.99
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "the saved pick is the same count (2)" in out


def test_saving_onto_a_folder_or_under_a_file_names_the_path(tmp_path):
    result = _tuned()
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("hello")
    with pytest.raises(CupyNwtError, match=r"^path .*folder is a directory, not a file$"):
        result.save(tmp_path / "folder")
    with pytest.raises(CupyNwtError, match=r"^path .*file.txt/sub: .*file.txt is a file, not a folder$"):
        result.save(tmp_path / "file.txt" / "sub" / "r.json")
    with pytest.raises(CupyNwtError, match=r"^cache_dir .*file.txt: .*file.txt is a file, not a folder$"):
        result.save(cache_dir=tmp_path / "file.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "folder"]


@pytest.mark.parametrize("fp", ["x", None])
def test_lookup_and_load_name_an_argument_of_the_wrong_type(fp):
    with pytest.raises(CupyNwtError, match=rf"^fp must be a Fingerprint \(a TuneResult's .fingerprint\), got {fp!r}$"):
        lookup(fp)
    with pytest.raises(CupyNwtError, match=r"^path must be a path \(str or os.PathLike\), got None$"):
        TuneResult.load(None)
