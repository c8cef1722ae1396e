#!/usr/bin/env bash
# The project's GPU work on a GPU machine, as named steps, most important first, in commands of
# under 10 minutes each (GPU_SESSION_SECONDS bounds each one).
#
#     bash bench/gpu_session.sh --list          # one line per step: name, estimated seconds, what it runs
#     bash bench/gpu_session.sh STEP...          # run these steps in order; 'all' runs every one
#     bash bench/gpu_session.sh --unpack DIR     # packed steps ($OUT below) -> bench/results/<device>/
#     bash bench/gpu_session.sh --prepare-before [REV]  # before it: REV's cupy_nwt/ (default 7ebea86) into
#                                                # .gpu-run/before/, ignored by git; copy .gpu-run along
#                                                # where the GPU machine gets the tree without its history
#     bash bench/gpu_session.sh --prepare-wheels # before it: nvImageCodec's wheels (~30 MiB) into .whl/,
#                                                # ignored by git; copy .whl along (the GPU machine may be offline)
#
# The steps are listed by what the project exists for, so whatever a time budget cuts off matters
# least: the first command is `info transfers gpu-tests nwt gpu-feed gpu-decode` (465 s, below), the
# second, only where time is left, `loader-compare decode-placement` (190 s); the third, `scaleout`
# (125 s), past the 15 minutes the first two fill.
#
# Each step works in <work>/<step>/ (its output in log.txt there, its timing in step.json), where
# <work> is bench/results/<device> without $OUT and a scratch folder with it; with $OUT set, a
# finished step is packed into $OUT/<device>/<step>.tgz, one file per step (at most 6 a command), and nothing
# else is written under $OUT (a way to take the results off a remote machine). The whole script ends
# by GPU_SESSION_SECONDS (default 540) after it starts, the GPU probe included. A step starts only if its
# estimate fits in what is left less the kill grace (GPU_SESSION_KILL_GRACE, 20 s) and 10 s to
# pack; it runs at most twice its estimate (so one hung step cannot take the later ones) and never
# past the deadline, then is interrupted (SIGINT, SIGKILL after the grace) and its files are packed;
# a step that does not fit prints NOT STARTED, and later steps that still fit run. GPU tests get a
# per-test timeout (pytest-timeout, on the GPU image).
# GPU_SESSION_ESTIMATES="step=seconds,..." replaces built-in estimates (say, with the times a GPU
# run printed in its "done: STEP in N s" lines, also kept in each step's step.json).
# GPU_SESSION_NWT_SCALE (default 1) scales the NWT step's batches per count (the paper's 100) and
# its estimate; the scale is written beside its results (scale.json).
# PYTHON names the interpreter (default python3): a stand-in one lets tests run the script dry.
#
# The seconds are what each step took on the project's GPU runs (two on an NVIDIA H200, one on an H100; 16 cores,
# Python 3.12, CuPy 14.2 for CUDA 13), from their step.json under bench/results/<device>/.
# Exit: 0 every step passed; 1 a step failed, was cut off or not started; 2 bad arguments; 3 no usable
# GPU (one line).
set -uo pipefail
start_dir=$PWD
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
budget=${GPU_SESSION_SECONDS:-540}
grace=${GPU_SESSION_KILL_GRACE:-20}
reserve=$((grace + 10))  # what a cut-off step needs after its timeout: the kill grace, then packing
test_timeout=60          # per GPU test: the slowest (a pytester run in a fresh interpreter) ~10 s
nwt_scale=${GPU_SESSION_NWT_SCALE:-1}

