#!/usr/bin/env bash
# Session 15 run 4, one GPU: the MoE grids within the fewest SMs of the
# PEs' GPUs (every block resident at once; under MPS a PE's share) and
# the line kernel's default of 7680 input bytes a block (one pass of its
# warps), against 9a3294f's build (old.tar.xz), plain builds, three times
# alternating at 1 PE and at 2 PEs sharing the GPU, 4096 tokens once each,
# 8 experts a token once each; the new build's `moe::` at 1 PE, at 2
# shared both ways and at 3 shared, `moe_server` at 2.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s15/common.sh"
ab_run --topk --then ab_large
moe_shared 3 150 2G
pack
