#!/usr/bin/env bash
# Session 19 run 7, four GPUs (if lent): b29e154's build (mid/) at 4 PEs,
# which no session had run on GPUs: the stress test, the collectives'
# default and line tests, the MoE tests, and a short bench against NCCL.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-26-s19/common.sh"
mid_as_bin
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
nvidia-smi topo -m >"$dest/r/topo.txt" 2>&1
run stress4 60 env SHMEM_TEST_SEED=41 SHMEM_TEST_ROUNDS=100 SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 4 "$bin/spmd" \
    coll::all_to_all::lines_after_packets
run moe4 60 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 4 "$bin/spmd" moe::
run lines4 60 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 4 "$bin/spmd" lines
run defaults4 90 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 4 "$bin/spmd" ::default
run bench4 40 "$bin/shmemrun" -n 4 "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 --min-bytes 4K \
    --max-bytes 1M --graph --impl shmem,nccl --json "$dest/r/bench4.jsonl"
run moebench4 40 "$bin/shmemrun" -n 4 "$bin/shmem-bench" --backend gpu --op moe --tokens 1,128 --graph \
    --impl shmem,nccl --json "$dest/r/moebench4.jsonl"
pack
