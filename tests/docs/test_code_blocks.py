"""Every code block of the README and of every page in ``docs/`` runs here, as a reader would paste it,
so the manual cannot rot.

Each page's blocks run in order in a scratch folder of that page's own (a later block may use a file an
earlier one of the same page wrote), each in a fresh subprocess with this source tree first on
``PYTHONPATH``, the test interpreter's ``bin`` first on ``PATH`` (so ``cupy-nwt`` and ``python`` are this
installation's) and a private ``CUPY_NWT_CACHE_DIR`` that all pages share (a reader's cache is one too).
A block may be preceded by an HTML comment that says how it is tested:

``<!-- test: gpu -->``
    needs a GPU. Without one every command must still exit 3 with one line saying why (the CPU
    path, checked here), and the test then reports itself skipped for the GPU path. The test carries
    ``test_gpu_code_block``, marked ``gpu``, runs the block on a GPU machine (``pytest -m gpu``).
``<!-- test: gpu-session -->``
    ``bench/gpu_session.sh``'s commands: without a GPU they must refuse as a ``gpu`` block does; on a GPU
    they are not run here (minutes long, they are the GPU run itself, as ``docs/gpu.md`` says).
``<!-- test: file -->``
    a Python file named by its first line (``# path/name.py``): written, compiled, and used by a
    later block rather than run on its own.
``<!-- test: ci -->``
    the set-up commands: the block must be exactly what ``.ci/run`` runs, which is where they run.
``<!-- test: first-line REASON -->``
    only the first command runs on one machine; REASON says what the others need.
``<!-- test: shards.tar -->``
    the block reads ``shards.tar``: a small shard of the synthetic set is written first.
``<!-- test: setup-main -->``
    the main set-up command, run literally (a fresh venv and an install) in a copy of the tree.
``<!-- test: gate -->``
    commands with ``--nwt-throughput-drop``: against a stored baseline the gate judges exact counts only,
    so an unchanged rerun must pass (exit 0); with ``--nwt-against`` the clocks are judged too, and a
    shared machine may really run one side slower, so such a command may exit 1, but only with the gate's
    own verdict (``throughput gate FAILED``, each benchmark's ``fell`` or ``rose`` line).
``<!-- test: workflow -->``
    a GitHub Actions workflow (YAML): its install steps are checked for shape (valgrind's is run where
    valgrind is missing and this is root), and its gate step runs in a scratch git repository holding
    the README's ``bench/test_pipeline.py`` with a committed baseline (the one the README's gate block saved,
    where it ran first), its base branch as ``origin/main``.
``<!-- test: repo-root ... -->``
    the commands run in the repository root (with ``gpu``: they must refuse before writing anything).
``<!-- test: readme -->``
    a copy, in a docs page, of a README block: it must be that block verbatim, which is tested there.
``<!-- test: torch -->``
    needs PyTorch (it says so and how to get it in one line where it is missing): skipped without it.

A block without a comment simply runs and must exit 0. Every pytest a block starts gets ``SHORT_ROUNDS``
through ``PYTEST_ADDOPTS`` (pytest's own variable), so the suite does not spend a reader's rounds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cupy_nwt import cuda

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"(?:<!-- test: (?P<how>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
KNOWN = {"gpu", "gpu-session", "file", "ci", "first-line", "shards.tar", "setup-main", "repo-root", "gate", "readme", "workflow", "torch"}
README_MAX_LINES = 200
#: pytest in a block (the gate's commands) sizes its loader benchmarks' rounds within 3 s, not a reader's 15:
#: what is tested is that the commands run and what the gate says, which exact counts decide
SHORT_ROUNDS = "--nwt-max-seconds=3"


@dataclass(frozen=True)
class Block:
    page: str
    index: int
    line: int
    lang: str
    body: str
    how: tuple[str, ...]
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page}:L{self.line}-{self.lang}"

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


def page_blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    page = path.relative_to(ROOT).as_posix()
    blocks = []
    for i, m in enumerate(FENCE.finditer(text)):
        words = (m.group("how") or "").split()
        how = tuple(w for w in words if w in KNOWN)
        reason = " ".join(words[1:]) if how[:1] == ("first-line",) else ""
        blocks.append(Block(page, i, text.count("\n", 0, m.start("body")), m.group("lang"), m.group("body"),
                            how, reason))
    return blocks


BLOCKS = [block for path in PAGES for block in page_blocks(path)]


def commands(body: str) -> list[str]:
    """Command lines of a shell block, comments and blank lines left out."""
    return [ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def file_name(block: Block) -> str:
    m = re.match(r"# ([\w./-]+\.py)\b", block.body)
    assert m, f"{block.where}: a file block starts with '# name.py'"
    return m.group(1)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("docs")


@pytest.fixture
def workdir(scratch: Path, block: Block) -> Path:
    """The scratch folder of the block's page, made at its first block and kept for the page's later ones."""
    folder = page_folder(scratch, block.page)
    folder.mkdir(exist_ok=True)
    return folder


def page_folder(scratch: Path, page: str) -> Path:
    """Where a page's blocks run, beside the other pages' folders in the module's scratch folder."""
    return scratch / re.sub(r"\W", "-", page)


