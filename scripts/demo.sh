#!/usr/bin/env bash
# The main demo: a 4-rank allreduce under mpirun, then about 10 seconds of duralumin-perf
# (allreduce at 2 ranks, 8 B to 64 MiB: Duralumin's Mpi backend against MPI's own).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cargo build --release --example 01-allreduce --bin duralumin-perf
timeout 120 mpirun --oversubscribe -np 4 target/release/examples/01-allreduce
echo
echo "== duralumin-perf: allreduce at 2 ranks, Duralumin (Mpi backend, Auto) against MPI's own (native)"
timeout 120 mpirun --oversubscribe -np 2 target/release/duralumin-perf -b 8 -e 64M -f 2 --native
