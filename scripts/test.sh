#!/usr/bin/env bash
# The whole test suite: set-up, formatting and lint checks, then every test (multi-rank ones
# run under mpirun at 1..5 ranks from the test harness).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The device kernels and ptxas are installed by setup.sh: their checks may not skip here.
export DURALUMIN_REQUIRE_KERNELS=1
cargo fmt --all --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
