#!/usr/bin/env bash
# Session 12 run 6, one GPU: the one-kernel forms' shared verdict
# (a2av_verdict): every moe:: test at 1 PE and at 2, 4 and 3 PEs sharing
# the GPU, moe_server at 2, the line tests under compute-sanitizer at 2,
# and the MoE bench at 1 PE.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/common.sh"
moe=(--backend gpu --op moe --tokens 1,32,128 --graph)
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
run pe1-bench 100 "$bin/shmemrun" -n 1 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines,nccl \
    --json "$dest/r/pe1-bench.jsonl"
for p in 2 4 3; do
    mps_on "$p"
    run "pe$p-moe" 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n "$p" "$bin/spmd" moe::
    run "pe$p-moe-forced-rma" 120 env SHMEM_FORCE_RMA=1 SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n "$p" "$bin/spmd" moe::
    ((p == 2)) && run pe2-moe_server 90 "$bin/shmemrun" -n 2 --tag-output "$bin/moe_server"
    mps_off
done
sanitize_lines
pack
