#!/usr/bin/env bash
# Session 13 runs 4 and 6, one GPU: the control's cuts against the build
# before (old.tar.xz: its shmem-bench and shmemrun; run 4: 5357f19
# against fd84132, run 6: 0094d0b against the check below the receipt
# warps), plain builds, each twice alternating, at 1 PE and at 2
# PEs sharing the GPU: the MoE forms and the small all-reduce and
# all-gather; then the new build's `moe::` at 1 PE and at 2 shared both
# ways, `moe_server` at 2, and the sanitizer over the line tests.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
unpack_old
ab() {
    local p=$1 k v b
    for k in 1 2; do
        for v in old new; do
            b=$here/bin
            [[ $v == old ]] && b=$here/old/bin
            run "pe$p-$v$k-moe" 60 "$b/shmemrun" -n "$p" "$b/shmem-bench" --backend gpu --op moe --tokens 1,32,128 --graph \
                --impl shmem,shmem-lines --json "$dest/r/pe$p-$v$k-moe.jsonl"
            run "pe$p-$v$k-coll" 60 "$b/shmemrun" -n "$p" "$b/shmem-bench" --backend gpu --op all_reduce,all_gather \
                --dtype bf16 --max-bytes 64K --graph --impl shmem --json "$dest/r/pe$p-$v$k-coll.jsonl"
        done
    done
}
ab 1
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
mps_on 2
ab 2
run pe2-moe 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
run pe2-moe-forced-rma 120 env SHMEM_FORCE_RMA=1 SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
run pe2-moe_server 90 "$bin/shmemrun" -n 2 --tag-output "$bin/moe_server"
mps_off
sanitize_lines
pack
