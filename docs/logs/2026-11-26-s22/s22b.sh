#!/usr/bin/env bash
# Session 22 run 2. The line all-reduce one line a pass, whole lines
# loaded and stored without per-word checks, the flag's remainder and the
# next member's number without divisions (this build, the tree after
# run 1) against main (old/, 7695814): `ab_all 1`; the all-reduce 256
# KiB–1 MiB and 768 KiB, old, new and v3 (run 1's one line a pass for
# every line kernel), three times; the other collectives 256 KiB–1 MiB,
# the same three, twice; block 0's stamps (v4ph: this build's profiling
# build, with `gap_last`) at 256 KiB and 1 MiB; then the whole SPMD
# suite at 2 PEs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s22/common.sh"
ab_all 1
for k in 1 2 3; do
    for v in old new v3; do
        bench_v $v "lar-$v$k" --op all_reduce --dtype bf16 --min-bytes 256K --max-bytes 1M --graph --impl shmem
        bench_v $v "lar768-$v$k" --op all_reduce --dtype bf16 --min-bytes 768K --max-bytes 768K --graph --impl shmem
    done
done
for k in 1 2; do
    for v in old new v3; do
        bench_v $v "lmv-$v$k" --op all_gather,reduce_scatter,all_to_all,broadcast --dtype bf16 --min-bytes 256K \
            --max-bytes 1M --graph --impl shmem
    done
done
for s in 256K 1M; do
    ar_at "$here/v4ph/bin" "ph-v4-ar$s" "$s" "$s" - --tag-output
done
run suite 260 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
pack
