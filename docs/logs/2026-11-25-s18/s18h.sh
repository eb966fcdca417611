#!/usr/bin/env bash
# Session 18 run 8, two H100s. With lines no longer a default (this
# build): run 2's torn-line test (`coll::all_to_all::default`) with ten
# seeds, every collective's default-settings test, and the default
# all-reduce and all-to-all at 256 KiB–1 MiB against NCCL (graphs).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s18/common.sh"
torn_test 12 19 21 22 23 24 25 26 27 28
run defaults 90 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" ::default
run bench 40 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce,all_to_all --dtype bf16 \
    --min-bytes 256K --max-bytes 1M --graph --impl shmem,nccl --json "$dest/r/bench.jsonl"
run moe 40 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op moe --tokens 1,128 --graph \
    --impl shmem,shmem-lines,nccl --json "$dest/r/moe.jsonl"
pack
