#!/usr/bin/env bash
# Session 14 run 5, one GPU: the one-kernel form's data blocks (the
# division by the bytes a block) worked out by the block's last thread
# beside the plan instead of in the scan, against run 4's build
# (old.tar.xz: ff0c424's shmem-bench and shmemrun), plain builds, each
# three times alternating, at 1 PE and 2 PEs sharing the GPU, and once
# each at 4096 tokens (many working blocks; NCCL beside at 1 PE); the new build's `moe::` at
# 1 PE, at 2 shared both ways and at 3 shared, `moe_server` at 2, the
# sanitizer over the three forms' tests at 2 shared; the phase stamps.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
unpack_old
unpack_phases
large() {
    local p=$1 impls=$2 v b
    for v in old new; do
        b=$here/bin
        [[ $v == old ]] && b=$here/old/bin
        run "large-pe$p-$v" 120 "$b/shmemrun" -n "$p" "$b/shmem-bench" --backend gpu --op moe --tokens 4096 --graph \
            --impl "$impls" --json "$dest/r/large-pe$p-$v.jsonl"
    done
}
ab_reps 1 3
large 1 shmem,shmem-lines,nccl
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
phases 1
mps_on 2
ab_reps 2 3
large 2 shmem,shmem-lines
moe_tests_2
phases 2
mps_off
mps_on 3
run pe3-moe 180 env SHMEM_HEAP_SIZE=1G "$bin/shmemrun" -n 3 "$bin/spmd" moe::
mps_off
sanitize_forms
pack
