#!/usr/bin/env bash
# Session 19 run 2, two GPUs. The stress test rebuilt to recreate session
# 18's torn line (L2 flushed, packets ending inside a line, then lines):
# old/ (8621847, one flag a line, with this test) against this build (a
# flag a half), 250 rounds a seed; the line tests; the MoE forms, old
# against new (graphs; the line kernel now sends two passes at once).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-26-s19/common.sh"
unpack_old
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
stress old/bin old 250 1 2 3 4
stress bin new 250 1 2 3 4 5 6 7 8
run lines 200 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" lines
ab_each "moe-{v}" 60 2 --op moe --tokens 1,32,128 --graph --impl shmem,shmem-lines,nccl
ab_each "ar-{v}" 60 2 --op all_reduce --dtype bf16 --min-bytes 256K --max-bytes 1M --graph --impl shmem \
    --ll-lines-min-bytes 0
stress old/bin old2 250 5 6 7 8
pack
