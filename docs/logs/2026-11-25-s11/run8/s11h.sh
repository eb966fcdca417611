#!/usr/bin/env bash
# Session 11 run 8, one GPU: the MoE tests (and the collectives over split
# teams, low-latency and lines) under compute-sanitizer memcheck and
# racecheck at 4, then 2 PEs sharing the GPU under MPS.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r"
t0=$SECONDS
: > "$dest/r/summary.log"
for pes in 4 2; do
  SHMEM_GPU_PES=$pes SANITIZE_TESTS='^moe::|^coll::teams::(low_latency|low_latency_128)$' SAN_JOBS=4 SAN_TIMEOUT=240 \
      OUT=$dest/r/pes$pes timeout $((pes == 4 ? 280 : 550 - (SECONDS - t0))) bash "$here/gpu-run.sh" --share --sanitize > /dev/null 2>&1
  echo "pes $pes: rc $? at $((SECONDS - t0)) s" >> "$dest/r/summary.log"
done
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
