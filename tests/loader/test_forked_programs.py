"""Programs that fork beside a loader, and programs whose own exit functions use one: each runs as the
user's script, in a process of its own (a fork inside pytest's would copy pytest too).

A forked child (a pre-forking server, ``multiprocessing.Process`` under fork) that iterates the loader gets
an epoch of its own, as torch's loader gives it; one that reads the parent's live iterator is refused,
where it took the parent's batches from under it; an exit function the script registered after its
imports still finds its loaders whole.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PRELUDE = """
import os, sys
import numpy as np
from cupy_nwt import DataLoader


class Data:
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return np.full(3, i, np.int64)


def firsts(batches):
    return [int(np.asarray(b)[0, 0]) for b in batches]


def count_signals():  # the signals this process sends from now on (os.kill), in a list
    sent, real_kill = [], os.kill

    def kill(pid, sig):
        if sig:  # signal 0 sends nothing: it asks whether the pid names a process
            sent.append(sig)
        real_kill(pid, sig)

    os.kill = kill
    return sent


def child_epoch(loader):  # fork: the child prints the first sample of each batch of an epoch; its status back
    pid = os.fork()
    if pid == 0:
        import faulthandler
        faulthandler.dump_traceback_later(60, exit=True)
        print("child", firsts(loader), flush=True)
        os._exit(0)
    return os.waitpid(pid, 0)[1]
"""


def run_script(tmp_path: Path, body: str, outlived: bool = False) -> subprocess.CompletedProcess[str]:
    """The script's run; ``outlived``: a process it started may outlive it holding its output open, so the
    output goes to files and the run ends with the script."""
    script = tmp_path / "train.py"
    script.write_text(PRELUDE + textwrap.dedent(body), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    if not outlived:
        return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
    with open(tmp_path / "out.txt", "w+") as out, open(tmp_path / "err.txt", "w+") as err:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=out, stderr=err, timeout=120)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(done.args, done.returncode, out.read(), err.read())


def run_in_a_terminal(tmp_path: Path, body: str, first_on_path: Path | None = None,
                      ) -> subprocess.CompletedProcess[str]:
    """The script's run as the leader of a process group of its own, as a terminal starts it: a Ctrl-C it
    plays (``os.killpg(0, SIGINT)``) reaches every process it started, and nothing of the test's."""
    script = tmp_path / "train.py"
    script.write_text(PRELUDE + textwrap.dedent(body), encoding="utf-8")
    path = [str(first_on_path)] if first_on_path is not None else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, *sys.path])}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, start_new_session=True)


@pytest.mark.parametrize("kind", ["fork", "thread-persistent"])
def test_a_forked_child_iterates_the_loader_as_a_loader_of_its_own(tmp_path, kind):
    options = ('worker_type="thread", persistent_workers=True' if kind == "thread-persistent"
               else 'multiprocessing_context="fork"')
    done = run_script(tmp_path, f"""
        if __name__ == "__main__":
            loader = DataLoader(Data(), batch_size=4, num_workers=2, device="cpu", {options})
            it = iter(loader)
            first = firsts([next(it)])
            status = child_epoch(loader)
            print("parent", first + firsts(it), "child status", status, flush=True)
    """)
    every = list(range(0, 40, 4))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"child {every}" in done.stdout and f"parent {every} child status 0" in done.stdout, done.stdout + done.stderr


