#!/usr/bin/env bash
# Session 14 run 6, one GPU: every load of the send plan and of the
# out_splits_offsets before their stores, the reciprocals by one
# approximate instruction, against run 5's build (old.tar.xz: adc9ecb's
# shmem-bench and shmemrun), plain builds, three times alternating at 1
# PE and 2 PEs sharing the GPU, and once each with every token sent to 8
# experts (--topk 8: several chunks a destination); the new build's
# `moe::` at 1 PE and at 2 shared both ways, `moe_server` at 2, the
# sanitizer over the three forms' tests at 2 shared; the phase stamps.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
ab_run --phases --topk
sanitize_forms
pack
