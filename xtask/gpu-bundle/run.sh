#!/usr/bin/env bash
# cuda-mem GPU test bundle, built by `cargo xtask gpu-test`.
#
# Runs the probe (the driver questions cuda.h leaves open, answered on the real driver and then
# on the simulator beside it: $RESULTS/probe.json and probe-simulator.json), every test binary in
# tests/, then the demo, then the benchmarks (bench) against the real CUDA driver, writes each
# one's output to $RESULTS/<name>.log (the benchmarks' results.json, results.md and plots to
# $RESULTS/bench/), prints a line per binary and the totals, and exits non-zero if anything
# failed. Arguments are passed to every test binary (a name filter, --test-threads=N, ...). The
# tests that run Python beside Rust (sharing with cuda.core processes, DLPack, cuda.core's copies,
# graphs and managed memory) get the Python with the packed wheels installed, and the workspace's
# Python files, which the bundle carries.
#
# Then it compares with cuda.core (`xtask compare-bundle`): it installs the packed wheels into a
# folder of their own (no PyPI needed) and runs cuda.core's side with python3 on the same driver;
# the tables go to $RESULTS/bench/compare.md.
#
# Environment: CUDA_MEM_DRIVER (default libcuda.so.1), RESULTS (default ./results),
# TEST_TIMEOUT (seconds per binary, default 1800), CUDA_MEM_REQUIRE_GPU (default 1: a test that
# declares it cannot run here, say for want of a second GPU, fails; 0 lets it pass as skipped),
# PARTS (default "probe tests demo bench compare": the parts to run), CUDA_MEM_COMPARE_PYTHON
# (default python3: a Python 3.12, for the comparison and the tests that run Python; the wheels
# it needs, numpy's included, are packed), REHEARSE (1: run on the bundle's simulator as if it
# were a real driver, to find before a GPU run what would fail there for want of the simulator).
set -uo pipefail

home="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
results="${RESULTS:-./results}"
mkdir -p "$results" || exit 1
results="$(cd "$results" && pwd)"

# The programs travel packed (payload.tar.xz, to fit what can be carried): they are unpacked
# into a temporary folder, removed at exit, with the simulator copied beside the tests' folder
# (where the tests that load it explicitly, and the probe, look for it).
bundle="$(mktemp -d "${TMPDIR:-/tmp}/cuda-mem-bundle.XXXXXX")" || exit 1
trap 'rm -rf "$bundle"' EXIT
# unpack ARCHIVE DIR: extracts a .tar.xz with xz and tar, or with python3 (its lzma module)
# where xz is missing.
unpack() {
    if command -v xz >/dev/null 2>&1; then
        xz -dc "$1" | tar -xf - -C "$2"
    elif command -v python3 >/dev/null 2>&1; then
        python3 -c 'import sys, tarfile
extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **extra)' "$1" "$2"
    else
        echo "cannot unpack $1: neither xz nor python3 is here"
        return 1
    fi
}
unpack "$home/payload.tar.xz" "$bundle" || { echo "unpacking $home/payload.tar.xz failed"; exit 1; }
if [ -f "$home/libcuda_sim.so" ]; then
    cp "$home/libcuda_sim.so" "$bundle/" || exit 1
fi

echo "== machine"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi || echo "nvidia-smi failed"
    version="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
else
    echo "nvidia-smi: not found"
    version=""
fi
if [ -z "$version" ] && [ -r /proc/driver/nvidia/version ]; then
    version="$(head -n 1 /proc/driver/nvidia/version)"
fi
echo "driver version: ${version:-unknown}"

# REHEARSE=1: a rehearsal of the GPU run on this bundle's simulator with its own controls hidden
# (CUDA_SIM_HIDE_CONTROLS=1), so every test takes the path it takes on a real driver: a test
# that would need the simulator there fails here, before any GPU time is spent on it.
if [ "${REHEARSE:-0}" = 1 ]; then
    export CUDA_MEM_DRIVER="$bundle/libcuda_sim.so" CUDA_SIM_HIDE_CONTROLS=1
    echo "rehearsal: the simulator as if it were a real driver (CUDA_SIM_HIDE_CONTROLS=1)"
