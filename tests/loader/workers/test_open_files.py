"""The main process near its open-files limit (RLIMIT_NOFILE), as a training script holding many files meets it.

Each case runs a user's script in its own process, which lowers its own limit: the test runner's is left alone.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.process_only("only process workers take descriptors of their own")

RUN_S = 60


def run(script: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=RUN_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_out_of_descriptors_mid_epoch_is_one_clear_error_not_a_hang():
    """A batch that travels beside the ring (here every one: a new shape each) comes with a file; the kernel
    dropped it, the batch was lost, and the loop waited for ever (or timed out blaming the dataset)."""
    out = run("""
        import os, resource
        import numpy as np
        import cupy_nwt

        class Ragged:
            def __len__(self):
                return 12

            def __getitem__(self, i):
                return np.full(100_000 + 1000 * i, i, np.float32)  # 400 KB, a new shape each

        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        loader = cupy_nwt.DataLoader(Ragged(), batch_size=None, num_workers=2, device="cpu", timeout=30)
        it = iter(loader)
        next(it)
        held = []
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        try:
            for _ in it:
                pass
            print("ended")
        except cupy_nwt.LoaderError as e:
            print(type(e).__name__, str(e).splitlines()[0])
        for fd in held:
            os.close(fd)
        loader.close()
    """)
    assert out.startswith("LoaderError Too many open files: a batch's file from a worker could not be received")


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_the_workers_the_open_files_check_admits_start_and_one_more_is_a_clear_error(method):
    """The check counted only what stays open per worker; starting one takes more at once, so the count it said
    the limit held failed with a bare OSError from inside multiprocessing."""
    out = run(f"""
        import os, resource
        import numpy as np
        import cupy_nwt
        from cupy_nwt.loader.workers.capacity import FDS_PER_WORKER, START_FDS, capacity, read_limits
        if __name__ == "__main__":
            room = len(os.listdir("/proc/self/fd")) + FDS_PER_WORKER + START_FDS["{method}"]  # one worker's worth
            resource.setrlimit(resource.RLIMIT_NOFILE, (room, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
            n = capacity("{method}", 2, 1, read_limits()).workers
            data = np.arange(64, dtype=np.float32)
            kw = dict(batch_size=8, device="cpu", multiprocessing_context="{method}")
            print(n, sum(1 for _ in cupy_nwt.DataLoader(data, num_workers=n, **kw)))
            try:
                list(cupy_nwt.DataLoader(data, num_workers=n + 1, **kw))
                print("started")
            except cupy_nwt.CupyNwtError as e:  # past the CPUs the count is refused before any starts
                print(type(e).__name__, str(e).split(" (")[0])
    """)
    started, refused = out.splitlines()
    assert started == "1 8"  # the one worker the check counts, and its 8 batches
    assert refused.startswith(("LoaderError Too many open files: loader worker 1 could not be started",
                               "ArgumentError num_workers=2 is more than this machine can hold about 1"))
