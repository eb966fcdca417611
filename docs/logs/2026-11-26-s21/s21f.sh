#!/usr/bin/env bash
# Session 21 run 8. The byte loops of load_at/store_at kept rolled (the
# kernels' code a third to a half as long) against d5aa52e (old/):
# `ab_all 1` (every collective 8 B–1 MiB, the all-reduce to 2 MiB, the MoE
# forms at 1, 32 and 128 tokens) and the all-reduce 128 KiB–1 MiB twice
# more; v6 = this build with the MoE line kernel on lines of 120 bytes
# (MoeLines = LinesOf<4>, kernels only), the MoE line kernel at 1, 32 and
# 128 tokens beside old and new; the all-reduce's stamps at 256 KiB and 1
# MiB in this build's profiling build (phases/) and b90648d's (v9ph120/);
# then the whole SPMD suite at 2 PEs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s21/common.sh"
ab_all 1
for k in 2 3; do
    for v in old new; do
        bench_v $v "arx-$v$k" --op all_reduce --dtype bf16 --min-bytes 128K --max-bytes 1M --graph --impl shmem
    done
done
for k in 1 2; do
    for v in old new v6; do
        bench_v $v "ml-$v$k" --op moe --tokens 1,32,128 --graph --impl shmem-lines
    done
done
phases_ar 256K 1M
for s in 256K 1M; do
    ar_at "$here/v9ph120/bin" "ph120-ar$s" "$s" "$s" - --tag-output
done
run suite 300 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
pack