# name|seconds|what it runs. Each figure is a step's `done: STEP in N s` on a GPU run, kept in
# bench/results/<device>/<step>/step.json (the first H200 run's, the H100's), with the estimates
# derived beforehand from the CPU-side costs (bench/studies/how_long_do_the_gpu_steps_take/session_costs.py) beside them. A step may run twice
# its figure, so a measured one is margin enough; a step whose work changed since is named.
STEPS=(
    # 4 s measured (estimated 15); 4 s on the H100
    "info|4|host and GPU facts: cupy-nwt info (text, JSON), nvidia-smi -q, lscpu, pip list, /dev/shm"
    # 34 s on the H100 for one round of each; now three rounds, cupy_nwt and native alternated, and the
    # overlap sweep (18 in-process runs): 3 x ~10 s + the ~10-s build + ~25 s, unmeasured
    "transfers|65|3 alternated rounds of cupy-nwt bandwidth / overlap and bench/native (nvcc there), native_report.py's shares with intervals; bench/studies/are_transfers_as_fast_as_cuda_c/overlap_sweep.py over 2, 4, 8 streams (chunks) at 16 and 64 MiB, 3 rounds"
    # 49 s on the H100 while two blocks failed in 5 ms; passing, they took 48 s more: ~100 s
    "gpu-tests|100|pytest -m gpu tests/ bench/ (junit.xml; bench/'s 64 MiB copies and idle fraction in benchmark.json), 60 s per test at most"
    # 145 s on the first H200, 113 s after the preload, 51 s on the H100 after the later start-up fixes
    # (the figure now); see NWT_FIXED for the scaled figure
    "nwt|51|cupy-nwt reproduce --no-gpu --max-workers 16: NWT Algorithm 1 and the fast search over 0..15 workers on the GPU, CIFAR-10 shape, batch 128, picks re-measured (scale.json)"
    # 53 s on the H100 for 32 loops of 0.75 s; now 24 loops of 5 s (8 rows x 3 repeats, a fresh loader
    # each) + the same ~25 s of set-up and starts, unmeasured
    "gpu-feed|145|bench/studies/does_the_gpu_wait_for_batches/gpu_feed.py --workers 4,15 --modes cupy_nwt,torch --loops queued --seconds 5 --repeats 3: GPU idle per step against torch's, judged against 5 %"
    # ~90 s by its own account (3 rounds of the decode, pipeline and read arms over 1,024 photographs'
    # crops) + ~10 s to install the wheels brought along, unmeasured
    "gpu-decode|100|bench/studies/does_the_gpu_decode_jpegs/gpu_decode.py: images/s of nvImageCodec on ImageNet-size JPEGs, two host cores reading (wheels from .whl/ where present)"
    # 90 s on the H100 with 30 batches at 0, 4 and 15 workers and the tiny arrays; now 300 batches after
    # the start-up batches, at 4, 15 and 16, torch and cupy_nwt only: ~36 runs of ~1.5 s + set-up, unmeasured
    "loader-compare|70|bench/studies/is_the_loader_faster_than_torch/loader_compare.py --device cuda --workers 4,15,16 --batches 300 --repeats 3: samples/s and the first batch against torch's, paired per repeat; bench/studies/what_does_the_loader_itself_cost/tiny_arrays.py against .gpu-run/before where present (not in the estimate)"
    # unmeasured: ~10 s for the wheels and imports, ~5 s to make 256 photographs' crops, then two fast
    # searches over 0..16 counts at batch 256 with a 5-ms step: the CPU placement's within its budget of
    # a quarter of an exhaustive search (~17 x 100 batches of 0.05-0.5 s: up to ~75 s), the GPU
    # placement's trials mostly start-up (~15 of ~2 s)
    "decode-placement|120|bench/studies/does_the_gpu_decode_jpegs/decode_placement.py: the tuner's decode placement for ImageNet-size JPEGs and a 5-ms step, CPU workers against the GPU decode fed by readers, each at its own count (wheels from .whl/ where present)"
    # the H100's 6 runs ~19 s apart took ~115 s (cut off at 118 s, its file written); + ~10 s for the
    # copy-engine check (two spawned processes, 3 rounds of 2 + 2 s)
    "scaleout|125|bench/studies/does_it_scale_over_ranks/scaleout.py --ranks 1,2 --repeats 3 --workers budget: two ranks sharing the GPU; copy_engines.py: two processes' pinned 256 MiB H2D copies against one's"
)

