#!/usr/bin/env bash
# Session 11 run 2, one GPU: 2 PEs sharing it under MPS (gpu-run.sh --share):
# the MoE tests both ways and moe_server, the examples, every non-collective test alone.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dest=${OUT:-/tmp/out}
mkdir -p "$dest/r"
t0=$SECONDS
EACH_TIMEOUT=60 OUT=$dest/r/share timeout 540 bash "$here/gpu-run.sh" --share --moe --examples \
    --only '^(errors|overlap|rma|scenario|teams)::' > /dev/null 2>&1
echo "share: rc $? at $((SECONDS - t0)) s" > "$dest/r/summary.log"
grep -E "^==== .*exit|^gpu-run" "$dest/r/share/gpu-run.log" >> "$dest/r/summary.log"
tar -C "$dest" -czf "$dest/r.tgz" r && rm -rf "$dest/r"
