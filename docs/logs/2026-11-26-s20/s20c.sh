#!/usr/bin/env bash
# Session 20 run 3. The next member's heap base loaded as the low-latency
# kernels start, beside their first loads, instead of before each send
# after its data (`LL::next_heap`), against run 2's build (old/, a5b5607):
# `ab_all 2`. The alternative build (alt/: the same with the line
# all-reduce's blocks bounded at 640 threads, 96 registers) at 640 and
# 512 threads; this build's line collectives at 384 and 256 threads; the
# profiling build's stamps of the all-reduce; NCCL's all-reduce; then the
# SPMD suite's `coll::` and `moe::`.
# (Its start and steps, inline when it ran, are common.sh's now: the
# same commands.)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s20/common.sh"
ab_all 2
alt_threads 2 640 512
threads_sweep 1 384 256
phases_ar 8 256K 1M
nccl_ar 8 2M
run coll 240 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
run moe 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
pack