def test_a_forked_child_that_reads_the_parents_iterator_is_refused_and_the_parent_loses_nothing(tmp_path):
    done = run_script(tmp_path, """
        import multiprocessing as mp


        def peek(it):
            try:
                next(it)
            except Exception as e:
                print("child:", type(e).__name__, e, flush=True)


        if __name__ == "__main__":
            loader = DataLoader(Data(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context="fork")
            it = iter(loader)
            got = [next(it) for _ in range(3)]
            p = mp.get_context("fork").Process(target=peek, args=(it,))
            p.start()
            p.join(60)
            print("parent", firsts(got + list(it)), flush=True)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "child: LoaderError this iterator belongs to process" in done.stdout, done.stdout
    assert f"parent {list(range(0, 40, 4))}" in done.stdout, done.stdout


@pytest.mark.parametrize("workers", [0, 2])
def test_an_exit_function_registered_after_the_imports_finds_its_loader_whole(tmp_path, workers):
    """A final evaluation (or a checkpoint's ``state_dict()``) in the script's own exit function: torch's
    loader still iterates there, and so does this one."""
    if workers and (3, 12, 0) <= sys.version_info[:3] < (3, 12, 2):
        pytest.skip("CPython 3.12.0 and 3.12.1 refuse to fork in an exit function (torch's loader fails there too)")
    done = run_script(tmp_path, f"""
        import atexit

        loaders = {{}}


        @atexit.register
        def final_eval():
            print("final eval", sum(len(b) for b in loaders["val"]), "samples", flush=True)
            print("state", sorted(loaders["val"].state_dict())[:1], flush=True)


        if __name__ == "__main__":
            loaders["val"] = DataLoader(Data(), batch_size=4, num_workers={workers}, device="cpu")
            print("training done", flush=True)
    """)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "final eval 40 samples" in done.stdout and "state [" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_forked_child_that_ends_with_sys_exit_leaves_the_parents_workers_running(tmp_path, method):
    """multiprocessing's exit function in the child lists the parent's workers among its children (the fork
    copied the list): it must not stop them. torch's parent loses its workers here."""
    done = run_script(tmp_path, f"""
        if __name__ == "__main__":
            loader = DataLoader(Data(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context="{method}")
            it = iter(loader)
            got = [next(it)]
            pid = os.fork()
            if pid == 0:
                sys.exit(0)
            _, status = os.waitpid(pid, 0)
            print("parent", firsts(got + list(it)), "child status", status, flush=True)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"parent {list(range(0, 40, 4))} child status 0" in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_variable_the_script_sets_after_making_a_forkserver_loader_reaches_its_workers(tmp_path):
    """forkserver's server starts with the loader and keeps the environment of that moment; torch's starts at
    the first ``iter()``. Workers get the script's environment as they start, as under fork and spawn."""
    done = run_script(tmp_path, """
        class Env:
            def __getstate__(self):
                return {}

            def __setstate__(self, state):  # as the worker unpickles it: the root read then, as torch gives it
                self.late = os.environ.get("NWT_LATE") == "set"

            def __len__(self):
                return 4

            def __getitem__(self, i):
                return np.array([os.environ.get("NWT_LATE") == "set", "NWT_GONE" in os.environ, self.late], np.int64)


        if __name__ == "__main__":
            os.environ["NWT_GONE"] = "here at first"
            loader = DataLoader(Env(), batch_size=2, num_workers=2, device="cpu", multiprocessing_context="forkserver")
            os.environ["NWT_LATE"] = "set"
            del os.environ["NWT_GONE"]
            print("seen", sorted({tuple(int(v) for v in row) for b in loader for row in np.asarray(b)}), flush=True)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "seen [(1, 0, 1)]" in done.stdout, done.stdout + done.stderr


def test_a_child_forked_after_a_forkserver_loader_was_made_starts_workers_of_its_own(tmp_path):
    """The server started with the parent's loader is not the child's: the child starts its own (it met
    ``ChildProcessError``). torch's server starts at the first ``iter()``, so its loader meets this only later."""
    done = run_script(tmp_path, """
        if __name__ == "__main__":
            loader = DataLoader(Data(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context="forkserver")
            status = child_epoch(loader)
            print("parent", firsts(loader), "child status", status, flush=True)
    """)
    every = list(range(0, 40, 4))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"child {every}" in done.stdout and f"parent {every} child status 0" in done.stdout, done.stdout + done.stderr


def test_with_sigchld_ignored_the_workers_that_stopped_are_not_signalled(tmp_path):
    """A program that sets SIGCHLD to SIG_IGN (a daemon's habit) has its children reaped by the system, so
    ``waitpid`` no longer tells an ended worker: each epoch's end waited out the grace period, then sent
    SIGTERM to pids already gone (another process's, once reused). Workers are told ended by their sentinel."""
    done = run_script(tmp_path, """
        import signal

        if __name__ == "__main__":
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
            sent = count_signals()
            loader = DataLoader(Data(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context="fork")
            print("epochs", [len(firsts(loader)) for _ in range(3)], "signals sent", len(sent), flush=True)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "epochs [10, 10, 10] signals sent 0" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(("method", "helper"), [("fork", False), ("spawn", False), ("forkserver", False),
                                               ("fork", True), ("spawn", True)])
def test_with_sigchld_ignored_a_worker_that_dies_is_reported_at_once(tmp_path, method, helper):
    """``waitpid`` cannot see the end of a child the system reaped: the loader took the dead worker for a slow
    one and spun forever (fork), or said it could not reach it (spawn). With a helper the worker forked holding
    its sentinel open, neither told its end: the loader waited as long as the helper lived (here, past the
    test's limit). torch: "exited unexpectedly" within a second."""
    done = run_script(tmp_path, f"""
        import signal
        import time


        def start_a_helper(worker_id):
            main = os.getppid()
            if os.fork() == 0:
                for _ in range(3000):  # lives until the script has ended (5 minutes at most)
                    try:
                        os.kill(main, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.1)
                os._exit(0)


        class Killer(Data):
            def __getitem__(self, i):
                if i == 13:
                    os.kill(os.getpid(), signal.SIGKILL)
                return super().__getitem__(i)


        if __name__ == "__main__":
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
            loader = DataLoader(Killer(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context="{method}",
                                worker_init_fn=start_a_helper if {helper} else None)
            try:
                list(loader)
            except Exception as exc:
                print("raised", type(exc).__name__, exc, flush=True)
    """, outlived=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "raised WorkerDiedError" in done.stdout and "loader worker 1 (pid" in done.stdout, done.stdout + done.stderr


def test_a_helper_a_worker_forked_does_not_hold_up_the_end_of_each_epoch(tmp_path):
    """The helper holds the worker's sentinel and pipes open past the worker's end: each epoch's end waited
    out the whole grace period (1 s), then signalled the ended workers. ``waitpid`` tells their end."""
    done = run_script(tmp_path, """
        import time

        def start_a_helper(worker_id):
            if os.fork() == 0:
                quiet = os.open(os.devnull, os.O_WRONLY)
                os.dup2(quiet, 1)
                os.dup2(quiet, 2)
                time.sleep(5)
                os._exit(0)


        if __name__ == "__main__":
            loader = DataLoader(Data(), batch_size=4, num_workers=2, device="cpu", worker_init_fn=start_a_helper,
                                multiprocessing_context="fork")
            sent = count_signals()
            print("epochs", [len(firsts(loader)) for _ in range(3)], "signals sent", len(sent), flush=True)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "epochs [10, 10, 10] signals sent 0" in done.stdout, done.stdout + done.stderr


def test_a_ctrl_c_in_a_terminal_while_the_forkserver_imports_the_script_interrupts_the_script_alone(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: forkserver's server, importing the script (seconds
    where it imports torch), printed its traceback and died, and the loader's next start failed on its EOF."""
    done = run_in_a_terminal(tmp_path, """
        import signal
        import time

        if __name__ == "__mp_main__":  # the server imports the script: slow, as one importing torch is
            time.sleep(1.5)
        if __name__ == "__main__":
            signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal gives it, not a background job
            loader = DataLoader(Data(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context="forkserver")
            try:
                time.sleep(0.5)
                os.killpg(0, signal.SIGINT)  # Ctrl-C: the server, in the script's import, has it too
                time.sleep(5)
            except KeyboardInterrupt:
                print("interrupted; then", len(firsts(loader)), "batches", flush=True)
    """)
    assert done.returncode == 0 and "interrupted; then 10 batches" in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr


SLOW_SERVER_START = """
import os
import sys
import time

if "from multiprocessing.forkserver import main" in " ".join(sys.orig_argv) and "SERVER_STARTING" in os.environ:
    open(os.environ["SERVER_STARTING"], "w").close()
    time.sleep(1.5)  # the server's Python starting on a busy machine, before it imports anything of the package
"""


def test_a_ctrl_c_in_a_terminal_while_the_forkserver_server_starts_python_interrupts_the_script_alone(tmp_path):
    """The server's first steps, before the package's first module runs in it (Python's start, NumPy's import),
    took a terminal's Ctrl-C as its own: it printed a traceback and died, and the loader's next start failed on
    its EOF. Here those steps are a ``sitecustomize`` that sleeps in the server alone."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_SERVER_START, encoding="utf-8")
    done = run_in_a_terminal(tmp_path, """
        import signal
        import time

        if __name__ == "__main__":
            signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal gives it, not a background job
            os.environ["SERVER_STARTING"] = "server-starting"
            loader = DataLoader(Data(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context="forkserver")
            try:
                while not os.path.exists("server-starting"):
                    time.sleep(0.01)
                os.killpg(0, signal.SIGINT)  # Ctrl-C: the server, still starting Python, has it too
                time.sleep(5)
            except KeyboardInterrupt:
                print("interrupted; then", len(firsts(loader)), "batches", flush=True)
    """, first_on_path=site)
    assert done.returncode == 0 and "interrupted; then 10 batches" in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr


def test_a_ctrl_c_that_comes_while_a_worker_is_forked_interrupts_the_script_and_not_the_worker(tmp_path):
    """A Ctrl-C arriving inside the fork (its at-fork hooks) was printed as ignored and lost: the epoch ran on and
    the script ended as if never interrupted (an interrupted ``cupy-nwt tune`` exited 0), also where another thread
    (OpenBLAS's) took the signal; one arriving in a child before its handler was set printed a traceback. Both are
    played here by at-fork hooks of the script's own; the worker being started is the pool's, stopped by its close."""
    done = run_script(tmp_path, """
        import signal
        import threading
        import time

        asked = []


        def ctrl_c_during_the_fork():
            if not asked:
                asked.append(1)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)  # the hook goes on while another thread takes the signal


        def ctrl_c_in_the_new_worker():
            os.kill(os.getpid(), signal.SIGINT)


        if __name__ == "__main__":
            signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (a background job ignores it)
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # a thread that may take the signal
            os.register_at_fork(before=ctrl_c_during_the_fork, after_in_child=ctrl_c_in_the_new_worker)
            loader = DataLoader(Data(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context="fork")
            try:
                print("batches", len(firsts(loader)), flush=True)
            except KeyboardInterrupt:
                loader.close()
                import multiprocessing
                print("interrupted", [p.name for p in multiprocessing.active_children()], flush=True)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "interrupted []\n" and "KeyboardInterrupt" not in done.stderr, done.stdout + done.stderr


def test_a_spawn_worker_starts_with_ctrl_c_held_back_until_it_ignores_it(tmp_path):
    """The first spawn worker's start also starts multiprocessing's resource tracker, which unblocks SIGINT in
    the starting thread: the worker inherited it unblocked, and a Ctrl-C while it imported printed its traceback."""
    done = run_script(tmp_path, """
        import signal


        def held():
            with open("/proc/self/status") as f:
                blocked = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
            return bool(blocked & (1 << (signal.SIGINT - 1)))


        if __name__ == "__mp_main__":  # a spawn worker importing the script, before its loop
            os.write(1, f"worker held {held()}\\n".encode())  # one write: two workers' lines never interleave
        if __name__ == "__main__":
            loader = DataLoader(Data(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context="spawn")
            print("batches", len(firsts(loader)), "main held", held(), flush=True)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(done.stdout.splitlines()) == ["batches 10 main held False", "worker held True", "worker held True"], \
        done.stdout + done.stderr
