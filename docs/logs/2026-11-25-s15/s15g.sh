#!/usr/bin/env bash
# Session 15 run 7, one GPU, 1 PE: gpu-run.sh --moe end to end (the MoE
# tests both ways, moe_server, the MoE bench rows, the PyTorch check) to
# see its new last step, targets.txt (ci/targets.py over the run's rows);
# the all-gather step --bench adds (256 MiB a rank) at 1 PE.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
OUT=$dest/r/moe SHMEM_GPU_PES=1 TORCH_TIMEOUT=150 timeout 400 bash "$here/gpu-run.sh" --moe >"$dest/r/moe.log" 2>&1
echo "== moe: rc $?" >>"$log"
run pe1-ag-target 120 "$bin/shmemrun" -n 1 "$bin/shmem-bench" --backend gpu --op all_gather --dtype bf16 --min-bytes 256M \
    --max-bytes 256M --impl shmem,nccl --json "$dest/r/bench-ag-target.jsonl"
python3 "$here/targets.py" "$dest/r" >"$dest/r/targets-ag.txt" 2>&1
pack
