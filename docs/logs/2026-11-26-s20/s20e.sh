#!/usr/bin/env bash
# Session 20 run 5. The next member's heap base a kernel parameter
# (`TeamSync::next_heap`) and prefetched as the low-latency kernels start
# (`LL::warm_next`), against run 4's build (old/, fab65c0): `ab_all 2`;
# the profiling build's stamps of the all-reduce; this build's stress
# test; `gpu-run.sh --bench` (the standard sweep, targets.txt); the whole
# SPMD suite at 2 PEs.
# (Its start and steps, inline when it ran, are common.sh's now: the
# same commands.)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s20/common.sh"
ab_all 2
phases_ar 8 256K 1M
stress bin new 250 71 72
gpu_run g 200 gpu-run.out --bench
run suite 230 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
pack
