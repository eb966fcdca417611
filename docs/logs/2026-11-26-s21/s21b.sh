#!/usr/bin/env bash
# Session 21 run 2. Run 1's two changes apart, and the line receivers'
# polls spaced: v1 = afcbb67 with the line reduction's own words loaded
# first; v2 = b90648d (lines of 120 bytes) without that; v3 = v2 with a
# 100 ns sleep between a receiver's polls of a line; v4 = v2 with weak
# (`st.global`) line stores instead of volatile (README). Against
# old/ (afcbb67) and this build (b90648d, both changes), alternating,
# twice: the all-reduce 128 KiB–1 MiB and at 768 KiB (bf16, graphs); the
# other line collectives at 256 KiB–1 MiB and the MoE line kernel at 1, 32
# and 128 tokens for old, v2, v3, v4 and new; then the MoE line kernel's
# stamps at 1 token, afcbb67's profiling build (v9phold) and b90648d's
# (phases/).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s21/common.sh"
for k in 1 2; do
    for v in old v1 v2 new v3 v4; do
        bench_v $v "ar-$v$k" --op all_reduce --dtype bf16 --min-bytes 128K --max-bytes 1M --graph --impl shmem
        bench_v $v "ar768K-$v$k" --op all_reduce --dtype bf16 --min-bytes 768K --max-bytes 768K --graph --impl shmem
    done
    for v in old v2 new v3 v4; do
        bench_v $v "mv-$v$k" --op all_gather,reduce_scatter,all_to_all,broadcast --dtype bf16 --min-bytes 256K \
            --max-bytes 1M --graph --impl shmem
        bench_v $v "moe-$v$k" --op moe --tokens 1,32,128 --graph --impl shmem-lines
    done
done
for v in v9phold phases; do
    for t in 1 32; do
        run "ph-moe$t-$v" 60 "$here/$v/bin/shmemrun" -n 2 --tag-output "$here/$v/bin/shmem-bench" --backend gpu --op moe \
            --tokens $t --graph --impl shmem-lines --json "$dest/r/ph-moe$t-$v.jsonl"
    done
done
pack
