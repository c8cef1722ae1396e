#!/usr/bin/env bash
# Everything a lent GPU machine should run for this project, as one command from the source tree:
# the gpu tests, `cupy-nwt reproduce` (bandwidth, overlap, NWT 0..N-1 both strategies), GPU idle time
# with and without the prefetcher beside torch, the loader against torch with batches on the GPU, and
# two ranks sharing the GPU. Results go to bench/results/<device>/ and, when $OUT is set (the device
# tool's output folder), into $OUT/results.tgz as well.
#
#     bash bench/gpu_session.sh            # about 15 minutes on a 16-core H100 machine (estimate)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

device=$("$py" -c 'import sys
from cupy_nwt import cuda
status = cuda.gpu_status()
if not status.available:
    sys.exit(f"gpu_session: {status.reason}; nothing to do")
print("-".join(cuda.device_info(0).name.split()))') || exit 3
# From a source tree the plugin's pytest11 entry point is not installed: load it by name instead
# (pytester's subprocess runs inherit this too).
if ! "$py" -c 'import importlib.metadata as m, sys
sys.exit(not any(e.name == "cupy_nwt" for e in m.entry_points(group="pytest11")))'; then
    export PYTEST_PLUGINS=cupy_nwt.pytest_plugin
fi
dest=bench/results/$device
mkdir -p "$dest"
status=0
step() {  # run one step, keep going on failure, remember it
    echo "== $*" >&2
    "$@" || { echo "gpu_session: FAILED: $*" >&2; status=1; }
}
step "$py" -m pytest -m gpu -q -p no:cacheprovider tests bench --junitxml="$dest/pytest-gpu.xml"
step "$py" -m cupy_nwt reproduce --out "$dest/reproduce" --no-progress
step "$py" bench/gpu_feed.py --workers 4,8,15 --out-dir "$dest"
step "$py" bench/loader_compare.py --device cuda --workers 0,4,8,15 --out-dir "$dest" --note "bench/gpu_session.sh"
step "$py" bench/scaleout.py --ranks 1,2 --output "$dest/scaleout.json"
if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/results.tgz" "$dest"
fi
exit $status
