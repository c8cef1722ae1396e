#!/usr/bin/env bash
# What a GPU machine should run for this project, as named steps that each fit one command of a lent
# GPU machine (at most 600 s a command there, files back only from the folder $OUT names).
#
#     bash bench/gpu_session.sh --list          # one line per step: name, estimated seconds, what it runs
#     bash bench/gpu_session.sh STEP...          # run these steps in order; 'all' runs every one
#     bash bench/gpu_session.sh --unpack DIR     # files a device command returned -> bench/results/<device>/
#
# Each step writes into <results>/<device>/<step>/ as it goes (its output in log.txt there), where
# <results> is $OUT when set, else bench/results. With $OUT set, a finished step is then packed into
# $OUT/<device>/<step>.tgz, one file per step, since a device command returns at most 8 files.
# The whole script ends by GPU_SESSION_SECONDS (default 540) after it starts, the GPU probe included,
# well inside the device's 600-s kill. A step starts only if its estimate fits in what is left less
# the kill grace (GPU_SESSION_KILL_GRACE, 20 s) and 10 s to pack; one that overruns anyway is
# interrupted (SIGINT, then SIGKILL after the grace) and its files are packed; a step that does not
# fit prints NOT STARTED, and later steps that still fit run. GPU tests get a per-test timeout
# (pytest-timeout, on the GPU image) so one hung test cannot take the whole command.
# GPU_SESSION_ESTIMATES="step=seconds,..." replaces built-in estimates (say, with the times a first
# GPU run printed in its "done: STEP in N s" lines).
#
# The seconds are ESTIMATES for a 16-core H100 machine, derived from what each step runs (the
# reasoning is written beside each step below); no step has run on a GPU yet. Exit: 0 every step
# passed; 1 a step failed, was cut off or not started; 2 bad arguments; 3 no usable GPU (one line).
set -uo pipefail
start_dir=$PWD
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
budget=${GPU_SESSION_SECONDS:-540}
grace=${GPU_SESSION_KILL_GRACE:-20}
reserve=$((grace + 10))  # what a cut-off step needs after its timeout: the kill grace, then packing
test_timeout=120         # per GPU test: the slowest (two ranks sharing the GPU) is about 30 s

# name|estimated seconds|what it runs. Each estimate, from what the step runs:
STEPS=(
    # ~4 Python starts with CuPy imported (2-3 s each) + nvidia-smi -q and pip list (~2 s each).
    "info|15|cupy-nwt info (text and JSON), nvidia-smi -q, pip list, /dev/shm size"
    # collecting ~1,300 tests (torch and jax imported) ~20 s; 18 GPU tests, most a few seconds, the
    # loader ones start forkserver workers (~0.8 s each start), two-rank scale-out ~30 s: ~60 s.
    "gpu-tests|90|pytest -m gpu tests/ (junit.xml), --timeout per test"
    # collection ~10 s; 64 MiB copy rounds ~5 s; gpu_feed's 4 modes: workload build ~5 s, each mode
    # ~1 s worker start (timed apart) + 111 steps of 5 ms + close: ~12 s; 45 s with margin.
    "gpu-bench|45|pytest -m gpu bench/: 64 MiB copies, GPU idle per mode with persistent workers (benchmark.json)"
    # cupy_nwt bandwidth: 17 sizes x 2 memories x 2 directions x 23 samples of >= 8 MiB: ~14 GB per
    # (direction, memory), 6 s pageable at >= 5 GB/s, 1 s pinned; batching 12 GB ~2 s; 256 MiB buffers
    # filled and checked, kernels compiled, plot: ~25 s. overlap: 16 MiB through 3 versions x 23 runs,
    # ~5 s. native: nvcc build ~10 s (skipped when prebuilt), the same sweep and overlap ~20 s. ~75 s.
    "transfers|75|cupy-nwt bandwidth and overlap, then bench/native (built if needed) and cupy_nwt / native per figure"
    # about 100 trial loaders on cuda:0 with forkserver workers (0.8 s a start: ~80 s); ~6,150 batches
    # of 128 CIFAR augmentations over 0..15 workers (paper 16 x 100, fast ~8 x 100, steady 48 x 50,
    # judge 27 x 50), ~8k images/s on average with the slow low counts: ~100 s; 50,000 synthetic
    # images, plots: ~15 s. ~200 s, 250 with margin for the worker counts near the core count.
    "nwt|250|cupy-nwt reproduce --no-gpu: NWT paper and fast strategies over 0..15 workers, picks re-measured"
    # 2 workloads x workers 4,8,15 x 4 modes = 24 runs, each: persistent workers started once (~1 s),
    # 210 steps of >= 5 ms (decode at 4 workers ~8 ms a batch: ~1.7 s), close ~0.3 s: ~3 s; 5,000 PNGs
    # and 8,192 arrays built ~15 s: ~90 s, 120 with margin.
    "gpu-feed|120|bench/studies/does_the_gpu_wait_for_batches/gpu_feed.py --workers 4,8,15: steady-state GPU idle and start-up, cupy_nwt vs no-prefetch vs torch"
    # 2 workloads x workers 0,4,8,15 x 3 loaders x 3 repeats = 72 fresh loaders, each a start (forkserver
    # ~0.8 s, threads ~0) + 33 batches (decode at 0 workers ~1 s) + close: ~1.5 s: ~110 s; workloads and
    # plot ~20 s. ~130 s, 180 with margin.
    "loader-compare|180|bench/studies/is_the_loader_faster_than_torch/loader_compare.py --device cuda --workers 0,4,8,15"
    # ranks 1 and 2, 3 repeats: 6 launches of Python ranks (CuPy import ~3 s), 50,000 synthetic images
    # per rank, auto workers, 85 batches each: ~15 s a launch: ~90 s, 150 with margin.
    "scaleout|150|bench/studies/does_it_scale_over_ranks/scaleout.py --ranks 1,2 --repeats 3: two ranks sharing the GPU"
)

