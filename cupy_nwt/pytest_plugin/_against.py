"""``--nwt-against REV``: the base revision measured beside this run, round for round, in the same job.

A baseline saved an hour ago was measured on another machine, in effect: a shared host's speed drifts
by tens of percent between minutes. So, as asv's ``continuous`` does, the base revision is measured
now, alternately with the working tree: REV is checked out into a git worktree (as
``bench/interleave_compare.py`` does), the same test runs there in a child pytest (REV's code, REV's
test file), and the two loaders take turns, one round each, the order flipped every pair (REV first,
then this run first, ...). A drift of the machine then hits both rounds of a pair alike, and the gate
judges the pairs' ratios (:func:`~cupy_nwt.pytest_plugin._interval.paired_interval`), where asv pools
the interleaved rounds of each side and applies a Mann-Whitney test. Both loaders stay open all
along; the one not taking its turn waits with its prefetched batches.

The child is told what to do through the environment (:data:`ENV_ADDRESS`, :data:`ENV_KEY`,
:data:`ENV_NODE`) and a ``multiprocessing.connection`` on a Unix socket: it sends ``ready`` after its
warm-up, then answers each ``("round", batches)`` with that round's figures, and ``("count", samples)``
with the exact counts of its pipeline (:mod:`cupy_nwt.pytest_plugin._count`), until ``stop``. So the
base revision's cost per sample is counted in the same job too, and judged exactly beside this run's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from ..errors import AgainstError

ENV_ADDRESS = "CUPY_NWT_AGAINST_ADDRESS"
ENV_KEY = "CUPY_NWT_AGAINST_KEY"
ENV_NODE = "CUPY_NWT_AGAINST_NODE"
#: seconds for the child to start (pytest, imports, its loader's workers and warm-up) and for one round
START_TIMEOUT_S = 300.0
ROUND_TIMEOUT_S = 300.0



def _git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AgainstError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout.strip()


def resolve(rev: str, cwd: Path) -> tuple[str, Path]:
    """(commit, the repository's top folder) of ``rev`` seen from ``cwd``; a one-line error otherwise."""
    if shutil.which("git") is None:
        raise AgainstError("--nwt-against needs git, which is not on PATH")
    try:
        top = Path(_git(cwd, "rev-parse", "--show-toplevel"))
    except AgainstError:
        raise AgainstError(f"--nwt-against needs a git checkout: {cwd} is not inside one") from None
    try:
        commit = _git(cwd, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except AgainstError:
        try:
            shallow = _git(cwd, "rev-parse", "--is-shallow-repository") == "true"
        except AgainstError:
            shallow = False
        why = (f": this clone is shallow, and holds no more history than it was cloned with (CI checkouts "
               f"often fetch one commit): fetch {rev} first (git fetch --deepen=1 for HEAD~1, or a full clone)"
               if shallow else "")
        raise AgainstError(f"--nwt-against: {rev!r} is not a revision of {top}{why}") from None
    return commit, top


class BaseRevision:
    """The session's checkout of REV (made on first use, removed at the end) and the children run there."""

    def __init__(self, rev: str, cwd: Path) -> None:
        self.name = rev
        self.commit, self.top = resolve(rev, cwd)
        self._tmp: str | None = None
        self.tree: Path | None = None

    def checkout(self) -> Path:
        if self.tree is None:
            self._tmp = tempfile.mkdtemp(prefix="nwt-against-")
            tree = Path(self._tmp) / "tree"
            _git(self.top, "worktree", "add", "--detach", "--quiet", str(tree), self.commit)
            self.tree = tree
        return self.tree

    def close(self) -> None:
        if self.tree is not None:
            subprocess.run(["git", "-C", str(self.top), "worktree", "remove", "--force", str(self.tree)],
                           capture_output=True)
            self.tree = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def in_tree(self, path: str) -> str:
        """``path``'s place in REV's checkout where it lies in this one; else ``path``."""
        assert self.tree is not None
        try:
            return str(self.tree / Path(path).resolve().relative_to(self.top))
        except ValueError:
            return path

    def import_roots(self) -> list[str]:
        """REV's copies of the folders in this checkout that this process imported modules from.

        A package found through an absolute path into the checkout (``PYTHONPATH=$PWD/src``, an editable
        install's ``.pth`` or finder) would otherwise be found there by REV's child too: the base revision
        would run this revision's code, and no change to it could ever show.
        """
        roots: list[str] = []
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if not file or name == "__main__":
                continue
            path = Path(file).resolve()
            depth = name.count(".") + (path.name.split(".")[0] == "__init__")
            if depth < len(path.parents) and (root := self.in_tree(str(path.parents[depth]))) != str(path.parents[depth]):
                roots.append(root)
        return list(dict.fromkeys(roots))

    def start(self, test_path: Path, nodeid: str, cwd: Path) -> BaseRun:
        """The same test, REV's copy, started in a child pytest that waits for rounds to run."""
        tree = self.checkout()
        try:
            rel_test, rel_cwd = test_path.resolve().relative_to(self.top), cwd.resolve().relative_to(self.top)
        except ValueError:
            raise AgainstError(f"{test_path} is outside the repository {self.top}: --nwt-against cannot find "
                               "its copy in the base revision") from None
        if not (tree / rel_test).is_file():
            raise AgainstError(f"{rel_test} does not exist in {self.name} ({self.commit[:10]}): nothing to "
                               "measure against")
        key = os.urandom(16)
        sock_dir = tempfile.mkdtemp(prefix="nwt-ab-")
        listener = Listener(os.path.join(sock_dir, "s"), family="AF_UNIX", authkey=key)
        paths = [self.in_tree(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        first = [str(tree), *self.import_roots()]
        env = {**os.environ, ENV_ADDRESS: str(listener.address), ENV_KEY: key.hex(), ENV_NODE: nodeid,
               "PYTHONPATH": os.pathsep.join(dict.fromkeys([*first, *paths]))}
        target = str(tree / rel_test) + ("::" + nodeid.split("::", 1)[1] if "::" in nodeid else "")
        cmd = [sys.executable, "-m", "pytest", target, "-p", "no:cacheprovider", "-q", "-x"]
        out = tempfile.TemporaryFile()
        proc = subprocess.Popen(cmd, cwd=tree / rel_cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        return BaseRun(proc, out, listener, sock_dir, self.name)


class BaseRun:
    """One child pytest of the base revision, serving rounds of one test's loader."""

    def __init__(self, proc: subprocess.Popen, out: Any, listener: Listener, sock_dir: str, name: str) -> None:
        self.proc, self.out, self.listener, self.sock_dir, self.name = proc, out, listener, sock_dir, name
        self.conn: Connection | None = None
        self.closed = False

    def _tail(self) -> str:
        """The child's last words: its last error line as pytest marks it ("E   SyntaxError: ..."), and its last line."""
        self.out.seek(0)
        lines = [x for x in self.out.read().decode("utf-8", "replace").splitlines() if x.strip()]
        errors = [" ".join(x[1:].split()) for x in lines if x.startswith("E ")]
        return " | ".join([*errors[-1:], lines[-1]] if errors else lines[-3:])

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        got: list[Connection] = []
        t = threading.Thread(target=lambda: got.append(self.listener.accept()), daemon=True)
        t.start()
        deadline = time.monotonic() + timeout
        while t.is_alive() and self.proc.poll() is None and time.monotonic() < deadline:  # it may end unready
            t.join(0.2)
        t.join(0.2)  # a connection made just as it ended
        if not got:
            tail, ended = self._tail(), self.proc.poll() is not None
            self.close()
            raise AgainstError(f"the base revision's test {'ended before it started' if ended else 'did not start'} "
                               f"its loader{'' if ended else f' within {timeout:g} s'} ({tail or 'no output'})")
        self.conn = got[0]
        return self._recv(timeout)

    def _recv(self, timeout: float) -> Any:
        assert self.conn is not None
        if not self.conn.poll(timeout):
            self.close()
            raise AgainstError(f"the base revision's test did not answer within {timeout:g} s")
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            tail = self._tail()
            self.close()
            raise AgainstError(f"the base revision's test ended early ({tail or 'no output'})") from None

    def round(self, batches: int | None) -> dict[str, Any]:
        """One round there: ``batches`` batches, or None for the sizing round; its figures."""
        assert self.conn is not None
        self.conn.send(("round", batches))
        reply = self._recv(ROUND_TIMEOUT_S)
        if "error" in reply:
            self.close()
            raise AgainstError(f"the base revision's round failed: {reply['error']}")
        return dict(reply)

    def ask_count(self, samples: int | None) -> None:
        """Ask for the base revision's exact counts; :meth:`counted` collects them (both count meanwhile)."""
        assert self.conn is not None
        self.conn.send(("count", samples))

    def counted(self, timeout: float) -> dict[str, Any]:
        """The base revision's counts (``extra_info`` keys), or ``{"count_note": why}`` when it could not count."""
        try:
            reply = self._recv(timeout)
        except AgainstError as exc:
            return {"count_note": f"the base revision's counts are missing: {exc}"}
        return dict(reply) if isinstance(reply, dict) else {"count_note": "the base revision sent no counts"}

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.conn is None:
            self.proc.kill()  # never connected to: it waits for rounds that will not come
        else:
            try:
                self.conn.send(("stop", None))
            except OSError:
                pass
            self.conn.close()
            self.conn = None
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.listener.close()
        self.out.close()
        shutil.rmtree(self.sock_dir, ignore_errors=True)


def serve(conn_info: tuple[str, str], ready: dict[str, Any], run_round: Callable[[int | None], dict[str, Any]],
          count: Callable[[int | None], dict[str, Any]] | None = None) -> None:
    """The child's side: say ready, then run rounds (and a count) on request until told to stop."""
    address, key = conn_info
    conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(key))
    try:
        conn.send(ready)
        while True:
            what, arg = conn.recv()
            if what == "count":
                conn.send(count(arg) if count is not None else {"count_note": "the base revision does not count"})
                continue
            if what != "round":
                return
            try:
                conn.send(run_round(arg))
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the comparison
                conn.send({"error": f"{type(exc).__name__}: {exc}"})
                return
    except EOFError:
        return
    finally:
        conn.close()


def served_here(nodeid: str) -> tuple[str, str] | None:
    """(address, key) when this process is a base revision's child and ``nodeid`` its test, else None."""
    address, key, node = (os.environ.get(k) for k in (ENV_ADDRESS, ENV_KEY, ENV_NODE))
    if not address or not key or node is None:
        return None
    return (address, key) if node.split("::", 1)[-1] == nodeid.split("::", 1)[-1] else None
