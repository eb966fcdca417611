#!/usr/bin/env bash
# Session 16 run 1, one GPU. A team of one (here the world of a 1-PE run):
# every op and dtype through shmem's kernels (--solo-ce-min-bytes 1024G:
# never the copy engine, as before this session) and through a copy engine
# at every size (--solo-ce-min-bytes 0), NCCL in the same runs, twice each
# alternating; then every `coll::` test at 1 PE (the world takes the copy
# path from 1 MiB), and at 2 PEs sharing the GPU the split-team tests
# (teams of one: "even PEs" [0], "odd PEs" [1]) and the graph replays.
# Last, at 2 PEs sharing, the low-latency kernels' grid (16/32/56/128
# blocks) on all-reduce and all-gather from 4 KiB to 1 MiB, graphs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
bench=(--op all --dtype f32,bf16 --max-bytes 256M --graph --graph-max-bytes 1M --impl shmem,nccl)
for k in 1 2; do
    for v in kern ce; do
        t=1024G
        [[ $v == ce ]] && t=0
        run "pe1-$v$k" 170 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/shmem-bench" --backend gpu "${bench[@]}" \
            --solo-ce-min-bytes "$t" --json "$dest/r/pe1-$v$k.jsonl"
    done
done
run pe1-coll 300 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" coll::
mps_on 2
run pe2-teams 200 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::teams::
run pe2-graph 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::graph_replay
for b in 16 32 56 128; do
    run "pe2-ll$b" 60 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce,all_gather --dtype bf16 \
        --min-bytes 4K --max-bytes 1M --graph --impl shmem --ll-blocks "$b" --json "$dest/r/pe2-ll$b.jsonl"
done
mps_off
pack
