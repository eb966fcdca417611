#!/usr/bin/env bash
# Session 12 run 2, one GPU: the line kernel after each warp plans its own
# sends (no barrier before the first line). The MoE bench at 1 PE (NCCL
# beside) and at 2 PEs sharing the GPU (the line kernel on 128, 64 and 32
# blocks at most: 7.5, 15 and 30 KiB of input a block); the moe:: suite at
# 2, 4 and 3 PEs shared; compute-sanitizer over the line tests at 2 PEs.
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
moe=(--backend gpu --op moe --tokens 1,32,128 --graph)
run pe1-bench 150 "$bin/shmemrun" -n 1 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines,nccl \
    --json "$dest/r/pe1-bench.jsonl"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p /tmp/mps-pipe /tmp/mps-log
for p in 2 4 3; do
    export SHMEM_PES_PER_GPU=$p CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / p))
    nvidia-cuda-mps-control -d
    run "pe$p-moe" 150 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n "$p" "$bin/spmd" moe::
    if ((p == 2)); then
        run pe2-bench 150 "$bin/shmemrun" -n 2 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines \
            --json "$dest/r/pe2-bench.jsonl"
        for kib in 15 30; do
            run "pe2-bench-lines-${kib}k" 150 "$bin/shmemrun" -n 2 "$bin/shmem-bench" "${moe[@]}" --impl shmem-lines \
                --moe-block-bytes "${kib}K" --json "$dest/r/pe2-bench-lines-${kib}k.jsonl"
        done
    fi
    echo quit | nvidia-cuda-mps-control
    sleep 1
done
unset SHMEM_PES_PER_GPU CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
OUT=$dest/r/san SHMEM_GPU_PES=2 SANITIZE_TESTS='^moe::(lines|tuned::lines)::' SAN_JOBS=4 SAN_TIMEOUT=150 \
    timeout 200 bash "$here/gpu-run.sh" --share --sanitize >"$dest/r/san.log" 2>&1
echo "== san: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
