#!/usr/bin/env bash
# The unit tests of the unsafe code under Miri, which reports undefined behaviour (out-of-bounds
# or misaligned accesses, aliasing violations, data races, leaks) where a native run may pass:
#   - the kernel bodies: duralumin-kernels' own tests and tests/kernels_bodies.rs (under
#     cfg(miri), smaller sizes and each element's first operator), with strict provenance (the
#     mover's test, whose schedule holds addresses as integers, with permissive provenance);
#   - the library's unit tests: staging pool, buffers and scratch memory, kernel argument lists,
#     the host device's memory and executors, and the rest. The library keeps device addresses as
#     integers (a host device's are host addresses), so these run with permissive provenance.
# Miri cannot call foreign code: tests that reach MPI are marked `cfg_attr(miri, ignore)`.
# Installs what it needs (idempotent). On 2 cores: about 2 minutes built, 4 from a clean target.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup component add miri rust-src --toolchain nightly >/dev/null 2>&1; then
    echo "miri.sh: the nightly toolchain's miri component is unavailable (rustup component add miri --toolchain nightly)" >&2
    exit 1
fi
cargo +nightly miri setup >/dev/null
# No test here launches a device kernel: skip the nested GPU build (minutes, in Miri's own target
# directory). Miri runs the build script natively, so the MPI probe and the C shim still build.
export DURALUMIN_SKIP_KERNELS=1
MIRIFLAGS="-Zmiri-strict-provenance ${MIRIFLAGS:-}" cargo +nightly miri test -p duralumin-kernels --lib
MIRIFLAGS="-Zmiri-strict-provenance ${MIRIFLAGS:-}" cargo +nightly miri test -p duralumin --test kernels_bodies
# The mover's schedule carries device addresses as integers: its test, with permissive provenance.
MIRIFLAGS="-Zmiri-permissive-provenance ${MIRIFLAGS:-}" cargo +nightly miri test -p duralumin --test kernels_bodies -- --ignored the_mover
MIRIFLAGS="-Zmiri-permissive-provenance ${MIRIFLAGS:-}" cargo +nightly miri test -p duralumin --lib
