#!/usr/bin/env bash
# Session 14 run 1, one GPU: the MoE kernels' control cut (verdict from
# the scan's own pass, a kernel for each kind) against the build before
# (old.tar.xz: 0094d0b's shmem-bench and shmemrun, whose kernels are
# 6a70668's), plain builds, each three times alternating, at 1 PE and 2
# PEs sharing the GPU; then the new build's `moe::` at 1 PE, at 2 shared
# both ways and at 4 shared, `moe_server` at 2, and the sanitizer over
# the line tests.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
ab_run
moe_shared 4 180 1G
sanitize_lines
pack
