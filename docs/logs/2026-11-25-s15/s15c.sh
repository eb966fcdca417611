#!/usr/bin/env bash
# Session 15 run 3, one GPU: main's build (9a3294f), the MoE forms' bench
# at 2 PEs sharing the GPU and at 1 PE with the data blocks sized by
# --moe-block-bytes 32K (the default), 16K, 8K, 4K and 2K of input each:
# do more blocks (fewer passes of lines a warp) shorten the line kernel's
# send and receipt? Tokens 1, 8, 32, 128; graph replays.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
blocks() {
    local p=$1 k bb
    for k in 1 2; do
        for bb in 32K 16K 8K 4K 2K; do
            run "pe$p-bb$bb-$k" 60 "$bin/shmemrun" -n "$p" "$bin/shmem-bench" --backend gpu --op moe --tokens 1,8,32,128 \
                --graph --impl shmem,shmem-lines --moe-block-bytes "$bb" --json "$dest/r/pe$p-bb$bb-$k.jsonl"
        done
    done
}
blocks 1
mps_on 2
blocks 2
mps_off
pack
