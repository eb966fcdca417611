#!/usr/bin/env bash
# Session 11, one GPU: the Lines kernels at 1 PE, then 2 PEs sharing the GPU under CUDA MPS.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r"
t0=$SECONDS
{
  date; nvidia-smi; ls -l /usr/bin/nvidia-cuda-mps* 2>&1; command -v nvidia-cuda-mps-control
} > "$dest/r/probe.log" 2>&1
# 1 PE: every Lines test and the graph replay.
SHMEM_GPU_PES=1 EACH_TIMEOUT=120 OUT=$dest/r/one timeout 200 bash "$here/gpu-run.sh" --only 'lines|low_latency_128|graph_replay' > /dev/null 2>&1
echo "one: rc $? at $((SECONDS - t0)) s" >> "$dest/r/probe.log"
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d >> "$dest/r/probe.log" 2>&1
  echo "mps start rc $?" >> "$dest/r/probe.log"
  export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 SHMEM_PES_PER_GPU=2 SHMEM_GPU_PES=2
  # 2 PEs on the one GPU: the Lines and LL128 tests, graph replay, then the rest of coll::, then moe::.
  EACH_TIMEOUT=60 OUT=$dest/r/two timeout 240 bash "$here/gpu-run.sh" --only 'lines|low_latency_128|graph_replay' > /dev/null 2>&1
  echo "two-lines: rc $? at $((SECONDS - t0)) s" >> "$dest/r/probe.log"
  left=$((520 - (SECONDS - t0)))
  if ((left > 60)); then
    EACH_TIMEOUT=40 OUT=$dest/r/two-coll timeout $left bash "$here/gpu-run.sh" --only '^coll::' > /dev/null 2>&1
    echo "two-coll: rc $? at $((SECONDS - t0)) s" >> "$dest/r/probe.log"
  fi
  echo quit | nvidia-cuda-mps-control >> "$dest/r/probe.log" 2>&1
  sleep 1
  cp -r /tmp/mps-log "$dest/r/" 2>/dev/null
fi
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
