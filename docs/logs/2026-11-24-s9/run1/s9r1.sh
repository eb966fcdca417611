#!/usr/bin/env bash
# Session 9 run 1, two H200s, commit fcf99bf's bundle: the tuning sweep,
# the collectives' tests in one job, the MoE set (tests both ways,
# moe_server, bench, PyTorch check), and large all-reduce/all-gather rows.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-/tmp/out}; mkdir -p "$out"
s=$SECONDS
OUT=$out/tune timeout 230 bash "$here/gpu-run.sh" --tune; echo "rc=$? tune $((SECONDS - s))s" >> "$out/summary.txt"
sed -n '1,/^export SHMEM_BACKEND=gpu/p' "$here/gpu-run.sh" | grep -v '^set -uo' | sed "s|^here=.*|here=$here|" > /tmp/env.sh
OUT=$out source /tmp/env.sh
bin=$here/bin
t() { local name=$1 lim=$2; shift 2; echo "=== $name $*" >> "$out/summary.txt"; local s=$SECONDS
    timeout "$lim" "$@" > "$out/$name.log" 2>&1; echo "rc=$? ${name} $((SECONDS - s))s" >> "$out/summary.txt"; }
t coll 150 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
s=$SECONDS
OUT=$out/moe timeout 120 bash "$here/gpu-run.sh" --moe; echo "rc=$? moe $((SECONDS - s))s" >> "$out/summary.txt"
t bench-large 80 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce,all_gather --dtype bf16 --min-bytes 64M --max-bytes 256M --impl shmem,nccl --json "$out/bench-large.jsonl"
echo done >> "$out/summary.txt"
