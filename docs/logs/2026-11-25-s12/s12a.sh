#!/usr/bin/env bash
# Session 12 run 1, one GPU: the MoE line kernel (shmem_a2av_lines) first
# on a GPU. The moe:: suite (every form, the lines ones included) at 1 PE,
# then at 2, 4 and 3 PEs sharing the GPU under MPS in one process each;
# the MoE bench at 1 PE (NCCL beside) and at 2 PEs shared (timings of PEs
# sharing a GPU are only relative); compute-sanitizer over the line tests
# at 2 PEs shared.
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
    t0=$(date +%s.%N)
    echo "== $name: $*" >>"$log"
    timeout --kill-after=10 "$limit" "$@" >"$dest/r/$name.log" 2>&1
    rc=$?
    printf '== %s: rc %d, %.1f s\n' "$name" "$rc" "$(echo "$(date +%s.%N) - $t0" | bc)" >>"$log"
    tail -3 "$dest/r/$name.log" >>"$log"
}
moe=(--backend gpu --op moe --tokens 1,32,128 --graph)
run pe1-moe 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
run pe1-bench 150 "$bin/shmemrun" -n 1 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines,shmem-2k,nccl \
    --json "$dest/r/pe1-bench.jsonl"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p /tmp/mps-pipe /tmp/mps-log
for p in 2 4 3; do
    export SHMEM_PES_PER_GPU=$p CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / p))
    nvidia-cuda-mps-control -d
    run "pe$p-moe" 150 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n "$p" "$bin/spmd" moe::
    if ((p == 2)); then
        run pe2-bench 150 "$bin/shmemrun" -n 2 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines,shmem-2k \
            --json "$dest/r/pe2-bench.jsonl"
        run pe2-moe_server 90 "$bin/shmemrun" -n 2 --tag-output "$bin/moe_server"
    fi
    echo quit | nvidia-cuda-mps-control
    sleep 1
done
unset SHMEM_PES_PER_GPU CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
OUT=$dest/r/san SHMEM_GPU_PES=2 SANITIZE_TESTS='^moe::(lines|tuned::lines)::' SAN_JOBS=4 SAN_TIMEOUT=150 \
    timeout 200 bash "$here/gpu-run.sh" --share --sanitize >"$dest/r/san.log" 2>&1
echo "== san: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
