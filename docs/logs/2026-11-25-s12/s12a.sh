#!/usr/bin/env bash
# Session 12 run 1, one GPU: the MoE line kernel (shmem_a2av_lines) first
# on a GPU. The moe:: suite (every form, the lines ones included) at 1 PE,
# then at 2, 4 and 3 PEs sharing the GPU under MPS in one process each;
# the MoE bench at 1 PE (NCCL beside) and at 2 PEs shared (timings of PEs
# sharing a GPU are only relative); compute-sanitizer over the line tests
# at 2 PEs shared.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/common.sh"
moe=(--backend gpu --op moe --tokens 1,32,128 --graph)
run pe1-moe 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
run pe1-bench 150 "$bin/shmemrun" -n 1 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines,shmem-2k,nccl \
    --json "$dest/r/pe1-bench.jsonl"
for p in 2 4 3; do
    mps_on "$p"
    run "pe$p-moe" 150 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n "$p" "$bin/spmd" moe::
    if ((p == 2)); then
        run pe2-bench 150 "$bin/shmemrun" -n 2 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines,shmem-2k \
            --json "$dest/r/pe2-bench.jsonl"
        run pe2-moe_server 90 "$bin/shmemrun" -n 2 --tag-output "$bin/moe_server"
    fi
    mps_off
done
sanitize_lines
pack
