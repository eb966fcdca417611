#!/usr/bin/env bash
# Session 19 run 1, two GPUs. The lines with a flag in each 64-byte half
# (this build) against one flag a line (old/: 8621847 with this session's
# stress test): the stress test A/B; every line test; the default
# settings' tests (the buffers' layout moved); the collectives and MoE
# forms in lines, old against new (graphs).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-26-s19/common.sh"
unpack_old
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
stress old/bin old 500 1 2 3
stress bin new 500 1 2 3 4 5 6
run lines 200 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" lines
run defaults 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" ::default
ab_each "coll-{v}" 60 2 --op all_reduce,all_gather,all_to_all --dtype bf16 --min-bytes 128K --max-bytes 1M \
    --graph --impl shmem,nccl --ll-lines-min-bytes 0
ab_each "moe-{v}" 60 2 --op moe --tokens 1,32,128 --graph --impl shmem,shmem-lines,nccl
stress bin new2 500 7 8 9
pack
