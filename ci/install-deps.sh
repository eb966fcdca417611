#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages that building and testing shmem needs.
# CI runs it from .ci/run; developers can run it too (as root, or with sudo).
#
#   openmpi-bin     mpirun, which launches the SPMD tests and examples under MPI
#   libopenmpi-dev  mpicc, mpi.h and libmpi.so: the `mpi` crate (rsmpi, feature `mpi`)
#                   compiles its C shim with mpicc and links libmpi
#   libclang-dev    libclang and clang's own headers, which bindgen loads at build time
#                   to generate rsmpi's bindings from mpi.h
#   pkg-config      rsmpi's fallback way to find MPI when there is no mpicc
#   gcc, libc6-dev  the C compiler that mpicc wraps (and that links Rust programs)
#
# Packages already installed are skipped; with all present it changes nothing.
set -euo pipefail

packages=(openmpi-bin libopenmpi-dev libclang-dev pkg-config gcc libc6-dev)

missing=()
for pkg in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    if [[ $status != "install ok installed" ]]; then
        missing+=("$pkg")
    fi
done

if ((${#missing[@]} == 0)); then
    echo "install-deps: all present: ${packages[*]}"
    exit 0
fi

as_root=()
if [[ $(id -u) -ne 0 ]]; then
    as_root=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
"${as_root[@]}" apt-get -o Acquire::Retries=3 update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get -o Acquire::Retries=3 -o DPkg::Lock::Timeout=300 \
    install -y --no-install-recommends "${missing[@]}"
