#!/usr/bin/env bash
# Session 16 run 5, one GPU: the suite but `coll::` at 1 PE on the gpu
# backend again, the scenarios' jobs now on the host backend by default
# (run 3: 11 `scenario::` tests failed, their 2-4 PE jobs refused on a
# one-GPU box); then one fault scenario with its job on the gpu backend
# at 2 PEs sharing the GPU (as gpu-run.sh --faults --share).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
run pe1-rest 240 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" --skip coll::
mps_on 2
run pe2-fault 120 env SHMEM_BACKEND=host SHMEM_TEST_SCENARIO_BACKEND=gpu SHMEM_TEST_FAULT_PES=2 \
    "$bin/shmemrun" -n 1 "$bin/spmd" --exact scenario::sigkill_in_all_reduce
mps_off
pack