# The NWT step at GPU_SESSION_NWT_SCALE: its fixed costs (builds, imports, plots, the ~90 trials'
# starts) stay, its batches per trial scale; at 1 these are the paper's 100 and reproduce's defaults.
# It was measured at scale 1 only: the split of its 51 s keeps the first estimate's 120:100
# (unmeasured).
NWT_FIXED=28 NWT_VARIABLE=23
nwt_args() {
    awk -v s="$nwt_scale" 'BEGIN { i = int(100 * s + 0.5); c = int(50 * s + 0.5);
        printf "--iterations %d --compare-iterations %d --compare-repeats 3 --judge-repeats 9", (i < 10 ? 10 : i), (c < 5 ? 5 : c) }'
}

# A step's estimate: GPU_SESSION_ESTIMATES's when it names the step, else the built-in one (the NWT
# step's scaled by GPU_SESSION_NWT_SCALE).
estimate_of() {
    local pair
    for pair in ${GPU_SESSION_ESTIMATES:+${GPU_SESSION_ESTIMATES//,/ }}; do
        if [ "${pair%%=*}" = "$1" ] && [[ ${pair#*=} =~ ^[0-9]+$ ]]; then echo "${pair#*=}"; return; fi
    done
    if [ "$1" = nwt ]; then
        awk -v s="$nwt_scale" -v f="$NWT_FIXED" -v v="$NWT_VARIABLE" 'BEGIN { e = f + v * s; printf "%d\n", (e == int(e) ? e : int(e) + 1) }'
        return
    fi
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
            { nproc; lscpu; } >"$d/lscpu.txt" 2>&1 || true
            "$py" -m pip list >"$d/pip-list.txt" 2>/dev/null || true
            df -B1 /dev/shm >"$d/dev-shm.txt" 2>&1 || true
            cat "$d/info.txt" ;;
        transfers)
            # cupy_nwt and native alternate, three rounds (-r2, -r3 after the first's plain names), so
            # the shares' intervals hold a drift of the clocks or a neighbour's load
            local native round sfx plot
            native=$(native_binary)
            for round in 1 2 3; do
                sfx=$([ "$round" = 1 ] || echo "-r$round")
                plot=$([ "$round" = 1 ] && echo "$d/bandwidth.png" || echo "$d/bandwidth$sfx.png")
                "$py" -m cupy_nwt bandwidth --no-progress --output "$d/bandwidth$sfx.json" --plot "$plot"
                if [ -n "$native" ]; then "$native" bandwidth >"$d/native-bandwidth$sfx.json"; fi
                "$py" -m cupy_nwt overlap --no-progress --output "$d/overlap$sfx.json"
                if [ -n "$native" ]; then "$native" overlap >"$d/native-overlap$sfx.json"; fi
            done
            if [ -n "$native" ]; then "$py" bench/studies/are_transfers_as_fast_as_cuda_c/native_report.py "$d"; fi
            "$py" bench/studies/are_transfers_as_fast_as_cuda_c/overlap_sweep.py --streams 2,4,8 --sizes 16MiB,64MiB --rounds 3 --output "$d/overlap_sweep.json" ;;
        gpu-tests)
            "$py" -m pytest -m gpu -q -p no:cacheprovider tests bench --junitxml="$d/junit.xml" \
                --benchmark-json="$d/benchmark.json" $(per_test_timeout) ;;
        nwt)
            # --no-gpu leaves out the transfer experiments (the transfers step's); the trials still
            # take their batches to the GPU
            local args
            args=$(nwt_args)
            printf '{"scale": %s, "arguments": "%s", "paper": "--iterations 100 --compare-iterations 50 --compare-repeats 3 --judge-repeats 9", "estimate_s": %s}\n' \
                "$nwt_scale" "$args" "$(estimate_of nwt)" >"$d/scale.json"
            # shellcheck disable=SC2086
            "$py" -m cupy_nwt reproduce --no-gpu --no-progress --max-workers 16 $args --out "$d" ;;
        gpu-feed)
            "$py" bench/studies/does_the_gpu_wait_for_batches/gpu_feed.py --workers 4,15 --modes cupy_nwt,torch \
                --loops queued --seconds 5 --repeats 3 --out-dir "$d" ;;
        gpu-decode)
            install_wheels
            "$py" bench/studies/does_the_gpu_decode_jpegs/gpu_decode.py --out-dir "$d" ;;
        loader-compare)
            # 300 timed batches after the start-up's; 16 workers beside 15 for the first batch
            "$py" bench/studies/is_the_loader_faster_than_torch/loader_compare.py --device cuda --workers 4,15,16 \
                --loaders cupy_nwt,torch --batches 300 --repeats 3 --out-dir "$d" --note "bench/gpu_session.sh loader-compare"
            # where the main process is the limit sooner than at 2 workers: the loader before its
            # per-batch cost was cut (.gpu-run/before) and now, interleaved, against the floor's ceiling
            if [ -d .gpu-run/before/cupy_nwt ]; then
                "$py" bench/studies/what_does_the_loader_itself_cost/tiny_arrays.py --before .gpu-run/before --after . --workers 0,8,15 --rounds 5 --repeats 1 \
                    --batches 2000 --out "$d/tiny_arrays.json" --note "bench/gpu_session.sh loader-compare"
            else
                echo "gpu_session: no .gpu-run/before/cupy_nwt (bash bench/gpu_session.sh --prepare-before, with the repository's history): the tiny-arrays before/after is skipped"
            fi ;;
        decode-placement)
            install_wheels
            "$py" bench/studies/does_the_gpu_decode_jpegs/decode_placement.py --out-dir "$d" ;;
        scaleout)
            "$py" bench/studies/does_it_scale_over_ranks/scaleout.py --ranks 1,2 --repeats 3 --workers budget --output "$d/scaleout.json"
            "$py" bench/studies/does_it_scale_over_ranks/copy_engines.py --mib 256 --seconds 2 --rounds 3 --output "$d/copy_engines.json" ;;
    esac
}

