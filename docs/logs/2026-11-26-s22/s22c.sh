#!/usr/bin/env bash
# Session 22 run 3. The MoE forms (default and line kernel, 1, 32 and 128
# tokens) of main before this session (old/, 7695814), run 2's build
# (this one) and v5 (run 2's build without the whole-line loads and
# stores in the MoE line kernel: variants/nomoe.py), three times,
# alternating; then the all-reduce of f32 and f64 (graphs, 256 KiB–1
# MiB), old and new, twice.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s22/common.sh"
for k in 1 2 3; do
    for v in old new v5; do
        bench_v $v "moe-$v$k" --op moe --tokens 1,32,128 --graph --impl shmem,shmem-lines
    done
done
for k in 1 2; do
    for v in old new; do
        bench_v $v "ar-f-$v$k" --op all_reduce --dtype f32,f64 --min-bytes 256K --max-bytes 1M --graph --impl shmem
    done
done
pack
