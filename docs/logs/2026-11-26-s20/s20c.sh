#!/usr/bin/env bash
# Session 20 run 3. The next member's heap base loaded as the low-latency
# kernels start, beside their first loads, instead of before each send
# after its data (`LL::next_heap`), against run 2's build (old/, a5b5607):
# `ab_all 2`. The alternative build (alt/: the same with the line
# all-reduce's blocks bounded at 640 threads, 96 registers) at 640 and
# 512 threads; this build's line collectives at 384 and 256 threads; the
# profiling build's stamps of the all-reduce; NCCL's all-reduce; then the
# SPMD suite's `coll::` and `moe::`.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
. "$here/../docs/logs/2026-11-26-s20/common.sh"
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
unpack_old
unpack_phases
ab_all 2
alt_threads 2 640 512
threads_sweep 1 384 256
phases_ar 8 256K 1M
run nccl 60 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 --max-bytes 2M \
    --graph --impl nccl --json "$dest/r/nccl.jsonl"
run coll 240 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
run moe 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
pack
