#!/usr/bin/env bash
# Session 14 run 4, one GPU: the scan without its pass for the sums' word,
# the padding by a mask for a power of 2, the scan's divisions by n and
# ne by their reciprocals, the data blocks wanted from the scan, the own
# copy's first chunk by a warp vote (2 to 32 experts), against run 3's
# build (old.tar.xz: a2c2731's shmem-bench and shmemrun), plain builds,
# each three times alternating, at 1 PE and 2 PEs sharing the GPU; the new
# build's `moe::` at 1 PE, at 2 shared both ways and at 4 shared,
# `moe_server` at 2, the sanitizer over the three forms' tests at 2
# shared; the phase stamps of the same source at 1 PE and 2 shared.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
unpack_old
unpack_phases
ab_reps 1 3
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
phases 1
mps_on 2
ab_reps 2 3
moe_tests_2
phases 2
mps_off
mps_on 4
run pe4-moe 180 env SHMEM_HEAP_SIZE=1G "$bin/shmemrun" -n 4 "$bin/spmd" moe::
mps_off
sanitize_forms
pack
