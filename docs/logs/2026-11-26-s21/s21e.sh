#!/usr/bin/env bash
# Session 21 run 5. Nsight Compute on the all-reduce of 1 MiB (bf16,
# eager; the build on main, d5aa52e), in one application pass (shmemrun's
# bootstrap cannot be replayed, run 4): the kernel's time and its warps'
# sampled stall reasons, PE 0's and PE 1's kernel 21, and the same for the
# 256 KiB all-reduce.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s21/common.sh"
ncu=/usr/local/cuda/bin/ncu
mkdir -p "$dest/ncu"
metrics=gpu__time_duration.sum,nvltx__bytes.sum,nvlrx__bytes.sum,nvltx__bytes_data_user.sum,nvlrx__bytes_data_user.sum
"$ncu" --query-metrics --chip gh100 >"$dest/r/ncu-metrics.txt" 2>&1
for s in 1M 256K; do
    run "ncu-$s" 120 "$bin/shmemrun" -n 2 "$ncu" --replay-mode application --kernel-name regex:allreduce_ll128 \
        --launch-skip 20 --launch-count 1 \
        --metrics "$metrics" \
        -o "$dest/ncu/ar$s-%p" "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 --min-bytes "$s" \
        --max-bytes "$s" --impl shmem --iters 40 --warmup 5
done
for f in "$dest"/ncu/*.ncu-rep; do
    [[ -f $f ]] && "$ncu" --import "$f" --page raw --csv >"${f%.ncu-rep}.csv" 2>&1
done
pack
