#!/usr/bin/env bash
# Session 11 run 3, one GPU: worlds of 4 and 3 PEs sharing it under MPS
# (gpu-run.sh --share): every collective's test alone, and the MoE tests both ways.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r"
t0=$SECONDS
: > "$dest/r/summary.log"
for pes in 4 3; do
  lim=$((pes == 4 ? 300 : 545 - (SECONDS - t0)))
  SHMEM_GPU_PES=$pes EACH_TIMEOUT=60 OUT=$dest/r/pes$pes timeout $lim bash "$here/gpu-run.sh" --share --moe --quick > /dev/null 2>&1
  rc=$?
  echo "pes $pes: rc $rc at $((SECONDS - t0)) s" >> "$dest/r/summary.log"
  grep -E "^==== .*exit|^gpu-run|^spmd suite|^test result" "$dest/r/pes$pes/gpu-run.log" > "$dest/r/pes$pes.summary"
  # Only the failing steps' full output comes back (the traces are large).
  ((rc == 0)) && rm -f "$dest/r/pes$pes/gpu-run.log"
done
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