def environment(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if shutil.which("cupy-nwt", path=env["PATH"]) is None:
        env["PATH"] = os.pathsep.join([str(source_tree_command(workdir.parent)), env["PATH"]])
    env["CUPY_NWT_CACHE_DIR"] = str(workdir.parent / ".cache")
    env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} {SHORT_ROUNDS}".strip()
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        env.pop(var, None)
    return env


def source_tree_command(where: Path) -> Path:
    """A ``cupy-nwt`` on PATH where the package runs from the source tree, uninstalled (a GPU machine given a plain copy of the tree)."""
    folder = where / "source-tree-bin"
    script = folder / "cupy-nwt"
    if not script.exists():
        folder.mkdir(parents=True, exist_ok=True)
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cupy_nwt "$@"\n', encoding="utf-8")
        script.chmod(0o755)
    return folder


def prepare(block: Block, workdir: Path) -> None:
    """Write the files that earlier blocks of the same page define, and the shard a block reads."""
    for earlier in BLOCKS:
        if earlier.page == block.page and earlier.index < block.index and "file" in earlier.how:
            path = workdir / file_name(earlier)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(earlier.body, encoding="utf-8")
    if "shards.tar" in block.how and not (workdir / "shards.tar").exists():
        from cupy_nwt.data.datasets import SyntheticCIFAR10, write_tar_shard

        data = SyntheticCIFAR10(n=512, cache_dir=workdir.parent / ".cache")
        images, labels = zip(*(data[i] for i in range(len(data))))
        write_tar_shard(workdir / "shards.tar", list(images), list(labels))


def run(argv: list[str], workdir: Path, timeout: float = 600, cwd: Path | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd or workdir, env=environment(workdir), capture_output=True, text=True,
                          timeout=timeout)


def tracked_state() -> str:
    """What ``git status`` says of the tree, untracked files included: a refused command adds nothing."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout


def check_gpu_refusal(proc: subprocess.CompletedProcess[str], what: str) -> None:
    """Without a GPU a GPU command exits 3 with one line naming why: no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 3, f"{what}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert len(lines) == 1 and "GPU" in lines[0], f"{what}: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr


def check_gate_verdict(proc: subprocess.CompletedProcess[str], cmd: str) -> None:
    """Exit 1 from the gate itself: its verdict line, a ``fell`` (samples/s) or ``rose`` (CPU) line, and no test failed
    for another reason."""
    out = proc.stdout + proc.stderr
    assert "cupy_nwt throughput gate FAILED" in out and (" fell " in out or " rose " in out), f"{cmd}\n{out[-4000:]}"
    assert not re.search(r"^(FAILED|ERROR) ", out, re.M), f"{cmd}\n{out[-4000:]}"


