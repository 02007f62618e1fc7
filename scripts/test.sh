#!/usr/bin/env bash
# The whole test suite: set-up, formatting and lint checks, then every test (multi-rank ones
# run under mpirun at 1..5 ranks from the test harness).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's end is printed with the seconds since the start, and on exit (pass or fail) a
# table of each stage's wall time: where CI's time goes.
stages=() last=0
step() {
    echo "== test.sh: $* done at ${SECONDS} s" >&2
    stages+=("$(printf '%-32s %5d s' "$*" $((SECONDS - last)))")
    last=$SECONDS
}
summary() {
    # A stage failed while the fault trials ran beside it: stop them (each launch has a limit).
    [ -z "${faults:-}" ] || kill "$faults" 2>/dev/null || true
    echo "== test.sh: stage wall times (total ${SECONDS} s)" >&2
    printf '   %s\n' "${stages[@]}" >&2
}
trap summary EXIT
# Waits for the background job `$2` (named `$1`), shows its log `$3`, and fails if it did.
finish() {
    local rc=0
    wait "$2" || rc=$?
    cat "$3"
    if [ "$rc" != 0 ]; then
        echo "test.sh: $1 failed (exit $rc)" >&2
        exit 1
    fi
}
bash scripts/setup.sh
step setup
# The release profile without its cross-unit (thin local) LTO, for every build of this run: the
# two largest test binaries, the CI's longest builds, then compile in 213 s and 253 s instead of
# 368 s and 353 s (docs/testing.md). What the tests check does not depend on it; the published
# benchmark numbers are taken with the profile as it is.
export CARGO_PROFILE_RELEASE_LTO=off
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The device kernels and ptxas are installed by setup.sh: their checks may not skip here.
export DURALUMIN_REQUIRE_KERNELS=1
# The HIP device (Debian's libamdhip64-dev, installed by setup.sh) is compiled, linted, linked
# and tested with everything else: one lint pass, one build, with it. Its code only adds (no
# code is compiled only without it), so that pass lints the default build too; its test
# (tests/hip_device.rs) reports itself skipped without an AMD GPU.
export HIP_PATH=/usr
hip=(--features duralumin/hip)
cargo fmt --all --check
cargo clippy --workspace --all-targets --release "${hip[@]}" -- -D warnings
step clippy
# The API docs: every intra-doc link resolves (the kernels' builder is behind its feature). In
# the release profile, they use what the lint pass checked and built (the dependencies, the
# device kernels): 7 s, where the debug profile took 30 s of its own builds.
# Undefined behaviour in the unit tests of the unsafe code, under Miri (see the script): on its
# own toolchain and target directory, beside the docs and builds below (Miri interprets on one
# core; rustdoc and the builds leave part of the other idle). Its output is shown once it ends.
bash scripts/miri.sh > target/miri.log 2>&1 &
miri=$!
RUSTDOCFLAGS="-D warnings" cargo doc --release --no-deps -p duralumin -p duralumin-cudasim "${hip[@]}"
RUSTDOCFLAGS="-D warnings" cargo doc --release --no-deps -p duralumin-kernels --features builder
# The CUDA driver simulator (cudasim/, libcuda.so on the CPU): the HostTransfer<cuda> sweep runs
# on it (the cudasim_* trials of tests/device_ranks), which must not skip here.
cargo build --release -p duralumin-cudasim
cargo test --workspace --release "${hip[@]}" --no-run
finish miri "$miri" target/miri.log
step "builds and miri"
export DURALUMIN_REQUIRE_CUDASIM=1
# The simulated cluster (scripts/cluster.sh: network namespaces, as root): the cluster_* trials
# of tests/mpi_ranks and tests/device_ranks may not skip here.
export DURALUMIN_REQUIRE_CLUSTER=1
# A private one-node Slurm (scripts/slurm.sh, installed by setup.sh): duralumin-perf's srun
# trial, and the MPICH cut's srun launches, may not skip here; nor the trial that launches this
# build with MPICH's mpiexec (installed by setup.sh), which must be refused.
export DURALUMIN_REQUIRE_SLURM=1 DURALUMIN_REQUIRE_MPICH=1
# The cluster sweeps share 2 cores between up to 4 ranks (and, on cudasim, their simulated
# devices): allow each launch 30 minutes (a hang still ends within the per-operation deadline,
# DURALUMIN_TIMEOUT, with the ranks' report).
export DURALUMIN_LAUNCH_TIMEOUT=1800
# The fault trials (tests/faults) spend most of their time waiting out deadlines (they keep
# about 40 % of two cores busy): they run on their own, from their binary, beside the stages
# after this one; inside this run they report themselves ignored.
DURALUMIN_FAULTS_DEFERRED=1 cargo test --workspace --release "${hip[@]}"
step "cargo test"
faults_bin=$(cargo test --workspace --release "${hip[@]}" --test faults --no-run --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*/faults-[^"]*"' | cut -d'"' -f4)
if [ ! -x "$faults_bin" ]; then
    echo "test.sh: cannot find the tests/faults binary" >&2
    exit 1
fi
"$faults_bin" > target/faults.log 2>&1 &
faults=$!
# Recovery on ULFM: the survivor example and the elastic training example built against Open
# MPI 5 (installed by setup.sh), run with ranks killed; these trials may not skip here.
ulfm=${DURALUMIN_ULFM_DIR:-/opt/duralumin/openmpi5}
# The example uses no device kernels: skip their nested nightly builds. A debug build: it runs
# a few collectives, so optimizing it only costs build time; built once, so not incrementally,
# and with line tables only (as scripts/mpi-cut.sh builds, which reuses this target directory):
# 16 % less build time.
OPAL_PREFIX=$ulfm PATH="$ulfm/bin:$PATH" MPICC=$ulfm/bin/mpicc DURALUMIN_SKIP_KERNELS=1 \
    CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=line-tables-only \
    cargo build --example 03-survive-rank-loss --example 07-elastic-training --target-dir target/ulfm
DURALUMIN_ULFM_PREFIX=$ulfm DURALUMIN_ULFM_EXAMPLE=$PWD/target/ulfm/debug/examples/03-survive-rank-loss \
    DURALUMIN_ELASTIC_EXAMPLE=$PWD/target/ulfm/debug/examples/07-elastic-training \
    DURALUMIN_REQUIRE_ULFM=1 cargo test --workspace --release "${hip[@]}" --test ulfm --test elastic
step "ulfm and elastic"
# The suite's representative cut under the other MPIs a cluster runs (scripts/mpi-cut.sh):
# Open MPI 5 (in the ULFM builds' target directory) and MPICH (MPICH's ABI: MVAPICH2, Cray
# MPICH, Intel MPI), both installed by setup.sh.
bash scripts/mpi-cut.sh openmpi5 "$ulfm" target/ulfm
bash scripts/mpi-cut.sh mpich "${DURALUMIN_MPICH_DIR:-/opt/duralumin/mpich}"
step "Open MPI 5 and MPICH"
# The GPU benchmark programs must run to their end on the simulator (the multi-rank tests linked it
# as target/release/cudasim/libcuda.so). The HostTransfer one runs to 256 MiB (where a pinned
# allocation on the calling thread once deadlocked) under the simulator's timing model, two
# timed repetitions per row: its `fraction of bound` column is the pipeline's overlap.
LD_LIBRARY_PATH="$PWD/target/release/cudasim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" CUDASIM_COPY_GBPS=2 \
    timeout -k 10 600 cargo bench --workspace "${hip[@]}" --bench host_transfer_gpu -- --np 1,2 --max-bytes 268435456 --reps 2
# The same for the NCCL benchmark, on ncclsim (it verifies every path's result first).
LD_LIBRARY_PATH="$PWD/target/release/cudasim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    timeout -k 10 600 cargo bench --workspace "${hip[@]}" --bench nccl -- --np 1,2 --max-bytes 65536
step "GPU benches on the simulators"
finish tests/faults "$faults" target/faults.log
step "faults (from cargo test on)"
