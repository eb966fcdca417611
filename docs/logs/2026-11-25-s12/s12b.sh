#!/usr/bin/env bash
# Session 12 run 2, one GPU: the line kernel after each warp plans its own
# sends (no barrier before the first line). The MoE bench at 1 PE (NCCL
# beside) and at 2 PEs sharing the GPU (the line kernel on 128, 64 and 32
# blocks at most: 7.5, 15 and 30 KiB of input a block); the moe:: suite at
# 2, 4 and 3 PEs shared; compute-sanitizer over the line tests at 2 PEs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/common.sh"
moe=(--backend gpu --op moe --tokens 1,32,128 --graph)
run pe1-bench 150 "$bin/shmemrun" -n 1 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines,nccl \
    --json "$dest/r/pe1-bench.jsonl"
for p in 2 4 3; do
    mps_on "$p"
    run "pe$p-moe" 150 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n "$p" "$bin/spmd" moe::
    if ((p == 2)); then
        run pe2-bench 150 "$bin/shmemrun" -n 2 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines \
            --json "$dest/r/pe2-bench.jsonl"
        for kib in 15 30; do
            run "pe2-bench-lines-${kib}k" 150 "$bin/shmemrun" -n 2 "$bin/shmem-bench" "${moe[@]}" --impl shmem-lines \
                --moe-block-bytes "${kib}K" --json "$dest/r/pe2-bench-lines-${kib}k.jsonl"
        done
    fi
    mps_off
done
sanitize_lines
pack
