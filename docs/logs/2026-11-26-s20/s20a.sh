#!/usr/bin/env bash
# Session 20 run 1. Lines spread over every block's SM (`Lines::base`
# numbers the grid's warps across the blocks first) against the build
# before (old/, f69b7c8): `ab_lines 2`; NCCL's all-reduce beside; the
# profiling build's stamps of the all-reduce at 8 B, 256 KiB and 1 MiB;
# then this build's stress test, line tests and `::default` tests.
# (Its start and steps, inline when it ran, are common.sh's now: the
# same commands.)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s20/common.sh"
ab_lines 2
nccl_ar 128K 2M
phases_ar 8 256K 1M
stress bin new 250 61 62
run lines 90 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" lines
run defaults 90 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" ::default
pack
