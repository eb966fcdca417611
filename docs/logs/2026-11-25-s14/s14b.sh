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
ab_run
moe_shared 3 180 1G
sanitize_forms
pack
