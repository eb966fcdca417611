#!/usr/bin/env bash
# Session 19 run 3, two GPUs. Lines a default again (this build): the
# stress test; the whole SPMD suite at 2 PEs; `gpu-run.sh --moe --bench`
# (MoE tests both ways, moe_server, PyTorch check, the standard sweep and
# targets.txt); the MoE forms (one kernel by --moe-lines-max-bytes 4,
# lines, and old/'s lines: 8621847) and the collectives in lines against
# packets at 128 KiB–1 MiB (graphs).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-26-s19/common.sh"
unpack_old
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
stress bin new 250 11 12 13 14
run moe-one 40 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op moe --tokens 1,32,128 --graph \
    --impl shmem,shmem-lines,nccl --moe-lines-max-bytes 4 --json "$dest/r/moe-one.jsonl"
run moe-old 40 "$here/old/bin/shmemrun" -n 2 "$here/old/bin/shmem-bench" --backend gpu --op moe --tokens 1,32,128 \
    --graph --impl shmem-lines --json "$dest/r/moe-old.jsonl"
for v in 256K 1G; do
    run "coll-$v" 60 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce,all_gather,all_to_all,reduce_scatter,broadcast \
        --dtype bf16 --min-bytes 128K --max-bytes 1M --graph --impl shmem --ll-lines-min-bytes "$v" --json "$dest/r/coll-$v.jsonl"
done
run suite 300 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
OUT=$dest/g timeout 220 bash "$here/gpu-run.sh" --moe --bench >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run --moe --bench: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
pack