# nvImageCodec (and nvJPEG for CUDA 13.0) from the wheels in .whl/ where they were brought along (the
# machine has no network): into the interpreter, and where it refuses as externally managed, again
# past that (the machine is discarded after the run). Not into a folder put on PYTHONPATH: the
# wheels' nvidia/__init__.py would hide the nvidia/ packages CuPy finds its libraries in. Without
# wheels, one line.
WHEELS=("nvidia-nvimgcodec-cu13[nvjpeg]" "nvidia-nvjpeg==13.0.*")
install_wheels() {
    if ! compgen -G ".whl/*.whl" >/dev/null; then
        echo "gpu_session: no wheels in .whl/ (bash bench/gpu_session.sh --prepare-wheels, then copy .whl along with the tree): nvImageCodec only where the machine has it"
        return 0
    fi
    if "$py" -m pip install -q --no-index --find-links .whl "${WHEELS[@]}" 2>/dev/null; then
        echo "gpu_session: installed ${WHEELS[*]} from .whl/"
    elif "$py" -m pip install -q --no-index --find-links .whl --break-system-packages "${WHEELS[@]}"; then
        echo "gpu_session: installed ${WHEELS[*]} from .whl/ (--break-system-packages)"
    else
        echo "gpu_session: installing ${WHEELS[*]} from .whl/ failed (above)"
    fi
}

# The wheels install_wheels takes, downloaded here for the GPU machine's Python 3.12 on x86-64.
prepare_wheels() {
    mkdir -p .whl
    "$py" -m pip download -q --python-version 3.12 --only-binary=:all: --platform manylinux2014_x86_64 -d .whl \
        "${WHEELS[@]}" || { say "--prepare-wheels: pip download failed (above)"; return 1; }
    echo ".whl/: $(find .whl -maxdepth 1 -type f -name '*.whl' | wc -l) wheels, $(du -sk .whl | cut -f1) KiB, ignored by git; copy .whl along with the tree"
}

