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
. "$here/../docs/logs/2026-11-25-s15/common.sh"
ab_run --topk --then ab_large
moe_shared 3 150 2G ab_reps 3 1
pack
