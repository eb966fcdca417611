#!/usr/bin/env bash
# Session 21 run 3. d5aa52e (the collectives' lines of 120 bytes, the MoE
# line kernel's of 112, the line reduction's loads in team order) against
# old/ (afcbb67): `ab_all 1` (every collective 8 B–1 MiB, the all-reduce to
# 2 MiB, the MoE forms at 1, 32 and 128 tokens) and the all-reduce 128 KiB–1
# MiB twice more; v5 (d5aa52e, the all-reduce by lines reducing with the
# words it sent where they took one pass: variants/v5-kept.diff) beside
# it; this build's all-reduce of 1 MiB on 96 and 112 blocks of 640 threads
# and on 128 of 640; every collective by lines and NCCL's (bf16, graphs)
# 128 KiB–2 MiB; then the whole SPMD suite at 2 PEs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s21/common.sh"
ab_all 1
for k in 1 2; do
    for v in old new v5; do
        bench_v $v "ar-$v$k" --op all_reduce --dtype bf16 --min-bytes 128K --max-bytes 1M --graph --impl shmem
    done
done
for bt in 96:640 112:640 128:640 128:576; do
    bench_v new "ar1M-b${bt%:*}-t${bt#*:}" --op all_reduce --dtype bf16 --min-bytes 1M --max-bytes 1M --graph \
        --impl shmem --ll-blocks "${bt%:*}" --ll-threads "${bt#*:}"
done
bench_v new "vs-nccl" --op all_reduce,all_gather,reduce_scatter,all_to_all,broadcast --dtype bf16 --min-bytes 128K \
    --max-bytes 2M --graph --impl shmem,nccl
run suite 300 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
pack
