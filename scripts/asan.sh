#!/usr/bin/env bash
# The mismatch trials of tests/faults under AddressSanitizer: a nightly -Zsanitizer=address build
# of the faults test (its own target directory), run with leak detection off (MPI's own
# allocations at exit) and the first invalid access fatal. Not part of scripts/test.sh (a build of
# about 4 minutes and a run of about 6 on 2 cores); see docs/reliability.md, "Mismatched calls".
# Extra arguments select trials (default: every mismatch_ trial).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
target=x86_64-unknown-linux-gnu
RUSTFLAGS="-Zsanitizer=address" cargo +nightly build --release --target $target --test faults \
    --target-dir target/asan
bin=$(ls -t target/asan/$target/release/deps/faults-* | grep -v '\.d$' | head -1)
ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1 "$bin" "${@:-mismatch_}"
