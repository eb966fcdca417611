#!/usr/bin/env bash
# Session 15 run 5, one GPU: run 4's build less its SM cap on the one
# kernel's grid (the line kernel's grid alone within 7/8 of the fewest
# SMs of the PEs' GPUs, under MPS a PE's share; its default of 7680 input
# bytes a block) against 9a3294f's build (old.tar.xz), plain builds, three
# times alternating at 1 PE and at 2 PEs sharing the GPU, 4096 tokens and
# 8 experts a token once each, and once each at 3 PEs sharing; the new
# build's `moe::` at 1 PE, at 2 shared both ways and at 3 shared,
# `moe_server` at 2.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
. "$here/../docs/logs/2026-11-25-s15/common.sh"
unpack_old
ab_reps 1 3
ab_topk 1 8
ab_large 1
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
mps_on 2
ab_reps 2 3
ab_topk 2 8
ab_large 2
moe_tests_2
mps_off
mps_on 3
ab_reps 3 1
run pe3-moe 150 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 3 "$bin/spmd" moe::
mps_off
pack
