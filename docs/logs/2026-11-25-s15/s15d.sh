#!/usr/bin/env bash
# Session 15 run 4, one GPU: the MoE grids within the fewest SMs of the
# PEs' GPUs (every block resident at once; under MPS a PE's share) and
# the line kernel's default of 7680 input bytes a block (one pass of its
# warps), against 9a3294f's build (old.tar.xz), plain builds, three times
# alternating at 1 PE and at 2 PEs sharing the GPU, 4096 tokens once each,
# 8 experts a token once each; the new build's `moe::` at 1 PE, at 2
# shared both ways and at 3 shared, `moe_server` at 2.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
large() {
    local p=$1 v b
    for v in old new; do
        b=$here/bin
        [[ $v == old ]] && b=$here/old/bin
        run "pe$p-${v}1-large" 60 "$b/shmemrun" -n "$p" "$b/shmem-bench" --backend gpu --op moe --tokens 4096 --graph \
            --impl shmem --json "$dest/r/pe$p-${v}1-large.jsonl"
    done
}
unpack_old
ab_reps 1 3
ab_topk 1 8
large 1
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
mps_on 2
ab_reps 2 3
ab_topk 2 8
large 2
moe_tests_2
mps_off
mps_on 3
run pe3-moe 150 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 3 "$bin/spmd" moe::
mps_off
pack
