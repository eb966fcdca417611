#!/usr/bin/env bash
# Session 16 run 4, one GPU, run 2's build: the eager sizes around the
# team of one's copy-engine thresholds (512 KiB to 16 MiB, every op, f32
# and bf16), the default against the kernels alone (1024G) and the copy
# engine alone (0), NCCL in each, after one warm-up run; three rounds,
# the three alternating.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
bench=(--op all_reduce,reduce_scatter,all_gather,broadcast,all_to_all --dtype f32,bf16 --min-bytes 512K --max-bytes 16M
    --impl shmem,nccl)
run warmup 60 "$bin/shmemrun" -n 1 "$bin/shmem-bench" --backend gpu "${bench[@]}"
for k in 1 2 3; do
    for v in default kern ce; do
        t=()
        [[ $v == kern ]] && t=(--solo-ce-min-bytes 1024G)
        [[ $v == ce ]] && t=(--solo-ce-min-bytes 0)
        run "pe1-$v$k" 60 "$bin/shmemrun" -n 1 "$bin/shmem-bench" --backend gpu "${bench[@]}" "${t[@]}" \
            --json "$dest/r/pe1-$v$k.jsonl"
    done
done
pack
