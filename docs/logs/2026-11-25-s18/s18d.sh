#!/usr/bin/env bash
# Session 18 run 4, two H100s. The build of ceb556d (Lines::recv as it was
# before this session, recv_lines loading each line after the warp
# converges, the MoE rows gated behind the splits only from 1024 lines a
# peer) against dc17ab6 (old/): the MoE forms at 1, 32 and 128 tokens and
# the all-reduce by lines, graphs, twice each alternating. Then run 2's
# torn-line test (`coll::all_to_all::default`) with its seed and seven
# fresh ones, every `coll::` test, `gpu-run.sh --moe --bench` (MoE tests
# both ways, moe_server, the PyTorch check, the bench sweep and
# targets.txt) and, time allowing, the rest of the suite.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
unpack_old
for k in 1 2; do
    ab_each "moe-{v}$k" 60 2 --op moe --tokens 1,32,128 --graph --impl shmem,nccl
    ab_each "ar-{v}$k" 40 2 --op all_reduce --dtype bf16,f32 --min-bytes 256K --max-bytes 1M --graph --impl shmem,nccl
done
for seed in 1795642967963517520 1 2 3 4 5 6 7; do
    run "a2a-$seed" 60 env SHMEM_TEST_SEED=$seed SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" \
        coll::all_to_all::default
done
run coll 170 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
OUT=$dest/g timeout 240 bash "$here/gpu-run.sh" --moe --bench >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run --moe --bench: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
if ((SECONDS < 470)); then
    run spmd $((560 - SECONDS)) env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" --skip coll:: --skip moe::
fi
pack