fi
export CUDA_MEM_DRIVER="${CUDA_MEM_DRIVER:-libcuda.so.1}"
export CUDA_MEM_REQUIRE_GPU="${CUDA_MEM_REQUIRE_GPU:-1}"
echo "CUDA_MEM_DRIVER=$CUDA_MEM_DRIVER CUDA_MEM_REQUIRE_GPU=$CUDA_MEM_REQUIRE_GPU"
# A driver named by its path (the simulator, say) is also what a library that loads the driver
# by name finds (cudarc opens `libcuda.so`): links under those names come first in the loader's
# path, so both sides of the interop tests share one driver, as they do on a GPU machine.
if [[ "$CUDA_MEM_DRIVER" == */* ]]; then
    links="$bundle/libcuda-links"
    mkdir -p "$links" || exit 1
    driver_path="$(cd "$(dirname "$CUDA_MEM_DRIVER")" && pwd)/$(basename "$CUDA_MEM_DRIVER")"
    ln -sf "$driver_path" "$links/libcuda.so" && ln -sf "$driver_path" "$links/libcuda.so.1" || exit 1
    export LD_LIBRARY_PATH="$links${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "libcuda.so, libcuda.so.1 -> $driver_path (first in LD_LIBRARY_PATH)"
fi
echo "unpacked into: $bundle"
echo "results: $results"

limit="${TEST_TIMEOUT:-1800}"
parts=" ${PARTS:-probe tests demo bench compare} "
# wants PART: whether PARTS names it.
wants() {
    [[ "$parts" == *" $1 "* ]]
}
total_passed=0
total_failed=0
total_cannot=0
# What a test that declared it cannot run on this machine fails with under
# CUDA_MEM_REQUIRE_GPU=1 (`cuda_sim::testing::skip`'s panic), before its reason.
cannot_mark='test cannot run here and CUDA_MEM_REQUIRE_GPU=1: '
summary=()

# with_timeout COMMAND...: runs COMMAND, killed after $limit seconds where `timeout` exists.
with_timeout() {
    if command -v timeout >/dev/null 2>&1; then
        timeout "$limit" "$@"
    else
        "$@"
    fi
}

# run_one NAME COMMAND...: runs COMMAND with its output in $results/NAME.log and records a line.
run_one() {
    local name="$1"
    shift
    local log="$results/$name.log"
    local start end status
    start="$(date +%s)"
    with_timeout "$@" >"$log" 2>&1
    status=$?
    end="$(date +%s)"
    local counts passed failed ignored
    # The binary's own summary is its last `test result:` line (a failing multi-process test
    # may quote its child's output, summary included, before it).
    counts="$(awk '/^test result:/ { last = $0 }
        END {
            n = split(last, w, " ")
            for (i = 2; i <= n; i++) {
                if (w[i] == "passed;") p = w[i - 1]
                if (w[i] == "failed;") f = w[i - 1]
                if (w[i] == "ignored;") g = w[i - 1]
            }
            print p + 0, f + 0, g + 0
        }' "$log")"
    read -r passed failed ignored <<<"$counts"
    local verdict="ok"
    local note=""
    # Tests that declared they cannot run on this machine (a second GPU, another driver
    # version), failed because CUDA_MEM_REQUIRE_GPU=1: counted apart, so that what broke stands out.
    local cannot
    cannot="$(grep -c -F -- "$cannot_mark" "$log")"
    if [ "$status" -ne 0 ]; then
        verdict="FAILED"
        if [ "$status" -eq 124 ]; then
            note=" (timed out after ${limit}s)"
        else
            note=" (exit status $status)"
        fi
        # A binary that failed without a failing test (a crash, a timeout) counts as one failure.
        if [ "$failed" -eq 0 ]; then
            failed=1
        fi
        if [ "$cannot" -gt "$failed" ]; then
            cannot="$failed"
        fi
        if [ "$status" -ne 124 ] && [ "$cannot" -eq "$failed" ]; then
            verdict="CANNOT"
        fi
        note="$note, $cannot of them could not run here"
    else
        cannot=0
    fi
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed - cannot))
    total_cannot=$((total_cannot + cannot))
    local line
    line="$(printf '%-6s %-44s %5d passed, %d failed, %d ignored, %ds%s' \
        "$verdict" "$name" "$passed" "$failed" "$ignored" "$((end - start))" "$note")"
    summary+=("$line")
    echo "$line"
    if [ "$status" -ne 0 ]; then
        if grep -q -- '\.\.\. FAILED$' "$log"; then
            grep -- '\.\.\. FAILED$' "$log" | sed 's/^/         /'
        else
            tail -n 20 "$log" | sed 's/^/         | /'
        fi
        echo "         full output: $log"
    fi
}

# run_part NAME LABEL COMMAND...: runs COMMAND with its output shown and in $results/NAME.log,
# and records a line under LABEL.
run_part() {
    local name="$1" label="$2"
    shift 2
    local start end verdict
    start="$(date +%s)"
    if with_timeout "$@" 2>&1 | tee "$results/$name.log"; then
        verdict="ok"
        total_passed=$((total_passed + 1))
    else
        verdict="FAILED"
        total_failed=$((total_failed + 1))
    fi
    end="$(date +%s)"
    summary+=("$(printf '%-6s %-44s %ds' "$verdict" "$label" "$((end - start))")")
}

# install_wheels PYTHON SITE: the packed wheels into the folder SITE, by pip, or by unzipping them
# where PYTHON has no pip (a distribution's python3 often comes without it): none of them has a
# .data folder or anything to build, so unzipped is installed, once the Python is the 3.12 they
# were packed for (pip checks that itself).
install_wheels() {
    if "$1" -m pip --version >/dev/null 2>&1; then
        "$1" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$2" "$bundle"/compare/wheels/*.whl
    elif ! "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
        echo "$1 is not the Python 3.12 the wheels were packed for"
        return 1
    else
        echo "$1 has no pip: unzipping the wheels into $2"
        rm -rf "$2" && "$1" -c 'import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])' "$2" "$bundle"/compare/wheels/*.whl
    fi
}

# The tests that run Python beside Rust (cuda.core's side of sharing, DLPack, copies, graphs,
# managed memory) need a Python with cuda.core, named by CUDA_MEM_PYTHON, and the workspace's
# Python files, found through CUDA_MEM_WORKSPACE: the packed wheels, installed as for the
# comparison, and the files the bundle carries. Without them those tests say SKIP and pass.
python_for_tests() {
    local python="${CUDA_MEM_COMPARE_PYTHON:-python3}"
    local site="${TMPDIR:-/tmp}/cuda-mem-python-tests-site"
    if [ ! -d "$bundle/compare/wheels" ] || [ ! -d "$bundle/workspace" ]; then
        echo "Python beside Rust: the bundle holds no wheels or no Python files; those tests will say SKIP"
    elif ! command -v "$python" >/dev/null 2>&1; then
        echo "Python beside Rust: no $python here; those tests will say SKIP"
    elif ! install_wheels "$python" "$site" >"$results/python-setup.log" 2>&1; then
        echo "Python beside Rust: the wheels could not be installed for $python (python-setup.log); those tests will say SKIP"
    else
        CUDA_MEM_PYTHON="$(command -v "$python")"
        PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        CUDA_MEM_WORKSPACE="$bundle/workspace"
        export CUDA_MEM_PYTHON PYTHONPATH CUDA_MEM_WORKSPACE
        if [ -f "$bundle/examples/libdlpack_ffi.so" ]; then
            export CUDA_MEM_DLPACK_FFI="$bundle/examples/libdlpack_ffi.so"
        fi
        echo "Python beside Rust: $CUDA_MEM_PYTHON ($("$python" --version 2>&1)), cuda.core from $site"
    fi
}

# The comparison with cuda.core: the packed wheels installed into a folder of their own.
compare_with_cuda_core() {
    local site="${TMPDIR:-/tmp}/cuda-mem-compare-site"
    install_wheels "${CUDA_MEM_COMPARE_PYTHON:-python3}" "$site" || return 1
    PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$bundle/xtask" compare-bundle "$bundle" "$results/bench"
}

if wants probe; then
    echo
    echo "== probe"
    run_part probe "probe (report in $results/probe.json)" env PROBE_OUT="$results" "$bundle/probe"
fi

if wants tests; then
    echo
    echo "== tests"
    python_for_tests
    for binary in "$bundle"/tests/*; do
        [ -f "$binary" ] || continue
        run_one "$(basename "$binary")" "$binary" "$@"
    done
fi

if wants demo; then
    echo
    echo "== demo"
    mkdir -p "$results/demo"
    # The demo's memory snapshot (JSON, the viewer's page, the timeline's SVG) comes back with
    # the results.
    run_part demo "demo (snapshot in $results/demo)" env DEMO_OUT="$results/demo" "$bundle/demo"
fi

if wants bench; then
    echo
    echo "== bench"
    mkdir -p "$results/bench"
    run_part bench "bench (results in $results/bench)" env BENCH_OUT="$results/bench" "$bundle/bench"
fi

if wants compare; then
    echo
    echo "== compare with cuda.core"
    if [ ! -d "$bundle/compare/wheels" ]; then
        echo "skipped: the bundle holds no wheels of cuda.core"
    elif [ ! -f "$results/bench/results.json" ]; then
        echo "skipped: no results of bench in $results/bench (PARTS must include bench, or an earlier run's results be there)"
    else
        export -f compare_with_cuda_core install_wheels
        export bundle results
        run_part compare "compare (tables in $results/bench/compare.md)" bash -c compare_with_cuda_core
    fi
fi

echo
echo "== summary"
for line in "${summary[@]}"; do
    echo "$line"
done
echo "$total_passed passed, $total_failed failed"
if [ "$total_cannot" -gt 0 ]; then
    echo "$total_cannot more could not run on this machine (declared; failed because CUDA_MEM_REQUIRE_GPU=1):"
    grep -h -F -- "$cannot_mark" "$results"/*.log | sed "s/^.*$cannot_mark/  /" | sort | uniq -c
fi
[ "$total_failed" -eq 0 ] && [ "$total_cannot" -eq 0 ]