def test_every_block_says_how_it_is_tested():
    assert len(BLOCKS) >= 8 and len(PAGES) >= 12
    for path in PAGES:
        assert page_blocks(path) or path.name in ("results.md", "reliability.md", "api.md"), f"{path.name} shows no code"
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"<!-- test: ([^>]*?) -->(\n```)?", text):
            words, directive = m.group(1).split(), f"<!-- test: {m.group(1)} -->"
            assert words[0] in KNOWN, f"unknown test directive {directive!r} in {path.name}"
            # past first-line the words are its reason; elsewhere a word not known would be dropped unread
            assert words[0] == "first-line" or set(words) <= KNOWN, f"unknown word in {directive!r} in {path.name}"
            assert m.group(2), f"{directive!r} in {path.name} is not followed by a code block: it tests nothing"
    for block in BLOCKS:
        allowed = ("yaml",) if "workflow" in block.how else ("bash", "python")
        assert block.lang in allowed, f"{block.where}: a block's language is bash or python (yaml: workflow)"


def test_the_readme_is_short_and_its_links_lead_somewhere():
    text = README.read_text(encoding="utf-8")
    assert text.count("\n") <= README_MAX_LINES, f"the README has {text.count(chr(10))} lines: move some to docs/"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"the README links to {target}, which is not in the tree"
    for page in sorted(DOCS.glob("*.md")):
        assert f"(docs/{page.name}" in text, f"the README does not link docs/{page.name}"


def test_the_examples_folder_is_listed_in_the_docs():
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    for example in sorted((ROOT / "examples").glob("*.py")):
        assert f"examples/{example.name}" in text, f"{example.name} is not mentioned in docs/index.md"


def test_no_install_line_names_a_package_no_registry_has():
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"pip install ['\"]?cupy-nwt", text), \
            f"{path.name}: install from the source tree: cupy-nwt is not on PyPI"


def needs_gpu(block: Block) -> bool:
    return "gpu" in block.how or "gpu-session" in block.how


@pytest.mark.gpu
@pytest.mark.parametrize("block", [b for b in BLOCKS if "gpu" in b.how], ids=lambda b: b.id)
def test_gpu_code_block(block: Block, workdir: Path):
    run_block(block, workdir)


#: blocks that install the package or count a pipeline under valgrind: a minute or two each
SLOW = {"setup-main", "gate", "workflow"}


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=[pytest.mark.slow] if SLOW & set(b.how) else [])
                                   for b in BLOCKS])
def test_code_block(block: Block, workdir: Path):
    if "gpu-session" in block.how and cuda.gpu_status().available:
        pytest.skip("the GPU run itself: run as docs/gpu.md says, not inside the tests")
    if "gpu" in block.how and cuda.gpu_status().available:
        pytest.skip("on a GPU the block runs in test_gpu_code_block")
    run_block(block, workdir)


def run_block(block: Block, workdir: Path) -> None:
    if "torch" in block.how:
        pytest.importorskip("torch", reason="the block needs PyTorch")
    prepare(block, workdir)
    if "readme" in block.how:
        assert block.page != "README.md", f"{block.where}: a README block is tested as it is, not as a copy"
        readme = [b for b in BLOCKS if b.page == "README.md" and b.body == block.body]
        assert readme, f"{block.where}: marked as the README's, but the README has no such block"
        return
    if "ci" in block.how:
        ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
        assert "pip\" install -q -e '.[cuda12,test]'" in ci
        for cmd in commands(block.body):
            install, _, tests = cmd.partition(" && .venv/bin/python -m pytest ")
            assert install == "python3 -m venv .venv && .venv/bin/pip install -e '.[cuda12,test]'", cmd
            assert f'"$venv/bin/python" -m pytest {tests}\n' in ci, f"{block.where}: .ci/run runs other tests than {cmd}"
        return
    if "setup-main" in block.how:
        run_main_setup(block, workdir)
        return
    if "workflow" in block.how:
        run_workflow(block, workdir)
        return
    if "file" in block.how:
        compile(block.body, file_name(block), "exec")
        return
    if block.lang == "python":
        proc = run([sys.executable, "-c", block.body], workdir)
        if needs_gpu(block) and not cuda.gpu_status().available:
            check_gpu_refusal(proc, block.where)
            pytest.skip(f"GPU path not run: {cuda.gpu_status().reason}")
        assert proc.returncode == 0, f"{block.where}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        return
    lines = commands(block.body)
    if "first-line" in block.how:
        lines = lines[:1]
        program = lines[0].split()[0]
        if shutil.which(program, path=environment(workdir)["PATH"]) is None:
            pytest.skip(f"{program} is not installed here")
    gpu = needs_gpu(block) and not cuda.gpu_status().available
    where = ROOT if "repo-root" in block.how else workdir
    before = tracked_state() if where == ROOT else None
    for cmd in lines:
        proc = run(["bash", "-c", cmd], workdir, cwd=where)
        if gpu:
            check_gpu_refusal(proc, cmd)
        elif "gate" in block.how and "--nwt-against" in cmd and proc.returncode == 1:
            check_gate_verdict(proc, cmd)
        else:
            assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    if before is not None and gpu:
        assert tracked_state() == before, "a refused GPU command changed the repository"
    if gpu:
        pytest.skip(f"GPU path not run: {cuda.gpu_status().reason}")
    if "first-line" in block.how:
        pytest.skip(f"only the first line ran: the others {block.reason}")


