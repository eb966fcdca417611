#!/usr/bin/env bash
# Session 12 run 3, one GPU: the collectives' suite at 1 PE and at 2 PEs
# sharing the GPU (LL and Lines now take their epoch from block_ll_epoch,
# and Lines composes LL: first run on a GPU), the moe:: suite at 2 PEs
# shared, and the line kernel's grid at 2 PEs shared: 7.5 (the default),
# 15, 30 and 60 KiB of input a block (128, 120, 60 and 30 blocks at 128
# tokens), against the default form.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/common.sh"
run pe1-coll 220 env SHMEM_HEAP_SIZE=4G "$bin/shmemrun" -n 1 "$bin/spmd" coll::
mps_on 2
moe=(--backend gpu --op moe --tokens 1,32,128 --graph)
run pe2-bench 100 "$bin/shmemrun" -n 2 "$bin/shmem-bench" "${moe[@]}" --impl shmem,shmem-lines --json "$dest/r/pe2-bench.jsonl"
for kib in 15 30 60; do
    run "pe2-bench-lines-${kib}k" 100 "$bin/shmemrun" -n 2 "$bin/shmem-bench" "${moe[@]}" --impl shmem-lines \
        --moe-block-bytes "${kib}K" --json "$dest/r/pe2-bench-lines-${kib}k.jsonl"
done
run pe2-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
run pe2-coll 300 env SHMEM_HEAP_SIZE=4G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
mps_off
pack
