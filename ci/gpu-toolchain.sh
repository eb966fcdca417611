#!/usr/bin/env bash
# Installs the CUDA + NVSHMEM *build* toolchain (nvcc, nvlink, ptxas, cicc, the CUDA
# headers, the NVSHMEM headers and libraries) from NVIDIA's PyPI wheels into the
# git-ignored folder .gpu-toolchain/ at the repository root, so that a machine
# without CUDA can build the GPU kernels. No GPU is needed to build.
#
#   ci/gpu-toolchain.sh            install (or skip: already installed), print the env
#   ci/gpu-toolchain.sh --check    the same, then compile a small NVSHMEM kernel with
#                                  nvcc -rdc and link it with nvlink against
#                                  libnvshmem_device.a, in a temporary folder
#   eval "$(ci/gpu-toolchain.sh)"  set CUDA_HOME, NVCC, NVSHMEM_HOME and PATH
#
# Progress goes to stderr; stdout carries only the `export` lines, so it can be
# eval'd. The versions match the GPU box (CUDA 13.0, NVSHMEM 3.4.5): kernels must be
# linked against the device library of the NVSHMEM version that runs them.
#
# Layout after install (the wheels unpacked on top of each other):
#   .gpu-toolchain/nvidia/cu13/{bin,include,lib,nvvm}  CUDA_HOME
#   .gpu-toolchain/nvidia/nvshmem/{include,lib}        NVSHMEM_HOME
#
# Environment: PYTHON (default python3) runs pip; GPU_TOOLCHAIN_DIR overrides the
# install folder.
set -euo pipefail

wheels=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
    nvidia-nvshmem-cu13==3.4.5
)

check=0
for arg in "$@"; do
    case $arg in
    --check) check=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
        exit 0
        ;;
    *)
        echo "gpu-toolchain: unknown argument: $arg (try --help)" >&2
        exit 2
        ;;
    esac
done

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${GPU_TOOLCHAIN_DIR:-$repo_root/.gpu-toolchain}
python=${PYTHON:-python3}
cuda_home=$dest/nvidia/cu13
nvshmem_home=$dest/nvidia/nvshmem
stamp=$dest/installed.txt
wanted=$(printf '%s\n' "${wheels[@]}")

log() { printf 'gpu-toolchain: %s\n' "$*" >&2; }

# Installed means: the stamp lists exactly these wheels and the key files are there.
is_installed() {
    [[ -f $stamp && $(<"$stamp") == "$wanted" &&
        -x $cuda_home/bin/nvcc && -x $cuda_home/bin/nvlink &&
        -x $cuda_home/nvvm/bin/cicc &&
        -f $nvshmem_home/include/nvshmem.h &&
        -f $nvshmem_home/lib/libnvshmem_device.a &&
        -f $nvshmem_home/lib/libnvshmem_host.so.3 ]]
}

install() {
    local download staging wheel
    download=$(mktemp -d "${TMPDIR:-/tmp}/gpu-toolchain.XXXXXX")
    # Expanded now, on purpose: the trap must remove this folder even after
    # `download` has gone out of scope.
    # shellcheck disable=SC2064
    trap "rm -rf '$download'" EXIT

    log "downloading ${wheels[*]}"
    "$python" -m pip download --quiet --no-deps --only-binary=:all: \
        --dest "$download" "${wheels[@]}" >&2

    # Unpack into a staging folder first; the stamp is written last, so an
    # interrupted install is never taken for a finished one.
    mkdir -p "$dest"
    rm -f "$stamp"
    staging=$dest/.staging
    rm -rf "$staging"
    mkdir -p "$staging"
    for wheel in "$download"/*.whl; do
        log "unpacking $(basename "$wheel")"
        unzip -q -o "$wheel" -d "$staging"
    done
    # unzip drops the executable bit that the wheels' RECORDs do not carry.
    chmod +x "$staging"/nvidia/cu13/bin/* "$staging"/nvidia/cu13/nvvm/bin/*
    chmod -x "$staging"/nvidia/cu13/bin/nvcc.profile

    rm -rf "$dest/nvidia" "$dest"/*.dist-info
    mv "$staging"/* "$dest"/
    rmdir "$staging"
    printf '%s\n' "$wanted" >"$stamp"
    rm -rf "$download"
    trap - EXIT
}

# Compiles and links a kernel that calls NVSHMEM device functions: the same two
# steps that the kernels' build takes (relocatable device code, then nvlink against
# the device library).
self_check() {
    local work
    work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-toolchain-check.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" EXIT
    cat >"$work/check.cu" <<'EOF'
#include <nvshmem.h>
#include <nvshmemx.h>
extern "C" __global__ void toolchain_check(int *dst, const int *src, int n, uint64_t *flag) {
  int peer = (nvshmem_my_pe() + 1) % nvshmem_n_pes();
  nvshmemx_int_put_signal_nbi_block(dst, src, n, flag, 1, NVSHMEM_SIGNAL_SET, peer);
  if (threadIdx.x == 0) nvshmem_signal_wait_until(flag, NVSHMEM_CMP_EQ, 1);
}
EOF
    log "check: nvcc -arch=sm_90 -rdc=true -cubin"
    "$cuda_home/bin/nvcc" -arch=sm_90 -rdc=true -cubin -I"$nvshmem_home/include" \
        "$work/check.cu" -o "$work/check.cubin" >&2
    log "check: nvlink --arch=sm_90 ... libnvshmem_device.a"
    "$cuda_home/bin/nvlink" --arch=sm_90 "$work/check.cubin" \
        "$nvshmem_home/lib/libnvshmem_device.a" -o "$work/linked.cubin" >&2
    if [[ ! -s $work/linked.cubin ]]; then
        log "check FAILED: nvlink produced no cubin"
        exit 1
    fi
    log "check passed: linked cubin of $(wc -c <"$work/linked.cubin") bytes"
    rm -rf "$work"
    trap - EXIT
}

if is_installed; then
    log "already installed in $dest"
else
    install
    is_installed || {
        log "install incomplete in $dest (a file is missing after unpacking)"
        exit 1
    }
    log "installed in $dest"
fi
"$cuda_home/bin/nvcc" --version | tail -n 1 | sed 's/^/gpu-toolchain: nvcc: /' >&2

if ((check)); then
    self_check
fi

printf 'export CUDA_HOME=%q\n' "$cuda_home"
printf 'export NVCC=%q\n' "$cuda_home/bin/nvcc"
printf 'export NVSHMEM_HOME=%q\n' "$nvshmem_home"
printf "export PATH=%q:\"\$PATH\"\n" "$cuda_home/bin"
