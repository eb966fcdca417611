#!/usr/bin/env bash
# Session 22 runs 6 and on. Where the call got H200: s22e.sh (the standard
# sweep and targets.py). Elsewhere: the all-reduce of 1 MiB (bf16,
# graphs, shmem and NCCL) and of 256 MiB (bf16 and f32, eager, shmem and
# NCCL), the build on main (0e8cd49's kernels).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
if nvidia-smi -L | grep -q H200; then
    exec bash "$here/../docs/logs/2026-11-26-s22/s22e.sh"
fi
. "$here/../docs/logs/2026-11-26-s22/common.sh"
run ar1M 60 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 --min-bytes 1M \
    --max-bytes 1M --graph --impl shmem,nccl --json "$dest/r/ar1M.jsonl"
run ar256M 120 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16,f32 \
    --min-bytes 256M --max-bytes 256M --impl shmem,nccl --json "$dest/r/ar256M.jsonl"
pack