# --timeout=N where pytest-timeout is installed (the GPU image has it), else nothing and a note.
per_test_timeout() {
    if "$py" -c 'import pytest_timeout' 2>/dev/null; then
        echo "--timeout=$test_timeout"
    else
        echo "gpu_session: pytest-timeout is not installed: no per-test timeout" >&2
    fi
}

# The native reference: bench/native/build/nwt_native when built beforehand (and copied along with the tree) and it
# loads there (its dry run answers), else built now into a temporary folder with nvcc; nothing (and
# a note) without either.
native_binary() {
    local built=bench/native/build/nwt_native tmp rc
    if [ -x "$built" ]; then
        "$built" bandwidth --dry-run >/dev/null 2>&1 && rc=0 || rc=$?
        if [ "$rc" -le 3 ]; then echo "$PWD/$built"; return; fi
        echo "gpu_session: the prebuilt $built does not start here (exit $rc): building it again" >&2
    fi
    if [ -f bench/native/Makefile ] && command -v make >/dev/null && command -v nvcc >/dev/null; then
        tmp=$(mktemp -d)
        if make -s -C bench/native BUILD="$tmp" >&2; then echo "$tmp/nwt_native"; return; fi
        echo "gpu_session: building bench/native failed (above): the native reference is skipped" >&2
        return
    fi
    echo "gpu_session: no nvcc (or no bench/native/) and no working prebuilt $built: the native reference is skipped" >&2
}

# The before tree of loader-compare's tiny-arrays comparison, for a GPU machine that gets the working
# tree without git history: REV's cupy_nwt/ by `git archive` into .gpu-run/before/, its commit in
# REVISION there; .gpu-run/ goes into .git/info/exclude, so git ignores it and it is copied on purpose.
prepare_before() {
    local rev=${1:-7ebea86} dest=.gpu-run/before commit exclude
    commit=$(git rev-parse --verify --quiet "$rev^{commit}" 2>/dev/null) \
        || { say "--prepare-before: '$rev' is not a revision of $PWD"; return 2; }
    exclude=$(git rev-parse --git-path info/exclude)
    rm -rf "$dest" && mkdir -p "$dest" "$(dirname "$exclude")"
    git archive "$commit" cupy_nwt | tar x -C "$dest" || { say "--prepare-before: git archive of $commit failed"; return 1; }
    echo "$commit" >"$dest/REVISION"
    grep -qxF /.gpu-run/ "$exclude" 2>/dev/null || echo /.gpu-run/ >>"$exclude"
    echo "$dest/: cupy_nwt/ of $commit, $(du -sk "$dest" | cut -f1) KiB, ignored by git; copy .gpu-run along with the tree"
}

# Steps packed under $OUT (DIR/<device>/<step>.tgz, or DIR/<device>/<step>/ from older runs)
# into bench/results/<device>/<step>/; a step's new files replace its old ones, other steps stay.
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
            rm -rf "bench/results/$name/$(basename "$f" .tgz)"
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

