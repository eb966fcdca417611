#!/usr/bin/env bash
# Session 14 run 2, one GPU: the send plan a warp a destination, the
# out_splits_offsets without divisions, the data kernels' ending without
# its barriers, against run 1's build (old.tar.xz: f26bad6's shmem-bench
# and shmemrun), plain builds, each three times alternating, at 1 PE and
# 2 PEs sharing the GPU; then the new build's `moe::` at 1 PE, at 2 shared
# both ways and at 3 shared, `moe_server` at 2, and the sanitizer over
# the one-kernel, two-kernel and line forms' tests at 2 shared.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
unpack_old
ab_reps 1 3
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
mps_on 2
ab_reps 2 3
moe_tests_2
mps_off
mps_on 3
run pe3-moe 180 env SHMEM_HEAP_SIZE=1G "$bin/shmemrun" -n 3 "$bin/spmd" moe::
mps_off
sanitize_forms
pack
