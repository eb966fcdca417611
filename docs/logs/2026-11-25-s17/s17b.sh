#!/usr/bin/env bash
# Session 17 run 2, two H100s. The build of this session (the barrier-and-
# push kernels' own copy in one pass with the sends, the reductions' loads
# 8 vectors a thread, lines from 256 KiB, the MoE line kernel wherever it
# fits) against run 1's (old/): the large sizes twice each alternating;
# the broadcast pushed and pulled; the MoE line kernel's bytes a block;
# the all-reduce by lines between 512 KiB and 1 MiB. Then the suite on the
# new build: every `coll::` test in one job, the rest of the SPMD suite
# (and with RMA forced), `gpu-run.sh --moe --examples` (MoE tests both
# ways, moe_server, PyTorch check, the examples and failure cases).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
unpack_old
for k in 1 2; do
    ab_each "ag-{v}$k" 40 2 --op all_gather --dtype bf16 --min-bytes 64M --max-bytes 512M --impl shmem,nccl
    ab_each "ar-{v}$k" 40 2 --op all_reduce --dtype bf16 --min-bytes 64M --max-bytes 256M --impl shmem,nccl
    ab_each "mv-{v}$k" 40 2 --op broadcast,all_to_all,reduce_scatter --dtype bf16 --min-bytes 64M --max-bytes 256M \
        --impl shmem,nccl
done
export SHMEM_HEAP_SIZE=3G
run bc-push 40 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op broadcast --dtype f32 --min-bytes 16M \
    --max-bytes 256M --impl shmem,nccl --pull-bcast-min-bytes 1G --json "$dest/r/bc-push.jsonl"
run bc-pull 40 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op broadcast --dtype f32 --min-bytes 16M \
    --max-bytes 256M --impl shmem,nccl --json "$dest/r/bc-pull.jsonl"
unset SHMEM_HEAP_SIZE
for b in 3840 7680 15360; do
    run "moe-lines-$b" 40 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op moe --tokens 1,32,128 --graph \
        --impl shmem,shmem-lines --moe-block-bytes "$b" --json "$dest/r/moe-lines-$b.jsonl"
done
for s in 512K 640K 768K 896K 1M; do
    run "ar-ll128-$s" 30 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 \
        --min-bytes "$s" --max-bytes "$s" --graph --impl shmem-ll128,nccl --json "$dest/r/ar-ll128-$s.jsonl"
done
run coll 150 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
run spmd 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" --skip coll:: --skip moe::
run spmd-rma 120 env SHMEM_FORCE_RMA=1 SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" --skip coll:: --skip moe::
OUT=$dest/g timeout 150 bash "$here/gpu-run.sh" --moe --examples >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run --moe --examples: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
pack
