#!/usr/bin/env bash
# Installs what building and testing Duralumin needs on Debian 12 (as root). Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
dpkg -s libamdhip64-dev >/dev/null 2>&1 || need+=(libamdhip64-dev)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Device kernels are built with the nightly toolchain and -Zbuild-std=core; without these the
# library still builds (CPU paths only) and says so.
rustup component add rust-src --toolchain nightly >/dev/null 2>&1 || echo "setup: rust-src for nightly unavailable; GPU kernels will not be built"
# ptxas, to check the generated PTX without a GPU.
python3 -m pip install -q --disable-pip-version-check nvidia-cuda-nvcc 2>/dev/null || echo "setup: nvidia-cuda-nvcc unavailable; PTX assembly checks will be skipped"
