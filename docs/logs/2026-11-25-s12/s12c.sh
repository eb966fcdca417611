#!/usr/bin/env bash
# Session 12 run 3, one GPU: the collectives' suite at 1 PE and at 2 PEs
# sharing the GPU (LL and Lines now take their epoch from block_ll_epoch,
# and Lines composes LL: first run on a GPU), the moe:: suite at 2 PEs
# shared, and the line kernel's grid at 2 PEs shared: 7.5 (the default),
# 15, 30 and 60 KiB of input a block (128, 120, 60 and 30 blocks at 128
# tokens), against the default form.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r"
tar -C "$here" -xJf "$here/bin.tar.xz"
bin=$here/bin
nvlib=$(ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib /usr/local/lib/python3*/dist-packages/nvidia/nvshmem/lib 2>/dev/null | head -1)
nccl=$(ls /opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2 2>/dev/null | head -1)
export NVSHMEM_HOME=${nvlib%/lib} LD_LIBRARY_PATH=$nvlib:/usr/local/cuda/lib64${nccl:+:$(dirname "$nccl")} SHMEM_BACKEND=gpu
log=$dest/r/run.log
run() {
    local name=$1 limit=$2 t0 rc
    shift 2
    t0=$SECONDS
    echo "== $name: $*" >>"$log"
    timeout --kill-after=10 "$limit" "$@" >"$dest/r/$name.log" 2>&1
    rc=$?
    echo "== $name: rc $rc, $((SECONDS - t0)) s" >>"$log"
    tail -3 "$dest/r/$name.log" >>"$log"
}
run pe1-coll 220 env SHMEM_HEAP_SIZE=4G "$bin/shmemrun" -n 1 "$bin/spmd" coll::
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p /tmp/mps-pipe /tmp/mps-log
export SHMEM_PES_PER_GPU=2 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
nvidia-cuda-mps-control -d
moe=(--backend gpu --op moe --tokens 1,32,128 --graph)
run pe2-bench 100 "$bin/shmemrun" -n 2 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines --json "$dest/r/pe2-bench.jsonl"
for kib in 15 30 60; do
    run "pe2-bench-lines-${kib}k" 100 "$bin/shmemrun" -n 2 "$bin/shmem-bench" "${moe[@]}" --impl shmem-lines \
        --moe-block-bytes "${kib}K" --json "$dest/r/pe2-bench-lines-${kib}k.jsonl"
done
run pe2-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
run pe2-coll 300 env SHMEM_HEAP_SIZE=4G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
echo quit | nvidia-cuda-mps-control
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
