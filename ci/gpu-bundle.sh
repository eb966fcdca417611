#!/usr/bin/env bash
# Builds the release binaries and stages them, with the scripts that run
# them on a GPU machine (gpu-run.sh, gpu-compare.sh), in the git-ignored
# .gpu-bundle/: carry that folder to a GPU machine without a Rust toolchain.
# The runtime loads CUDA and NVSHMEM at run time, so no CUDA is needed to
# build. --no-archive leaves the binaries in .gpu-bundle/bin instead of
# packing them into one archive (for running them here). Prints the
# bundle's size.
set -euo pipefail
archive=1
[[ ${1:-} == --no-archive ]] && archive=""
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v cargo >/dev/null 2>&1 && [[ -d "$HOME/.cargo/bin" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# nvcc and NVSHMEM's device library, so build.rs embeds the kernels.
eval "$(bash ci/gpu-toolchain.sh)"
cargo build --release -p shmem --features mpi --bins --examples
cargo build --release -p shmem-bench --features mpi
# The SPMD suite's binary, from cargo's JSON (its name carries a hash).
spmd=$(cargo test --release -p shmem --features mpi --test spmd --no-run --message-format=json-render-diagnostics |
    grep '"reason":"compiler-artifact"' | grep '"name":"spmd"' |
    grep -o '"executable":"[^"]*"' | sed -e 's/^"executable":"//' -e 's/"$//' | tail -n 1)
[[ -x "$spmd" ]] || { echo "gpu-bundle: the spmd test binary was not found" >&2; exit 1; }

rm -rf .gpu-bundle
mkdir -p .gpu-bundle/bin
cp target/release/shmemrun target/release/shmem-bench .gpu-bundle/bin/
for ex in quickstart ring allreduce peer_kernel device_kernel all_gather_matmul matmul_reduce_scatter \
    moe_dispatch_combine moe_torch_check moe_server soak; do
    cp "target/release/examples/$ex" .gpu-bundle/bin/
done
cp "$spmd" .gpu-bundle/bin/spmd
# Debug info is for local debugging; the box needs symbols only.
strip --strip-debug .gpu-bundle/bin/*
# Every binary embeds the same kernel image (~20 MiB): one archive whose
# dictionary spans several binaries stores it about once (the carry limit
# is 64 MiB). gpu-run.sh unpacks it.
if [[ -n $archive ]]; then
    tar -C .gpu-bundle -cf - bin | xz -T1 --lzma2=preset=6,dict=192MiB >.gpu-bundle/bin.tar.xz
    rm -rf .gpu-bundle/bin
fi
cp ci/gpu-run.sh ci/gpu-env.sh ci/gpu-compare.sh ci/targets.py ci/perf_tables.py .gpu-bundle/
# PyTorch's MoE dispatch, which moe_torch_check compares ours with, and its SymmMem all-reduces (run there under torchrun).
cp ci/torch_a2av_2d.py ci/torch_symm_bench.py .gpu-bundle/
du -sh .gpu-bundle
