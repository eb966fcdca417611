#!/usr/bin/env bash
# Session 22 run 5. The build on main (0e8cd49's kernels) again, on
# whatever cards the call got: the standard sweep and targets.py, as
# `gpu-run.sh --bench` runs them but without its test pass.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s22/common.sh"
g=$dest/g
mkdir -p "$g"
run bench 300 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all --dtype f32,bf16 --max-bytes 256M \
    --graph --graph-max-bytes 1M --json "$g/bench.jsonl"
run bench-ag-target 120 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_gather --dtype bf16 \
    --min-bytes 512M --max-bytes 512M --impl shmem,nccl --json "$g/bench-ag-target.jsonl"
run bench-moe 120 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op moe --graph --json "$g/bench-moe.jsonl"
python3 "$here/targets.py" "$g" >"$dest/r/targets.txt" 2>&1
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$g"
pack
