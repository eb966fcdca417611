#!/usr/bin/env bash
# Session 17 run 3, two H100s. The build with the two-shot all-reduce by
# stores alone (AllReduceAlgo::TwoShotStores, now the automatic choice
# past 1 MiB at 2 PEs out of place) and broadcasts no longer pulled by
# default: the all-reduce's tests (every variant), the broadcast's (the
# pulls now a variant of their own), the split teams' by stores and the
# graph replays; the all-reduce from 2 to 256 MiB by each two-shot and
# NCCL, twice; then `gpu-run.sh --moe --bench` (MoE tests, moe_server,
# PyTorch check, every op against NCCL, the all-gather target, targets.txt).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
for f in coll::all_reduce:: coll::broadcast:: coll::teams::two_shot_stores coll::graph_replay; do
    run "test-${f//:/_}" 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" "$f"
done
for k in 1 2; do
    run "ar$k" 60 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16,f32 \
        --min-bytes 2M --max-bytes 256M --impl shmem,shmem-twoshot,shmem-twoshot-stores,nccl --json "$dest/r/ar$k.jsonl"
done
OUT=$dest/g timeout 330 bash "$here/gpu-run.sh" --moe --bench >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run --moe --bench: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
pack
