#!/usr/bin/env bash
# Session 12 run 5, one GPU: the low-latency counters written a thread
# each (ll_counters_end) against one thread's loop, A/B in one call: the
# build before (old.tar.xz, a2f0f0f + the between test) and after, each
# twice, alternating: the MoE forms at 1, 32, 128 tokens and the small
# all-reduce and all-gather (bf16, low-latency kernels) at 1 PE and at 2
# PEs sharing the GPU; then every coll:: and moe:: test with the new build
# at 2 PEs shared and moe:: at 1 PE.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/common.sh"
mkdir -p "$here/old"
tar -C "$here/old" -xJf "$here/old.tar.xz"
ab() {  # pes
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
run pe2-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
run pe2-coll 240 env SHMEM_HEAP_SIZE=4G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
mps_off
pack
