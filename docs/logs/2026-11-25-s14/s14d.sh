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
ab_run --phases
moe_shared 4 180 1G
sanitize_forms
pack
