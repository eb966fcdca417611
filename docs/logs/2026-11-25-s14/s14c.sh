#!/usr/bin/env bash
# Session 14 run 3, one GPU: run 2's build with the out_splits_offsets'
# first warp found without a division, against run 1's build
# (old.tar.xz: f26bad6's shmem-bench and shmemrun), plain builds, each
# three times alternating, at 1 PE and 2 PEs sharing the GPU; the new
# build's `moe::` at 1 PE and 2 shared both ways, `moe_server` at 2; then
# the phase stamps of the same source in a profiling build
# (phases.tar.xz: shmem-bench and shmemrun built with
# SHMEM_KERNEL_PHASES=1), as session 13's s13a.sh took them.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
ab_run --phases
pack
