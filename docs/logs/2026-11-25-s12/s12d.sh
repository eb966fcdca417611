#!/usr/bin/env bash
# Session 12 run 4, one GPU, at a2f0f0f + the new test: the moe:: suite at
# 1 PE and at 2, 4 and 3 PEs sharing the GPU under MPS (the line kernel on
# the one kernel's grid; moe::lines::between_low_latency_collectives new);
# the rest of the suite but coll::, moe:: and scenario:: at 2 PEs shared;
# the MoE bench at 1 PE and at 2 PEs shared; compute-sanitizer over the
# line tests at 2 PEs shared.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/common.sh"
moe=(--backend gpu --op moe --tokens 1,32,128 --graph)
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
run pe1-bench 100 "$bin/shmemrun" -n 1 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines,nccl \
    --json "$dest/r/pe1-bench.jsonl"
for p in 2 4 3; do
    mps_on "$p"
    run "pe$p-moe" 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n "$p" "$bin/spmd" moe::
    if ((p == 2)); then
        run pe2-bench 100 "$bin/shmemrun" -n 2 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines \
            --json "$dest/r/pe2-bench.jsonl"
        run pe2-rest 200 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" --skip coll:: --skip moe:: --skip scenario::
    fi
    mps_off
done
sanitize_lines
pack
