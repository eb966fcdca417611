#!/usr/bin/env bash
# Session 14 run 5, one GPU: the one-kernel form's data blocks (the
# division by the bytes a block) worked out by the block's last thread
# beside the plan instead of in the scan, against run 4's build
# (old.tar.xz: ff0c424's shmem-bench and shmemrun), plain builds, each
# three times alternating, at 1 PE and 2 PEs sharing the GPU, and once
# each at 4096 tokens (many working blocks; NCCL beside at 1 PE); the new build's `moe::` at
# 1 PE, at 2 shared both ways and at 3 shared, `moe_server` at 2, the
# sanitizer over the three forms' tests at 2 shared; the phase stamps.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
# The one kernel's 4096 tokens, the old build then the new.
large() {
    case $1 in
    1) ab_each "large-pe1-{v}" 120 1 --op moe --tokens 4096 --graph --impl shmem,shmem-lines,nccl ;;
    2) ab_each "large-pe2-{v}" 120 2 --op moe --tokens 4096 --graph --impl shmem,shmem-lines ;;
    esac
}
ab_run --phases --then large
moe_shared 3 180 1G
sanitize_forms
pack
