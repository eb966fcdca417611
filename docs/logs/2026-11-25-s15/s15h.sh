#!/usr/bin/env bash
# Session 15 run 8, one GPU, 1 PE: run 7's bundle with 63a8fea's
# gpu-run.sh and targets.py (the binaries did not change): gpu-run.sh
# --moe end to end again (the PyTorch comparison now skipped below 2 PEs),
# then targets.py over its rows and run 7's all-gather row.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
OUT=$dest/r/moe SHMEM_GPU_PES=1 timeout 300 bash "$here/gpu-run.sh" --moe >"$dest/r/moe.log" 2>&1
echo "== moe: rc $?" >>"$log"
cp "$here/../docs/logs/2026-11-25-s15/run7/bench-ag-target.jsonl" "$dest/r/moe/"
python3 "$here/targets.py" "$dest/r/moe" >"$dest/r/targets-all.txt" 2>&1
pack
