#!/usr/bin/env bash
# Session 12 run 5, one GPU: the low-latency counters written a thread
# each (ll_counters_end) against one thread's loop, A/B in one call: the
# build before (old.tar.xz, a2f0f0f + the between test) and after, each
# twice, alternating: the MoE forms at 1, 32, 128 tokens and the small
# all-reduce and all-gather (bf16, low-latency kernels) at 1 PE and at 2
# PEs sharing the GPU; then every coll:: and moe:: test with the new build
# at 2 PEs shared and moe:: at 1 PE.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r" "$here/old"
tar -C "$here" -xJf "$here/bin.tar.xz"
tar -C "$here/old" -xJf "$here/old.tar.xz"
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
ab() {  # pes
    local p=$1 k v b
    for k in 1 2; do
        for v in old new; do
            b=$here/bin
            [[ $v == old ]] && b=$here/old/bin
            run "pe$p-$v$k-moe" 60 "$b/shmemrun" -n "$p" "$b/shmem-bench" --backend gpu --op moe --tokens 1,32,128 --graph \
                --impl shmem,shmem-lines --json "$dest/r/pe$p-$v$k-moe.jsonl"
            run "pe$p-$v$k-coll" 60 "$b/shmemrun" -n "$p" "$b/shmem-bench" --backend gpu --op all_reduce,all_gather \
                --dtype bf16 --max-bytes 64K --graph --impl shmem --json "$dest/r/pe$p-$v$k-coll.jsonl"
        done
    done
}
bin=$here/bin
ab 1
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p /tmp/mps-pipe /tmp/mps-log
export SHMEM_PES_PER_GPU=2 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
nvidia-cuda-mps-control -d
ab 2
run pe2-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
run pe2-coll 240 env SHMEM_HEAP_SIZE=4G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
echo quit | nvidia-cuda-mps-control
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
