"""The start method the loader picks when the user does not: fork where it is safe, JAX's CPU runtime
included (said once at INFO: the workers must not call JAX), forkserver where CUDA or another threaded
runtime makes fork unsafe; a user's choice is kept; a stuck worker's timeout and stall name fork after
threads; an interactively defined dataset that forkserver could not send is refused in one line. Each case is a script run as a user would; all skip cleanly
where JAX does not import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import cupy_nwt

ROOT = Path(__file__).resolve().parents[3]


def run_script(tmp_path: Path, body: str, *, inline: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``body`` as a script file (or, ``inline``, with ``python -c``: an interactive ``__main__``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    body = textwrap.dedent(body)
    if inline:
        argv = [sys.executable, "-c", body]
    else:
        (tmp_path / "script.py").write_text(body)
        argv = [sys.executable, str(tmp_path / "script.py")]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)


JAX_START = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
import jax.numpy as jnp
import numpy as np
import cupy_nwt

class Squares:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.full(2, i * i)

if __name__ == "__main__":
    print("imported", cupy_nwt.DataLoader(Squares(), num_workers=2, device="cpu").start_method, flush=True)
    jnp.ones(3).block_until_ready()  # JAX's runtime (its threads) starts
    for _ in range(2):
        loader = cupy_nwt.DataLoader(Squares(), batch_size=4, num_workers=2, device="cpu")
        print("started", loader.start_method, sorted(int(x) for b in loader for x in b[:, 0]), flush=True)
    explicit = cupy_nwt.DataLoader(Squares(), num_workers=2, device="cpu", multiprocessing_context="fork")
    print("explicit", explicit.start_method, flush=True)
"""


def test_jax_on_the_cpu_in_the_parent_keeps_fork_said_once(tmp_path):
    pytest.importorskip("jax", reason="a JAX case")
    proc = run_script(tmp_path, JAX_START)
    assert proc.returncode == 0, proc.stderr[-2000:]
    squares = sorted(i * i for i in range(8))
    assert proc.stdout.splitlines() == ["imported fork", f"started fork {squares}",
                                        f"started fork {squares}", "explicit fork"]
    said = [line for line in proc.stderr.splitlines() if line.startswith("cupy_nwt.loader INFO")]
    assert len(said) == 1 and "fork" in said[0] and "must not call JAX" in said[0], said


JAX_STUCK = """
import logging, time
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
import jax.numpy as jnp
import numpy as np
import cupy_nwt

class Stuck:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        time.sleep(60)
        return np.zeros(2)

jnp.ones(3).block_until_ready()
loader = cupy_nwt.DataLoader(Stuck(), batch_size=4, num_workers=2, device="cpu", timeout=3, stall_warning_s=1,
                             multiprocessing_context="fork")
try:
    next(iter(loader))
except cupy_nwt.LoaderTimeoutError as exc:
    print(exc)
"""


def test_a_stuck_workers_timeout_and_stall_name_fork_after_jaxs_threads(tmp_path):
    pytest.importorskip("jax", reason="a JAX case")
    proc = run_script(tmp_path, JAX_STUCK)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fork after threads" in proc.stdout and "JAX" in proc.stdout and "forkserver" in proc.stdout
    stall = [line for line in proc.stderr.splitlines() if "waited" in line]
    assert stall and "fork after threads" in stall[0] and "JAX" in stall[0]


INTERACTIVE = """
import jax.numpy as jnp
import numpy as np
import cupy_nwt
from cupy_nwt.loader.workers.start import check_importable

class Typed:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return np.zeros(2)

jnp.ones(3).block_until_ready()
print("fork", len(list(cupy_nwt.DataLoader(Typed(), batch_size=2, num_workers=2, device="cpu"))))
try:
    check_importable("forkserver", False, [Typed()])
except cupy_nwt.CupyNwtError as exc:
    print(type(exc).__name__, exc)
"""


def test_a_dataset_typed_interactively_is_refused_in_one_line_when_forkserver_cannot_send_it(tmp_path):
    pytest.importorskip("jax", reason="a JAX case")
    proc = run_script(tmp_path, INTERACTIVE, inline=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    forked, line = proc.stdout.splitlines()
    assert forked == "fork 2"  # JAX on the CPU forks: the interactive class needs no import
    assert line.startswith("LoaderError") and "'Typed'" in line and "module" in line


class Stuck:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(60)
        return np.zeros(2)


def test_a_fork_workers_timeout_names_the_threads_that_ran_at_fork():
    stop = threading.Event()
    feeder = threading.Thread(target=stop.wait, name="my-feeder", daemon=True)
    feeder.start()
    try:
        loader = cupy_nwt.DataLoader(Stuck(), batch_size=2, num_workers=1, device="cpu", timeout=1,
                                     multiprocessing_context="fork")
        with pytest.raises(cupy_nwt.LoaderTimeoutError, match="fork after threads"):
            next(iter(loader))
        loader.close()
    finally:
        stop.set()


NO_GUARD = """
import sys
import numpy as np
from cupy_nwt import DataLoader, CupyNwtError
from cupy_nwt.data import ArrayDataset



class Rows:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return np.zeros(4, np.uint8)


ds = Rows() if sys.argv[2] == "script" else ArrayDataset(np.zeros((64, 4), np.uint8), np.zeros(64, np.int64))
try:
    for _ in DataLoader(ds, batch_size=16, num_workers=2, multiprocessing_context=sys.argv[1]):
        pass
except CupyNwtError as exc:
    print(type(exc).__name__, exc, file=sys.stderr)
    sys.exit(3)
print("no error")
"""


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_script_without_a_main_guard_is_told_why_its_workers_die(tmp_path, method):
    (tmp_path / "script.py").write_text(NO_GUARD)
    proc = subprocess.run([sys.executable, str(tmp_path / "script.py"), method, "script"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, timeout=240)
    assert proc.returncode == 3, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(("WorkerDiedError", "LoaderError")) and "if __name__ == '__main__':" in last, last


def test_forkserver_workers_need_no_main_guard_when_nothing_they_get_comes_from_the_script(tmp_path):
    (tmp_path / "script.py").write_text(NO_GUARD)
    proc = subprocess.run([sys.executable, str(tmp_path / "script.py"), "forkserver", "module"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0 and proc.stdout.strip() == "no error", proc.stderr[-2000:]


WRAPPED = """
import sys, types
sys.modules["tensorflow"] = types.ModuleType("tensorflow")  # what `import tensorflow` leaves: fork is unsafe
import numpy as np
import torch.utils.data as tud
import cupy_nwt

class Typed:  # a notebook cell's class: it lives in __main__, which has no file
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return np.full(3, i, np.float32)

train, val = tud.random_split(Typed(), [12, 4])
try:
    print(len(list(cupy_nwt.DataLoader(train, batch_size=4, num_workers=2, device="cpu"))))
except cupy_nwt.CupyNwtError as exc:
    print(type(exc).__name__, exc)
"""


def test_a_notebook_class_inside_torch_s_random_split_is_named_as_the_cause_when_its_workers_die(tmp_path):
    """The usual notebook pattern wraps the dataset (``random_split``): the workers, started by forkserver for
    the user, cannot import its class; the error says so, not that a script lacks a main guard."""
    pytest.importorskip("torch", reason="torch's dataset wrappers")
    proc = run_script(tmp_path, WRAPPED, inline=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = proc.stdout.splitlines()
    assert line.startswith("WorkerDiedError") and "defined interactively" in line and "random_split" in line, line
    assert "if __name__" not in line, line
