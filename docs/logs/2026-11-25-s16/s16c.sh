#!/usr/bin/env bash
# Session 16 run 3, one GPU, c2cfa8b's build (run 2's bundle): the rest of
# the suite at 1 PE (every test but `coll::`, which runs 1 and 2 ran: the
# overlapped matmuls, MoE, RMA, teams, errors, scenarios), then
# `gpu-run.sh --examples --overlap` at 1 PE (the examples, the failure
# cases, the overlapped matmuls' tests and bench rows: their all-gathers
# and reduce-scatters on a world of one take the copy path).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
run pe1-rest 240 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" --skip coll::
OUT=$dest/r/ex SHMEM_GPU_PES=1 timeout 300 bash "$here/gpu-run.sh" --examples --overlap >"$dest/r/ex.log" 2>&1
echo "== ex: rc $?" >>"$log"
pack
