#!/usr/bin/env bash
# The representative cut of the suite under an MPI other than the one the suite is built
# against (Debian's Open MPI 4.1): the Mpi backend's sweep with the p2p, bad-input, engine and
# topology groups at 1..4 ranks, the argument checks at 1..4, the Mpi backend's fault trials
# and the host examples (01, 02, 04). A debug build without the device kernels, in its own
# target directory (`docs/cluster.md`, "Which MPIs are tested").
#
# Usage: scripts/mpi-cut.sh mpich|openmpi5 PREFIX [TARGET_DIR]
#   mpich     PREFIX holds MPICH (bin/mpicc, bin/mpiexec, lib/): the PyPI `mpich` wheel's data
#   openmpi5  PREFIX holds Open MPI 5 (bin/mpicc, bin/mpirun, lib/), relocated (OPAL_PREFIX)
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 prefix=$2 target=${3:-target/$1}
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
case $name in
mpich) mpirun=$prefix/bin/mpiexec ;;
openmpi5)
    mpirun=$prefix/bin/mpirun
    export OPAL_PREFIX=$prefix PATH="$prefix/bin:$PATH"
    export PRTE_ALLOW_RUN_AS_ROOT=1 PRTE_ALLOW_RUN_AS_ROOT_CONFIRM=1
    ;;
*)
    echo "mpi-cut.sh: unknown MPI '$name' (mpich or openmpi5)" >&2
    exit 2
    ;;
esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The device kernels, the simulators and the simulated cluster belong to the main run.
unset DURALUMIN_REQUIRE_CUDASIM DURALUMIN_REQUIRE_CLUSTER DURALUMIN_REQUIRE_KERNELS
# Built once: not incrementally, and with line tables only (file and line in backtraces, no
# variable records), which cut the build by 16 % (94 s to 79 s under MPICH). scripts/test.sh
# builds the ULFM examples in Open MPI 5's target directory the same way, so they share it.
cargo_() {
    local sub=$1
    shift
    MPICC=$prefix/bin/mpicc DURALUMIN_SKIP_KERNELS=1 CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=line-tables-only \
        cargo "$sub" --target-dir "$target" "$@"
}
cargo_ build -q --example 01-allreduce --example 02-custom-op --example 04-host-transfer
cargo_ test -q --no-run --test mpi_ranks --test argcheck --test faults --test examples
export DURALUMIN_MPIRUN=$mpirun DURALUMIN_LAUNCH_TIMEOUT=600
echo "== mpi-cut.sh: $name ($("$mpirun" --version 2>&1 | grep -m1 -iE 'version|open mpi|prte' | tr -s ' '))"
DURALUMIN_RANK_GROUPS=sweep+p2p+bad_input+engine+topology cargo_ test -q --test mpi_ranks -- mpi_np --skip mpi_np5
cargo_ test -q --test argcheck -- --skip np5
cargo_ test -q --test examples -- --skip cudasim --skip gpu
# The Mpi backend's faults; the mismatch sweeps (30 s and more per rank count in a debug
# build) are the main run's.
skip=(--skip mismatch)
cargo_ test -q --test faults -- mpi_ "${skip[@]}"
# Under Slurm's srun, on a private one-node Slurm (scripts/slurm.sh): MPICH's PMI-2 wires the
# tasks into one job; with no PMI (`--mpi=none`) each task is an MPI job of one rank, which
# `duralumin::init` refuses (Error::UnwiredLaunch) instead of letting each reduce alone.
if [ "$name" = mpich ]; then
    if scripts/slurm.sh check; then
        example=$target/debug/examples/01-allreduce
        timeout -k 5 120 scripts/slurm-srun --overcommit -n 2 --mpi=pmi2 "$example" | grep -qx ok ||
            { echo "mpi-cut.sh: 01-allreduce under srun --mpi=pmi2 failed" >&2; exit 1; }
        if out=$(timeout -k 5 120 scripts/slurm-srun --overcommit -n 2 --mpi=none "$example" 2>&1) ||
            ! grep -q UnwiredLaunch <<<"$out"; then
            echo "mpi-cut.sh: srun --mpi=none was not refused:" >&2
            echo "$out" >&2
            exit 1
        fi
        echo "== mpi-cut.sh: srun --mpi=pmi2 ran 01-allreduce; --mpi=none was refused"
    elif [ "${DURALUMIN_REQUIRE_SLURM:-}" = 1 ]; then
        exit 1
    fi
fi
