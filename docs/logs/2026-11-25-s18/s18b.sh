#!/usr/bin/env bash
# Session 18 run 2, two H100s. This session's build (185c4b5: the line
# kernels' two passes at once only where a warp has a second, the MoE line
# kernel's own copy beside the peers' lines and its splits gated ahead of
# the rows) against dc17ab6 (old/): the all-reduce, all-gather and
# reduce-scatter by lines, and the MoE forms at 1, 32 and 128 tokens,
# graphs, twice each alternating. The profiling build's stamps (phases/)
# at 1 and 128 tokens. Then the new build's `moe::` both ways,
# `moe_server` and `coll::`.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s18/common.sh"
start_ab_phases
for k in 1 2; do
    ab_each "moe-{v}$k" 60 2 --op moe --tokens 1,32,128 --graph --impl shmem,nccl
    ab_each "ar-{v}$k" 40 2 --op all_reduce --dtype bf16,f32 --min-bytes 256K --max-bytes 1M --graph --impl shmem,nccl
    ab_each "mv-{v}$k" 40 2 --op all_gather,reduce_scatter --dtype bf16 --min-bytes 256K --max-bytes 1M --graph \
        --impl shmem,nccl
done
for t in 1 128; do
    for op in dispatch all_to_all_v combine; do
        run "ph$t-$op" 60 "$here/phases/bin/shmemrun" -n 2 --tag-output "$here/phases/bin/shmem-bench" --backend gpu \
            --op "$op" --tokens "$t" --graph --impl shmem-lines --json "$dest/r/ph$t-$op.jsonl"
    done
done
run moe 150 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
run moe-rma 150 env SHMEM_FORCE_RMA=1 SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
run moe_server 90 "$bin/shmemrun" -n 2 --tag-output "$bin/moe_server"
run coll 170 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
pack
