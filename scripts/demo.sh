#!/usr/bin/env bash
# The main demo: a 4-rank allreduce under mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cargo build --release --example 01-allreduce
timeout 120 mpirun --oversubscribe -np 4 target/release/examples/01-allreduce
