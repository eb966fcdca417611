#!/usr/bin/env bash
# Session 17 run 1, two H100s (`nvidia-h100-x2`, the first two-GPU machine
# since session 9): the run that sessions 10-16 waited for,
# `gpu-run.sh --tune --moe --bench` (its own logs and JSON in g/, its
# verdicts in g/targets.txt); then the large sizes that the bandwidth
# targets ask about, three rounds alternating: the all-gather of 256 MiB a
# rank by the SM kernel, by copy engines and by NCCL, and the all-reduce
# of 256 MiB (bf16) by each algorithm and NCCL.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
nvidia-smi topo -m >"$dest/r/topo.txt" 2>&1
OUT=$dest/g timeout 420 bash "$here/gpu-run.sh" --tune --moe --bench >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run: rc $?" >>"$log"
for k in 1 2 3; do
    run "ag-large$k" 60 env SHMEM_HEAP_SIZE=3G "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_gather \
        --dtype bf16 --min-bytes 128M --max-bytes 512M --impl shmem,shmem-ce,nccl --json "$dest/r/ag-large$k.jsonl"
    run "ar-large$k" 60 env SHMEM_HEAP_SIZE=3G "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce \
        --dtype bf16 --min-bytes 64M --max-bytes 256M --impl shmem,shmem-oneshot,shmem-twoshot,nccl \
        --json "$dest/r/ar-large$k.jsonl"
done
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
pack
