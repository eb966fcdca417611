#!/usr/bin/env bash
# Session 22 run 1. The all-reduce by lines with room for the next
# operation's blocks beside it (variants/): this build (main, 7695814)
# against v1 (two blocks an SM, 56 registers), v2 (one line a pass, two
# blocks an SM), v3 (one line a pass, one block an SM), the all-reduce
# (bf16, graphs) 256 KiB–1 MiB and 768 KiB, three times, alternating;
# this build on blocks of 320 and 288 threads (room beside at 96
# registers); block 0's stamps at 512 KiB and 1 MiB
# (main's and v2's profiling builds).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s22/common.sh"
for k in 1 2 3; do
    for v in new v1 v2 v3; do
        bench_v $v "ar-$v$k" --op all_reduce --dtype bf16 --min-bytes 256K --max-bytes 1M --graph --impl shmem
        bench_v $v "ar768-$v$k" --op all_reduce --dtype bf16 --min-bytes 768K --max-bytes 768K --graph --impl shmem
    done
done
for t in 320 288; do
    bench_v new "ar-t$t" --op all_reduce --dtype bf16 --min-bytes 512K --max-bytes 1M --graph --impl shmem --ll-threads $t
done
phases_ar 512K 1M
for s in 512K 1M; do
    ar_at "$here/v2ph/bin" "ph-v2-ar$s" "$s" "$s" - --tag-output
done
pack
