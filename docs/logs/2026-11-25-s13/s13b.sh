#!/usr/bin/env bash
# Session 13 run 2, one GPU: phase stamps of two profiling builds
# (SHMEM_KERNEL_PHASES=1), the one before as old.tar.xz beside the
# bundle: each configuration its own bench process, at 1 PE and at 2 PEs
# sharing the GPU, each build twice, alternating; then the new build's
# `moe::` and `coll::` tests at 1 PE and at 2 shared.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
unpack_old
phases() {
    local p=$1 b k v impl t
    for k in 1 2; do
        for v in old new; do
            b=$here/bin
            [[ $v == old ]] && b=$here/old/bin
            for impl in shmem shmem-lines; do
                for t in 1 128; do
                    run "pe$p-$v$k-$impl-dispatch-$t" 60 "$b/shmemrun" -n "$p" --tag-output "$b/shmem-bench" --backend gpu \
                        --op dispatch --tokens "$t" --graph --impl "$impl" --json "$dest/r/pe$p-$v$k-$impl-dispatch-$t.jsonl"
                done
            done
            run "pe$p-$v$k-ll-allreduce" 60 "$b/shmemrun" -n "$p" --tag-output "$b/shmem-bench" --backend gpu \
                --op all_reduce --dtype bf16 --max-bytes 8 --graph --impl shmem --json "$dest/r/pe$p-$v$k-ll-allreduce.jsonl"
        done
    done
}
phases 1
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
run pe1-coll 220 env SHMEM_HEAP_SIZE=4G "$bin/shmemrun" -n 1 "$bin/spmd" coll::
mps_on 2
phases 2
run pe2-moe 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
run pe2-coll 300 env SHMEM_HEAP_SIZE=4G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
mps_off
pack