def run_main_setup(block: Block, workdir: Path) -> None:
    """The first set-up line on a copy of the tracked tree: a fresh venv, the install, the main job."""
    (cmd,) = commands(block.body)
    assert cmd.startswith("python3 -m venv .venv && "), cmd
    tree = workdir / f"fresh-clone-{block.index}"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in filter(None, files.stdout.split("\0")):
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    env = environment(workdir)
    env.pop("PYTHONPATH")
    env["PATH"] = env["PATH"].split(os.pathsep, 1)[1]
    proc = subprocess.run(["bash", "-c", cmd], cwd=tree, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    report = tree / "nwt-report"
    assert (report / "summary.md").is_file() and (report / "report.json").is_file()


def run_workflow(block: Block, workdir: Path) -> None:
    """The workflow's steps as a runner would take them, in a scratch repository with a base branch."""
    yaml = pytest.importorskip("yaml", reason="reading the workflow needs PyYAML")
    doc = yaml.safe_load(block.body)
    (job,) = doc["jobs"].values()
    steps = job["steps"]
    checkout = next(s for s in steps if str(s.get("uses", "")).startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] == 0, "--nwt-against needs the base revision fetched"
    runs = [s["run"] for s in steps if "run" in s]
    install, setup, gate = runs
    assert "apt-get install -y -q valgrind" in install and setup == "pip install -e '.[test]'"
    if shutil.which("valgrind") is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip("valgrind is missing and this test cannot install it (needs root and apt-get)")
        proc = run(["bash", "-c", install.replace("sudo ", "")], workdir, timeout=900)
        assert proc.returncode == 0, f"{install}\n{proc.stderr[-2000:]}"
    repo = workdir / "workflow-repo"
    (repo / "bench").mkdir(parents=True, exist_ok=True)
    (file_block,) = [b for b in BLOCKS if b.page == block.page and "file" in b.how and file_name(b) == "bench/test_pipeline.py"]
    (repo / "bench" / "test_pipeline.py").write_text(file_block.body, encoding="utf-8")
    git = "git -c user.email=readme@test -c user.name=readme"
    readme = page_folder(workdir.parent, "README.md") / "bench"  # where the README's gate block saved its baseline
    if (readme / "baseline.json").is_file() and (readme / "test_pipeline.py").read_text(encoding="utf-8") == file_block.body:
        shutil.copy2(readme / "baseline.json", repo / "bench" / "baseline.json")
    else:
        saved = run(["bash", "-c", "pytest bench/test_pipeline.py --nwt-save-baseline=bench/baseline.json"], workdir,
                    cwd=repo, timeout=1200)
        assert saved.returncode == 0, saved.stdout[-3000:]
    for cmd in ("git init -q -b main", f"{git} add -A", f"{git} commit -qm base", f"git remote add origin {repo}",
                "git fetch -q origin"):
        assert run(["bash", "-c", cmd], workdir, cwd=repo).returncode == 0, cmd
    cmd = gate.replace("${{ github.base_ref }}", "main")
    assert "--nwt-against=origin/main" in cmd
    proc = run(["bash", "-c", cmd], workdir, cwd=repo, timeout=1800)
    if proc.returncode == 1:
        check_gate_verdict(proc, cmd)
    else:
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "same job]" in proc.stdout, proc.stdout[-3000:]
