#!/usr/bin/env bash
# Session 16 run 2, one GPU. c2cfa8b's defaults for a team of one (a copy
# engine at every size in graphs; outside, from 2 MiB for reductions and
# 8 MiB for moves) against the kernels alone (--solo-ce-min-bytes 1024G)
# and the copy engine alone (0), NCCL in the same runs; then every
# `coll::` test at 1 PE and the split-team tests (teams of one) at 2 PEs
# sharing the GPU.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
bench=(--op all --dtype f32,bf16 --max-bytes 256M --graph --graph-max-bytes 1M --impl shmem,nccl)
for v in default kern ce; do
    t=()
    [[ $v == kern ]] && t=(--solo-ce-min-bytes 1024G)
    [[ $v == ce ]] && t=(--solo-ce-min-bytes 0)
    run "pe1-${v}1" 170 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/shmem-bench" --backend gpu "${bench[@]}" \
        "${t[@]}" --json "$dest/r/pe1-${v}1.jsonl"
done
run pe1-coll 300 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" coll::
mps_on 2
run pe2-teams 200 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::teams::
mps_off
pack
