#!/usr/bin/env bash
# Session 11 run 6, one GPU: worlds of 4 and 3 PEs sharing it under MPS
# (gpu-run.sh --share): every rma, errors, overlap and scenario test alone,
# the examples and the failure cases.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r"
t0=$SECONDS
: > "$dest/r/summary.log"
for pes in 4 3; do
  lim=$((pes == 4 ? 270 : 540 - (SECONDS - t0)))
  SHMEM_GPU_PES=$pes EACH_TIMEOUT=90 OUT=$dest/r/pes$pes timeout $lim bash "$here/gpu-run.sh" --share --examples \
      --only '^(errors|overlap|rma|scenario)::' > /dev/null 2>&1
  rc=$?
  echo "pes $pes: rc $rc at $((SECONDS - t0)) s" >> "$dest/r/summary.log"
  grep -E "^==== .*exit|^gpu-run|^spmd suite|^test result|^\[[0-9]\] PE|^\[[0-9]\] .*failed" "$dest/r/pes$pes/gpu-run.log" > "$dest/r/pes$pes.summary"
  ((rc == 0)) && rm -f "$dest/r/pes$pes/gpu-run.log"
done
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
