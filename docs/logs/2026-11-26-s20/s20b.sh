#!/usr/bin/env bash
# Session 20 run 2. The low-latency kernels' blocks of 128–512 threads
# (`--ll-threads`, new): at 128 registers a thread, blocks of 512 fill an
# SM, so the next operation's blocks cannot start beside them. The line
# collectives at each (`threads_sweep 2 512 384 256 128`), the profiling
# build's stamps (a stamp after the first loads, new) of the all-reduce at
# 256 KiB and 1 MiB at 512 and 256 threads, and the all-reduce's whole
# sweep (packets too) with the default grid and with 256 threads; then the
# SPMD suite's `coll::` (the tuned variant now at 192 threads).
# (Its start and steps, inline when it ran, are common.sh's now: the
# same commands.)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s20/common.sh"
threads_sweep 2 512 384 256 128
phases_ar_t 512 256K 1M
phases_ar_t 256 256K 1M
for t in 512 256; do
    run "sweep-t$t" 90 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 \
        --max-bytes 4M --graph --impl shmem,nccl --ll-threads "$t" --json "$dest/r/sweep-t$t.jsonl"
done
run coll 240 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
pack
