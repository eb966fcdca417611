#!/usr/bin/env bash
# Session 11 run 5, one GPU: the Lines and LL128 tests under compute-sanitizer
# (memcheck, racecheck), 2 PEs sharing the GPU under MPS, then 1 PE.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r"
t0=$SECONDS
: > "$dest/r/summary.log"
SHMEM_GPU_PES=2 SANITIZE_TESTS='lines|low_latency_128' SAN_JOBS=4 SAN_TIMEOUT=250 OUT=$dest/r/share2 \
    timeout 290 bash "$here/gpu-run.sh" --share --sanitize > /dev/null 2>&1
echo "2 PEs shared: rc $? at $((SECONDS - t0)) s" >> "$dest/r/summary.log"
SHMEM_GPU_PES=1 SANITIZE_TESTS='lines|low_latency_128' SAN_JOBS=4 SAN_TIMEOUT=230 OUT=$dest/r/one \
    timeout $((555 - (SECONDS - t0))) bash "$here/gpu-run.sh" --sanitize > /dev/null 2>&1
echo "1 PE: rc $? at $((SECONDS - t0)) s" >> "$dest/r/summary.log"
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
