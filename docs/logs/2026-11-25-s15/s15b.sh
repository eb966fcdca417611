#!/usr/bin/env bash
# Session 15 run 2, one GPU: main's kernels (9a3294f, after session 14's
# cuts) through the whole suite at 2 PEs sharing the GPU under MPS
# (`gpu-run.sh --share`: every `coll::` test alone, the rest of the SPMD
# suite under shmemrun, under mpirun and with RMA forced, the examples and
# the failure cases), then `moe::` at 1 PE.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
OUT=$dest/r/full EACH_TIMEOUT=90 timeout 520 bash "$here/gpu-run.sh" --share >"$dest/r/full.log" 2>&1
echo "== full: rc $?" >>"$log"
run pe1-moe 60 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
pack