# A step's estimate: GPU_SESSION_ESTIMATES's when it names the step, else the built-in one.
estimate_of() {
    local pair
    for pair in ${GPU_SESSION_ESTIMATES:+${GPU_SESSION_ESTIMATES//,/ }}; do
        if [ "${pair%%=*}" = "$1" ] && [[ ${pair#*=} =~ ^[0-9]+$ ]]; then echo "${pair#*=}"; return; fi
    done
    printf '%s\n' "${STEPS[@]}" | grep "^$1|" | cut -d'|' -f2
}

usage() { sed -n '2,/^set -uo/p' "$self" | sed '$d; s/^# \{0,1\}//'; }
say() { echo "gpu_session: $*" >&2; }
names() { local s; for s in "${STEPS[@]}"; do echo "${s%%|*}"; done; }

# The body of one step, run by run_step under timeout; $1 = step, $2 = its folder.
step_body() {
    local step=$1 d=$2
    set -e  # a step fails with the first of its commands that fails
    trap 'exit 130' INT  # a cut-off step stops here, not at its next command
    case $step in
        info)
            "$py" -m cupy_nwt info >"$d/info.txt"
            "$py" -m cupy_nwt info --json >"$d/info.json"
            if command -v nvidia-smi >/dev/null; then nvidia-smi -q >"$d/nvidia-smi.txt"; fi
            "$py" -m pip list >"$d/pip-list.txt" 2>/dev/null || true
            df -B1 /dev/shm >"$d/dev-shm.txt" 2>&1 || true
            cat "$d/info.txt" ;;
        gpu-tests)
            "$py" -m pytest -m gpu -q -p no:cacheprovider tests --junitxml="$d/junit.xml" $(per_test_timeout) ;;
        gpu-bench)
            "$py" -m pytest -m gpu -q -p no:cacheprovider bench --junitxml="$d/junit.xml" \
                --benchmark-json="$d/benchmark.json" $(per_test_timeout) ;;
        transfers)
            "$py" -m cupy_nwt bandwidth --no-progress --output "$d/bandwidth.json" --plot "$d/bandwidth.png"
            "$py" -m cupy_nwt overlap --no-progress --output "$d/overlap.json"
            local native
            native=$(native_binary)
            if [ -n "$native" ]; then
                "$native" bandwidth >"$d/native-bandwidth.json"
                "$native" overlap >"$d/native-overlap.json"
                "$py" bench/native_report.py "$d"
            fi ;;
        nwt)
            "$py" -m cupy_nwt reproduce --no-gpu --no-progress --out "$d" ;;
        gpu-feed)
            "$py" bench/studies/does_the_gpu_wait_for_batches/gpu_feed.py --workers 4,8,15 --out-dir "$d" ;;
        loader-compare)
            "$py" bench/studies/is_the_loader_faster_than_torch/loader_compare.py --device cuda --workers 0,4,8,15 --out-dir "$d" \
                --note "bench/gpu_session.sh loader-compare" ;;
        scaleout)
            "$py" bench/studies/does_it_scale_over_ranks/scaleout.py --ranks 1,2 --repeats 3 --output "$d/scaleout.json" ;;
    esac
}

# --timeout=N where pytest-timeout is installed (the GPU image has it), else nothing and a note.
per_test_timeout() {
    if "$py" -c 'import pytest_timeout' 2>/dev/null; then
        echo "--timeout=$test_timeout"
    else
        echo "gpu_session: pytest-timeout is not installed: no per-test timeout" >&2
    fi
}

# The native reference: bench/native/build/nwt_native when built beforehand (and carried), else built
# now into a temporary folder with nvcc; nothing (and a note) without either.
native_binary() {
    local built=bench/native/build/nwt_native tmp
    if [ -x "$built" ]; then echo "$PWD/$built"; return; fi
    if [ -f bench/native/Makefile ] && command -v make >/dev/null && command -v nvcc >/dev/null; then
        tmp=$(mktemp -d)
        if make -s -C bench/native BUILD="$tmp" >&2; then echo "$tmp/nwt_native"; return; fi
        echo "gpu_session: building bench/native failed (above): the native reference is skipped" >&2
        return
    fi
    echo "gpu_session: no nvcc and no prebuilt $built: the native reference is skipped" >&2
}

