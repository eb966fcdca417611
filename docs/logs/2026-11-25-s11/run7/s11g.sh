#!/usr/bin/env bash
# Session 11 run 7, one GPU: the Lines kernels after their loops were
# shared (commit of this bundle): the lines, LL128 and graph-replay tests at
# 1 PE, then at 2, 3 and 4 PEs sharing the GPU under MPS.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r"
t0=$SECONDS
: > "$dest/r/summary.log"
for pes in 1 2 3 4; do
  share=--share
  ((pes == 1)) && share=
  SHMEM_GPU_PES=$pes EACH_TIMEOUT=90 OUT=$dest/r/pes$pes timeout 130 bash "$here/gpu-run.sh" $share \
      --only '(lines|low_latency_128|graph_replay)' > /dev/null 2>&1
  rc=$?
  echo "pes $pes: rc $rc at $((SECONDS - t0)) s" >> "$dest/r/summary.log"
  grep -E "^==== .*exit|^gpu-run|^spmd suite|^test result" "$dest/r/pes$pes/gpu-run.log" > "$dest/r/pes$pes.summary"
  ((rc == 0)) && rm -f "$dest/r/pes$pes/gpu-run.log"
done
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
