#!/usr/bin/env bash
# Session 13 run 1, one GPU: where the MoE kernels' and the low-latency
# all-reduce's time goes, from a profiling build's phase stamps
# (the bundle built with SHMEM_KERNEL_PHASES=1, kernels/phases.cuh), at
# 1 PE and at 2 PEs sharing the GPU;
# each configuration its own bench process, so its stamps are its own.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
phases() {
    local p=$1
    for impl in shmem shmem-lines; do
        for t in 1 128; do
            run "pe$p-$impl-dispatch-$t" 60 "$bin/shmemrun" -n "$p" --tag-output "$bin/shmem-bench" --backend gpu --op dispatch \
                --tokens "$t" --graph --impl "$impl" --json "$dest/r/pe$p-$impl-dispatch-$t.jsonl"
        done
    done
    run "pe$p-ll-allreduce" 60 "$bin/shmemrun" -n "$p" --tag-output "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 \
        --max-bytes 8 --graph --impl shmem --json "$dest/r/pe$p-ll-allreduce.jsonl"
}
phases 1
mps_on 2
phases 2
mps_off
pack
