#!/usr/bin/env bash
# Session 18 run 1, two H100s. The line kernels taking a warp's lines of
# two passes at once (`Lines::send_all`, `reduce_lines`) against the build
# before (old/, dc17ab6): the all-reduce, all-gather and reduce-scatter by
# lines at 256 KiB–1 MiB and between, graphs, twice each alternating.
# The MoE line kernel's phase stamps at 128 tokens (phases/: shmem-bench
# and shmemrun built with SHMEM_KERNEL_PHASES=1): dispatch, 1D, combine.
# Then the new build's `coll::` tests, and dc17ab6's guard under forced
# RMA (all-gather and broadcast, in place included).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s18/common.sh"
start_ab_phases
for k in 1 2; do
    ab_each "ar-{v}$k" 40 2 --op all_reduce --dtype bf16,f32 --min-bytes 256K --max-bytes 1M --graph --impl shmem,nccl
    ab_each "mv-{v}$k" 40 2 --op all_gather,reduce_scatter --dtype bf16 --min-bytes 256K --max-bytes 1M --graph \
        --impl shmem,nccl
    for s in 640K 768K 896K; do
        ab_each "ar$s-{v}$k" 30 2 --op all_reduce --dtype bf16 --min-bytes "$s" --max-bytes "$s" --graph --impl shmem
    done
done
for op in dispatch all_to_all_v combine; do
    run "ph-$op" 60 "$here/phases/bin/shmemrun" -n 2 --tag-output "$here/phases/bin/shmem-bench" --backend gpu \
        --op "$op" --tokens 128 --graph --impl shmem-lines --json "$dest/r/ph-$op.jsonl"
done
run moe128 40 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op moe --tokens 1,128 --graph \
    --impl shmem,nccl --json "$dest/r/moe128.jsonl"
run coll 170 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
run ag-rma 60 env SHMEM_FORCE_RMA=1 SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::all_gather::
run bc-rma 60 env SHMEM_FORCE_RMA=1 SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::broadcast::
pack
