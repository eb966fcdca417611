#!/usr/bin/env bash
# Session 21 run 4. The build on main (d5aa52e): the standard sweep
# (every op and implementation, f32 and bf16, eager to 256 MiB and graphs
# to 1 MiB; the all-gather target; the MoE forms) and targets.py on it,
# as `gpu-run.sh --bench` runs them but without its test pass; the
# examples and failure cases (`gpu-run.sh --examples`); then, where the
# box has Nsight Compute, its sections for the all-reduce of 1 MiB (bf16,
# eager, application replay, PE 0's and PE 1's kernel 21).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s21/common.sh"
sweep
gpu_run e 100 gpu-run-examples.out --examples
ls /usr/local/cuda/bin >"$dest/r/cuda-bin.txt" 2>&1
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${ncu:-none}" >>"$log"
if [[ -n $ncu ]]; then
    mkdir -p "$dest/ncu"
    run ncu 150 "$bin/shmemrun" -n 2 "$ncu" --replay-mode application --app-replay-match grid \
        --kernel-name regex:allreduce_ll128 --launch-skip 20 --launch-count 1 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy \
        -o "$dest/ncu/prof-%p" "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 --min-bytes 1M \
        --max-bytes 1M --impl shmem --iters 40 --warmup 5
    for f in "$dest"/ncu/*.ncu-rep; do
        [[ -f $f ]] && "$ncu" --import "$f" --page details >"${f%.ncu-rep}.txt" 2>&1
    done
fi
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$g"
pack
