#!/usr/bin/env bash
# Session 21 run 1. Lines of 120 data bytes (a 4-byte flag a half; 112 for
# reductions of 8-byte elements) and the line reduction's own words
# loaded before the peers' lines (b90648d), against the build before
# (old/, afcbb67's kernels: fab65c0's); alt/ warms the line all-reduce's
# addresses before the stream wait (README). The all-reduce 128 KiB–2 MiB
# (bf16, graphs) and the other line collectives and the MoE line kernel,
# twice each; the all-reduce of f32; the profiling build's stamps; NCCL;
# then the whole SPMD suite at 2 PEs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s21/common.sh"
for k in 1 2; do
    ab3 "ar-{v}$k" 60 --op all_reduce --dtype bf16 --min-bytes 128K --max-bytes 2M --graph --impl shmem
done
ab_lines 1
ab_each "f32-{v}" 60 2 --op all_reduce,reduce_scatter --dtype f32 --min-bytes 256K --max-bytes 1M --graph --impl shmem
[[ -d $here/phases ]] && phases_ar 256K 1M
nccl_ar 128K 2M
run suite 300 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
pack
