#!/usr/bin/env bash
# Session 11 run 11, one GPU: the PE-killed-by-SIGKILL scenarios on the GPU
# backend (gpu-run.sh --faults) at 4 and 3 PEs sharing the GPU under MPS.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r"
t0=$SECONDS
: > "$dest/r/summary.log"
for pes in 4 3; do
  SHMEM_GPU_PES=$pes EACH_TIMEOUT=120 OUT=$dest/r/pes$pes timeout 250 bash "$here/gpu-run.sh" --share --faults > /dev/null 2>&1
  echo "pes $pes: rc $? at $((SECONDS - t0)) s" >> "$dest/r/summary.log"
  grep -v "^\s*$" "$dest/r/pes$pes/gpu-run.log" | cut -c1-300 > "$dest/r/pes$pes.log" && rm -rf "$dest/r/pes$pes"
done
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
