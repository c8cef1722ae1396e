"""bench/studies/what_does_the_loader_itself_cost/tiny_arrays.py: both sides may be source-tree folders (what a GPU machine, given no git history,
can carry), each measured with its own package; ``--workers`` chooses the loader's cells; bad input
gets one line and exit 2. Batch counts are tiny: these check the plumbing, not the figures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "studies" / "what_does_the_loader_itself_cost"))
    import tiny_arrays

    return tiny_arrays


@pytest.fixture
def before_tree(tmp_path) -> Path:
    """HEAD's ``cupy_nwt/`` by ``git archive``, stamped with its commit: as ``--prepare-before`` makes it."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs a git checkout of the project to archive the before tree from")
    tree = tmp_path / "before"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD", "cupy_nwt"], capture_output=True, check=True)
    subprocess.run(["tar", "x", "-C", str(tree)], input=archive.stdout, check=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    (tree / "REVISION").write_text(commit.stdout)
    return tree


TINY = ["--rounds", "2", "--repeats", "1", "--batches", "3", "--warmup", "1"]


def test_a_folder_before_and_after_each_measured_at_the_chosen_workers(tiny, before_tree, tmp_path, capsys):
    out = tmp_path / "tiny.json"
    assert tiny.main(["--before", str(before_tree), "--after", str(ROOT), "--workers", "0,1", *TINY,
                      "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["before"] == (before_tree / "REVISION").read_text().strip()  # the stamped commit, not a path
    assert result["after"] == str(ROOT)  # no stamp: the folder itself
    assert result["folders"] == {"before": str(before_tree), "after": str(ROOT)}
    assert result["workers"] == [0, 1]
    rows = {r["cell"]: r for r in result["cells"]}
    assert list(rows) == ["cupy_nwt/w0", "cupy_nwt/w1", "floor/w0"]
    for cell in ("cupy_nwt/w0", "cupy_nwt/w1"):
        assert len(rows[cell]["before"]) == len(rows[cell]["after"]) == 2  # one figure a round
        assert all(v > 0 for v in rows[cell]["before"] + rows[cell]["after"]) and rows[cell]["ratio"] > 0
    assert "round 2/2: after" in capsys.readouterr().err
    assert not list(before_tree.rglob("tiny_arrays.json"))  # the folders are measured, not written into


def test_each_side_runs_its_own_package(tiny, before_tree, tmp_path):
    """A before tree whose loader cannot import fails the run, naming that tree: it was its package that ran."""
    (before_tree / "cupy_nwt" / "loader" / "__init__.py").write_text("raise ImportError('the before tree')\n")
    with pytest.raises(SystemExit, match=rf"cupy_nwt w=0 failed in {before_tree}"):
        tiny.main(["--before", str(before_tree), "--after", str(ROOT), "--workers", "0", *TINY,
                   "--out", str(tmp_path / "tiny.json")])


def test_revisions_still_get_worktrees_of_their_own(tiny, tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout of the project")
    out = tmp_path / "tiny.json"
    assert tiny.main(["--before", "HEAD", "--after", "HEAD", "--rounds", "1", "--repeats", "1", "--batches", "2",
                      "--warmup", "0", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["before"] == result["after"] and len(result["before"]) == 40 and result["folders"] == {}
    assert [r["cell"] for r in result["cells"]] == ["cupy_nwt/w0", "cupy_nwt/w2", "floor/w0"]  # the default 0,2


@pytest.mark.parametrize(("text", "want"), [("0,8,15", (0, 8, 15)), ("2", (2,)), (" 4, 1", (4, 1))])
def test_workers_parse(tiny, text, want):
    assert tiny.parse_workers(text) == want


@pytest.mark.parametrize(("argv", "words"), [
    (["--workers", "0,eight"], "--workers takes whole numbers"),
    (["--workers", ""], "--workers takes whole numbers"),
    (["--workers", "0,-1"], "distinct numbers from 0 up"),
    (["--workers", "8,8"], "distinct numbers from 0 up"),
    (["--repeats", "0"], "--repeats"),
    ([], "--before is required"),
])
def test_bad_arguments_get_one_line_and_exit_2(tiny, argv, words, capsys):
    before = [] if not argv else ["--before", "HEAD"]
    assert tiny.main([*before, *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_a_folder_without_a_source_tree_is_one_line(tiny, tmp_path):
    with pytest.raises(SystemExit, match="holds no cupy_nwt/") as exc:
        tiny.main(["--before", str(tmp_path), "--after", str(ROOT)])
    assert "\n" not in str(exc.value)


def test_the_script_runs_as_the_gpu_run_starts_it(before_tree, tmp_path):
    """As ``bench/gpu_session.sh`` runs it: a script from the repository root with only the root on PYTHONPATH,
    not imported by pytest (whose path holds ``bench/`` already)."""
    out = tmp_path / "tiny.json"
    script = ROOT / "bench" / "studies" / "what_does_the_loader_itself_cost" / "tiny_arrays.py"
    proc = subprocess.run([sys.executable, str(script), "--before", str(before_tree), "--after", str(ROOT),
                           "--workers", "0", *TINY, "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["cell"] for r in json.loads(out.read_text())["cells"]] == ["cupy_nwt/w0", "floor/w0"]
