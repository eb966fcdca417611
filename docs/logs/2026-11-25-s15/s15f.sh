#!/usr/bin/env bash
# Session 15 run 6, one GPU: the line kernel's grid on every SM where no
# PEs share a GPU (at most 128 blocks; 7/8 of a PE's share only where they
# do) against run 5's build (old.tar.xz: 897c7a6's shmem-bench and
# shmemrun), plain builds, three times alternating at 1 PE (128 blocks
# against 116 for 128 tokens), once each with 8 experts a token, once at 2
# PEs sharing the GPU (the same grids: both builds 57 blocks); the new
# build's `moe::` at 1 PE and at 2 shared both ways, `moe_server` at 2.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s15/common.sh"
ab_run --topk1 --reps2 1
pack
