#!/usr/bin/env bash
# Session 14 run 6, one GPU: every load of the send plan and of the
# out_splits_offsets before their stores, the reciprocals by one
# approximate instruction, against run 5's build (old.tar.xz: adc9ecb's
# shmem-bench and shmemrun), plain builds, three times alternating at 1
# PE and 2 PEs sharing the GPU, and once each with every token sent to 8
# experts (--topk 8: several chunks a destination); the new build's
# `moe::` at 1 PE and at 2 shared both ways, `moe_server` at 2, the
# sanitizer over the three forms' tests at 2 shared; the phase stamps.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
unpack_old
unpack_phases
ab_reps 1 3
ab_topk 1 8
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
phases 1
mps_on 2
ab_reps 2 3
ab_topk 2 8
moe_tests_2
phases 2
mps_off
sanitize_forms
pack
