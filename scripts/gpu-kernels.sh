#!/usr/bin/env bash
# GPU checks of the device kernels, for a machine with an NVIDIA GPU and driver (CI has none, so
# these tests are #[ignore]d there). Loads the embedded PTX with cudarc and
#  * runs every builtin (element, operator) reduce/reduce3/finish kernel and the pack/unpack
#    kernels against the host bodies' results (tests/kernels_gpu.rs),
#  * prints a table: reduce f32 sum and pack over 256 MiB as fractions of device-to-device copy
#    bandwidth (targets >= 0.9 and >= 0.8), and the stream-wait release latency,
#  * runs the user kernels of examples/custom-kernels (MinLoc argmin, complex sum) against the host.
# Exit status: 0 when everything ran and passed, 77 when it was skipped (no driver, no GPU, or the
# kernels were not built: see the SKIPPED line), anything else on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp)
trap 'rm -f "$log"' EXIT

cargo test --release --test kernels_gpu -- --ignored --nocapture --test-threads=1 2>&1 | tee "$log"
cargo test --release -p duralumin-example-custom-kernels --test gpu -- --ignored --nocapture 2>&1 | tee -a "$log"

if grep -q '^SKIPPED' "$log"; then
    echo "gpu-kernels: SKIPPED, nothing was checked on a GPU:"
    grep '^SKIPPED' "$log"
    exit 77
fi
echo "gpu-kernels: all GPU checks passed"
