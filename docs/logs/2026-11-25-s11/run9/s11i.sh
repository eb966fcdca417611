#!/usr/bin/env bash
# Session 11 run 9, one GPU: the tuning sweep's new bench rows (never run on
# a GPU) run end to end at 2 PEs sharing the GPU under MPS: shmem-ll128
# all-reduce, the Lines collectives, the MoE dispatch. Timings meaningless.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r"
tar -C "$here" -xJf "$here/bin.tar.xz"
bin=$here/bin
nvlib=$(ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib /usr/local/lib/python3*/dist-packages/nvidia/nvshmem/lib 2>/dev/null | head -1)
export NVSHMEM_HOME=${nvlib%/lib} LD_LIBRARY_PATH=$nvlib:/usr/local/cuda/lib64 SHMEM_BACKEND=gpu
export SHMEM_PES_PER_GPU=2 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p /tmp/mps-pipe /tmp/mps-log
nvidia-cuda-mps-control -d
b=("$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu)
{
  echo "== ar ll128"; timeout 120 "${b[@]}" --op all_reduce --dtype bf16 --min-bytes 32K --max-bytes 1M --graph --impl shmem-ll128 --ll-blocks 64 --json "$dest/r/ar-ll128.jsonl"; echo "rc $?"
  echo "== coll lines"; timeout 120 "${b[@]}" --op all_gather,reduce_scatter,broadcast,all_to_all --dtype bf16 --min-bytes 32K --max-bytes 1M --graph --impl shmem --ll-lines-min-bytes 0 --json "$dest/r/coll-lines.jsonl"; echo "rc $?"
  echo "== moe"; timeout 120 "${b[@]}" --op dispatch --tokens 1,128,4096 --graph --impl shmem --json "$dest/r/moe.jsonl"; echo "rc $?"
} > "$dest/r/bench.log" 2>&1
echo quit | nvidia-cuda-mps-control
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
