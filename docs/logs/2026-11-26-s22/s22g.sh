#!/usr/bin/env bash
# Session 22 run 8. `reduce_lines` as one function of one line a pass
# (this build: the dead two-line generality of `reduce_lines_pass` taken
# out; the line all-reduce 2624 instructions against 2688, the line
# reduce-scatter 2584 against 2600) against 0e8cd49 (old/): the
# all-reduce (bf16 and f32) and the reduce-scatter (bf16) by lines, 256
# KiB–1 MiB, three times, alternating; then the whole SPMD suite at 2 PEs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s22/common.sh"
for k in 1 2 3; do
    ab_each "red-{v}$k" 60 2 --op all_reduce,reduce_scatter --dtype bf16,f32 --min-bytes 256K --max-bytes 1M --graph \
        --impl shmem
done
run suite 260 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
pack
