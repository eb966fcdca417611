#!/usr/bin/env bash
# Session 15 run 1, one GPU: the one-kernel and line kernels' push
# (`a2av_push`) inlined (it was a call, its team and arguments behind
# references) and the one-kernel form's splits exchange without integer
# divisions (`div_by`), against 9a3294f's build (old.tar.xz: its
# shmem-bench and shmemrun), plain builds, three times alternating at 1 PE
# and 2 PEs sharing the GPU, once each with 8 experts a token; the new
# build's `moe::` at 1 PE and at 2 shared both ways, `moe_server` at 2,
# the sanitizer over the three forms' tests.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s15/common.sh"
ab_run --topk
sanitize_forms
pack