# The variables that shape a run, refused in one line before anything uses them.
check_settings() {
    local v pair
    for v in "$budget" "$grace"; do
        [[ $v =~ ^[0-9]+$ ]] || { say "GPU_SESSION_SECONDS and GPU_SESSION_KILL_GRACE take whole seconds, got '$v'"; exit 2; }
    done
    if ! [[ $nwt_scale =~ ^(0?\.[0-9]+|1(\.0*)?)$ ]] || awk -v s="$nwt_scale" 'BEGIN { exit !(s < 0.1) }'; then
        say "GPU_SESSION_NWT_SCALE takes a number from 0.1 to 1, got '$nwt_scale'"
        exit 2
    fi
    for pair in ${GPU_SESSION_ESTIMATES:+${GPU_SESSION_ESTIMATES//,/ }}; do
        if ! [[ ${pair#*=} =~ ^[0-9]+$ && $pair = *=* ]] || ! names | grep -xF -- "${pair%%=*}" >/dev/null; then
            say "GPU_SESSION_ESTIMATES takes step=seconds,... with steps $(names | paste -sd' '), got '$pair'"
            exit 2
        fi
    done
}

case "${1:-}" in
    --list)
        check_settings
        for s in "${STEPS[@]}"; do
            IFS='|' read -r name secs what <<<"$s"
            printf '%-16s %4d s  %s\n' "$name" "$(estimate_of "$name")" "$what"
        done
        exit 0 ;;
    --unpack)
        [ $# -eq 2 ] || { say "usage: --unpack DIR"; exit 2; }
        src=$2
        [[ $src = /* ]] || src="$start_dir/$src"  # relative to where the script was called from
        unpack "$src"; exit ;;
    --prepare-before)
        [ $# -le 2 ] || { say "usage: --prepare-before [REV]"; exit 2; }
        prepare_before "${2:-}"; exit ;;
    --prepare-wheels)
        [ $# -eq 1 ] || { say "usage: --prepare-wheels"; exit 2; }
        prepare_wheels; exit ;;
    --step-body)
        step_body "$2" "$3"; exit ;;
    -h | --help)
        usage; exit 0 ;;
    "")
        usage >&2; exit 2 ;;
esac

check_settings
want=()
for arg in "$@"; do
    if [ "$arg" = all ]; then
        mapfile -t -O "${#want[@]}" want < <(names)
    elif names | grep -xF -- "$arg" >/dev/null; then  # not -q: grep leaving early would break the pipe (pipefail)
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

# With $OUT, steps work in a scratch folder and only their packed files land under $OUT: one file a
# step, easy to take off a remote machine whatever the step wrote.
if [ -n "${OUT:-}" ]; then
    dest=$OUT/$device
    work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_session.XXXXXX")
else
    dest=bench/results/$device
    work=$dest
fi
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
    limit=$((2 * estimate < room ? 2 * estimate : room))
    d="$work/$step"
    rm -rf "$d" "$dest/$step.tgz"
    mkdir -p "$d"
    echo "== $step (estimate $estimate s, at most $limit s; $room s left) -> $d" >&2
    began=$SECONDS
    GPU_SESSION_STEP_DIR=$d timeout --signal=INT --kill-after="$grace" "$limit" bash "$self" --step-body "$step" "$d" 2>&1 \
        | tee "$d/log.txt"
    rc=${PIPESTATUS[0]}
    took=$((SECONDS - began))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        outcome="cut off"
        say "CUT OFF: $step after $took s (its limit was $limit s: twice its estimate of $estimate s, or the command's time left); its files so far are kept"
        status=1
    elif [ "$rc" -ne 0 ]; then
        outcome="failed"
        say "FAILED: $step (exit $rc) after $took s"
        status=1
    else
        outcome="done"
        say "done: $step in $took s"
    fi
    printf '{"step": "%s", "outcome": "%s", "exit": %d, "seconds": %d, "estimate_s": %d, "limit_s": %d, "started_at_s": %d, "deadline_s": %d}\n' \
        "$step" "$outcome" "$rc" "$took" "$estimate" "$limit" "$began" "$budget" >"$d/step.json"
    if [ -n "${OUT:-}" ]; then
        tar czf "$dest/$step.tgz" -C "$work" "$step" && rm -rf "$d"
    fi
done
[ -z "${OUT:-}" ] || rm -rf "$work"
say "results in $dest$([ -n "${OUT:-}" ] && echo ' (bring them into bench/results/ with: bash bench/gpu_session.sh --unpack <the folder they came back in>)') after $SECONDS s"
exit $status
