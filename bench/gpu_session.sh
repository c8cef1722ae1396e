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
# Steps end by GPU_SESSION_SECONDS (default 560) after the start: a step still running then is
# interrupted (SIGINT, then SIGKILL 20 s later), its files are packed, and later steps are not started,
# so a command never reaches the device's 600-s kill with its results unpacked.
#
# The seconds are ESTIMATES for a 16-core H100 machine, worked out from what each step does (copy
# sizes, worker counts, batches, repeats; CPU timings of the tuner on a 2-core VM); no step has run
# on a GPU yet. Exit: 0 every step passed; 1 a step failed, was cut off or not started; 2 bad
# arguments; 3 no usable GPU (one line saying why).
set -uo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

# name|estimated seconds|what it runs
STEPS=(
    "info|20|cupy-nwt info (text and JSON), nvidia-smi -q, pip list, /dev/shm size"
    "gpu-tests|180|pytest -m gpu tests/ (junit.xml)"
    "gpu-bench|60|pytest -m gpu bench/: 64 MiB copies, GPU idle with/without prefetch (benchmark.json)"
    "transfers|60|cupy-nwt bandwidth (4 KiB..256 MiB, pinned vs pageable, plot) and cupy-nwt overlap"
    "nwt|270|cupy-nwt reproduce --no-gpu: NWT paper and fast strategies over 0..15 workers, picks re-measured"
    "gpu-feed|150|bench/gpu_feed.py --workers 4,8,15: GPU idle fraction, cupy_nwt vs no-prefetch vs torch"
    "loader-compare|240|bench/loader_compare.py --device cuda --workers 0,4,8,15"
    "scaleout|180|bench/scaleout.py --ranks 1,2 --repeats 3: two ranks sharing the GPU"
)

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
            "$py" -m pytest -m gpu -q -p no:cacheprovider tests --junitxml="$d/junit.xml" ;;
        gpu-bench)
            "$py" -m pytest -m gpu -q -p no:cacheprovider bench --junitxml="$d/junit.xml" \
                --benchmark-json="$d/benchmark.json" ;;
        transfers)
            "$py" -m cupy_nwt bandwidth --no-progress --output "$d/bandwidth.json" --plot "$d/bandwidth.png"
            "$py" -m cupy_nwt overlap --no-progress --output "$d/overlap.json" ;;
        nwt)
            "$py" -m cupy_nwt reproduce --no-gpu --no-progress --out "$d" ;;
        gpu-feed)
            "$py" bench/gpu_feed.py --workers 4,8,15 --out-dir "$d" ;;
        loader-compare)
            "$py" bench/loader_compare.py --device cuda --workers 0,4,8,15 --out-dir "$d" \
                --note "bench/gpu_session.sh loader-compare" ;;
        scaleout)
            "$py" bench/scaleout.py --ranks 1,2 --repeats 3 --output "$d/scaleout.json" ;;
    esac
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
        unpack "$2"; exit ;;
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
deadline=$((SECONDS + ${GPU_SESSION_SECONDS:-560}))
status=0
cut=""
for step in "${want[@]}"; do
    left=$((deadline - SECONDS))
    if [ -n "$cut" ] || [ "$left" -le 0 ]; then
        say "NOT STARTED: $step (no time left in this command; run it in the next one)"
        status=1
        continue
    fi
    d="$dest/$step"
    rm -rf "$d" "$dest/$step.tgz"
    mkdir -p "$d"
    echo "== $step (estimate $(printf '%s\n' "${STEPS[@]}" | grep "^$step|" | cut -d'|' -f2) s, at most $left s here) -> $d" >&2
    start=$SECONDS
    GPU_SESSION_STEP_DIR=$d timeout --signal=INT --kill-after=20 "$left" bash "$self" --step-body "$step" "$d" 2>&1 \
        | tee "$d/log.txt"
    rc=${PIPESTATUS[0]}
    took=$((SECONDS - start))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        say "CUT OFF: $step after $took s (the command's time was up); its files so far are kept"
        cut=1
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
