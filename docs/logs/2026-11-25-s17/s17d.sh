#!/usr/bin/env bash
# Session 17 run 4, two H100s: the final build (the two-shot by stores from
# 16 MiB) under the whole suite: every `coll::` test in one job, the rest
# of the SPMD suite, the examples and failure cases,
# and the fault scenarios (a PE killed in a barrier, an all-reduce, a MoE
# dispatch) on the gpu backend.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
run coll 170 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
run spmd 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" --skip coll::
OUT=$dest/g timeout 100 bash "$here/gpu-run.sh" --examples --faults >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run --examples --faults: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
pack
