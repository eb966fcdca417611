#!/usr/bin/env bash
# Session 20 run 4. The line kernels' blocks bounded at 640 threads (96
# registers) and by default the warps that take a peer's lines in one
# pass (256–640 threads), against run 3's build (old/, 512 threads at
# every size): `ab_all 2`; the all-reduce of 768 KiB and 1 MiB at 448–640
# threads; the profiling build's stamps (a stamp once the first lines'
# data is in, new); NCCL's all-reduce; then the whole SPMD suite.
# (Its start and steps, inline when it ran, are common.sh's now: the
# same commands.)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s20/common.sh"
ab_all 2
size_threads 768K 448 512 576 640
size_threads 1M 512 576 608 640
phases_ar 256K 1M
nccl_ar 8 2M
run suite 300 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
pack