# Files a device command returned (DIR/<device>/<step>.tgz, or DIR/<device>/<step>/ when cut off hard)
# into bench/results/<device>/<step>/.
unpack() {
    local src=$1 n=0 dev f name
    [ -d "$src" ] || { say "--unpack: $src is not a folder"; return 2; }
    for dev in "$src"/*/; do
        dev=${dev%/}
        name=$(basename "$dev")
        [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || continue
        mkdir -p "bench/results/$name"
        for f in "$dev"/*.tgz; do
            [ -f "$f" ] || continue
            rm -rf "bench/results/$name/$(basename "$f" .tgz)"  # a step's new run replaces its old files
            tar xzf "$f" -C "bench/results/$name" && n=$((n + 1)) && echo "bench/results/$name/$(basename "$f" .tgz)/"
        done
        for f in "$dev"/*/; do
            [ -d "$f" ] || continue
            rm -rf "bench/results/$name/$(basename "$f")"
            cp -R "${f%/}" "bench/results/$name/" && n=$((n + 1)) && echo "bench/results/$name/$(basename "$f")/ (cut off)"
        done
    done
    [ "$n" -gt 0 ] || { say "--unpack: no <device>/<step>.tgz or <device>/<step>/ under $src"; return 2; }
}

case "${1:-}" in
    --list)
        for s in "${STEPS[@]}"; do IFS='|' read -r name secs what <<<"$s"; printf '%-15s %4d s  %s\n' "$name" "$secs" "$what"; done
        exit 0 ;;
    --unpack)
        [ $# -eq 2 ] || { say "usage: --unpack DIR"; exit 2; }
        src=$2
        [[ $src = /* ]] || src="$start_dir/$src"  # relative to where the script was called from
        unpack "$src"; exit ;;
    --step-body)
        step_body "$2" "$3"; exit ;;
    -h | --help)
        usage; exit 0 ;;
    "")
        usage >&2; exit 2 ;;
esac

want=()
for arg in "$@"; do
    if [ "$arg" = all ]; then
        mapfile -t -O "${#want[@]}" want < <(names)
    elif names | grep -qxF -- "$arg"; then
        want+=("$arg")
    else
        say "unknown step '$arg'; steps: $(names | paste -sd' ') (or all; --list for estimates)"
        exit 2
    fi
done

device=$("$py" -c 'import re, sys
try:
    from cupy_nwt import cuda
    status = cuda.gpu_status()
    if not status.available:
        sys.exit(f"gpu_session: {status.reason}; no step can run")
    name = cuda.device_info(0).name
except SystemExit:
    raise
except BaseException as exc:
    first = (str(exc).splitlines() or [repr(exc)])[0]
    sys.exit(f"gpu_session: no usable GPU: the probe failed ({type(exc).__name__}: {first})")
print(re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "gpu")') || exit 3

# From a source tree the plugin's pytest11 entry point is not installed: load it by name instead
# (pytester's subprocess runs inherit this too).
if ! "$py" -c 'import importlib.metadata as m, sys
sys.exit(not any(e.name == "cupy_nwt" for e in m.entry_points(group="pytest11")))' 2>/dev/null; then
    export PYTEST_PLUGINS=cupy_nwt.pytest_plugin
fi

dest=${OUT:+$OUT/$device}
dest=${dest:-bench/results/$device}
mkdir -p "$dest"
status=0
for step in "${want[@]}"; do
    estimate=$(estimate_of "$step")
    room=$((budget - SECONDS - reserve))  # SECONDS counts from the script's start, the probe included
    if [ "$estimate" -gt "$room" ]; then
        say "NOT STARTED: $step (estimate $estimate s, $((room > 0 ? room : 0)) s left in this command; run it in the next one)"
        status=1
        continue
    fi
    d="$dest/$step"
    rm -rf "$d" "$dest/$step.tgz"
    mkdir -p "$d"
    echo "== $step (estimate $estimate s, at most $room s here) -> $d" >&2
    start=$SECONDS
    GPU_SESSION_STEP_DIR=$d timeout --signal=INT --kill-after="$grace" "$room" bash "$self" --step-body "$step" "$d" 2>&1 \
        | tee "$d/log.txt"
    rc=${PIPESTATUS[0]}
    took=$((SECONDS - start))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        say "CUT OFF: $step after $took s (past its estimate of $estimate s and the command's time); its files so far are kept"
        status=1
    elif [ "$rc" -ne 0 ]; then
        say "FAILED: $step (exit $rc) after $took s"
        status=1
    else
        say "done: $step in $took s"
    fi
    if [ -n "${OUT:-}" ]; then
        tar czf "$dest/$step.tgz" -C "$dest" "$step" && rm -rf "$d"
    fi
done
say "results in $dest$([ -n "${OUT:-}" ] && echo ' (bring them into bench/results/ with: bash bench/gpu_session.sh --unpack FILES_AT)')"
exit $status
