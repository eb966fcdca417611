#!/usr/bin/env bash
# Session 19 run 8, after the review's mend (f69b7c8: Lines' flags set in
# one place; the stress test's settings restored by the suite's guard):
# the stress test, every line test and the `::default` tests at 2 PEs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-26-s19/common.sh"
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
stress bin new 250 51 52 53
run lines 90 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" lines
run defaults 90 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" ::default
pack
