#!/usr/bin/env bash
# On a machine of one GPU (or few): SPMD tests with several PEs sharing each
# GPU under a CUDA MPS daemon of this run's own, at chosen shapes, and, with
# --bench, chosen bench rows of two builds measured alternately in the same
# run. Cheaper than gpu-run.sh for one device call: binaries as xz files
# (each alone, so that no archive of every binary is needed), a time limit
# per step and for the whole run, and every log packed into one logs.tgz
# under $OUT (a device call returns only a few files).
#
#   bash ci/gpu-share.sh [--bin DIR] [--base DIR] [--filter TEXT] [--shapes "1 2 2r 2n 4 4r 4n"]
#                        [--bench "ROWS"] [--reps N] [--deadline SECONDS]
#
# --bin: the folder of spmd, shmemrun and shmem-bench (or their .xz).
# --shapes: PE counts; a suffix r forces every peer onto RMA
# (SHMEM_FORCE_RMA=1), n splits the PEs into 2 emulated nodes; "suite" in
# --filter's place runs the whole suite. --base: another build's
# shmem-bench, benched against --bin's; --bench: its rows' flags
# (default: the 8-byte all-reduce and the 1-token MoE layer at 1 PE).
# Steps past --deadline (default 560 s from the start) are skipped.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
bin=$here/bin base='' filter=err shapes="1 2 2r 2n 4 4r 4n" bench='' reps=2 deadline=560
while (($#)); do
    case $1 in
    --bin) bin=$2; shift ;;
    --base) base=$2; shift ;;
    --filter) filter=$2; shift ;;
    --shapes) shapes=$2; shift ;;
    --bench) bench=$2; shift ;;
    --reps) reps=$2; shift ;;
    --deadline) deadline=$2; shift ;;
    *) echo "gpu-share: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
for d in "$bin" ${base:+"$base"}; do
    for f in "$d"/*.xz; do
        [[ -e $f && ! -x ${f%.xz} ]] && xz -dk "$f" && chmod +x "${f%.xz}"
    done
done
env_sh=$here/gpu-env.sh
[[ -f $env_sh ]] || env_sh=$bin/../gpu-env.sh
. "$env_sh" || exit 1
export SHMEM_BACKEND=gpu SHMEM_HEAP_SIZE=${SHMEM_HEAP_SIZE:-2G}
summary=$out/summary.txt
: >"$summary"

# step NAME LIMIT CMD...: runs CMD with its output in NAME.log, within
# LIMIT seconds and the run's deadline; its test counts go to summary.txt.
step() {
    local name=$1 limit=$2 left=$((deadline - SECONDS))
    shift 2
    if ((left < 15)); then
        echo "$name: skipped, out of time" | tee -a "$summary"
        return
    fi
    ((limit > left)) && limit=$left
    local start=$SECONDS
    timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
    echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$summary"
    grep -E "^test result|panicked" "$out/$name.log" | head -5 | tee -a "$summary"
}

# The bench rows first, with the GPU to themselves.
if [[ -n $base ]]; then
    rows=${bench:-"--op all_reduce --dtype bf16 --max-bytes 8 --graph"}
    layer="--op moe_layer --graph --tokens 1 --topk 8 --hidden 7168 --experts-per-pe 8"
    for ((rep = 1; rep <= reps; rep++)); do
        for which in base new; do
            dir=$bin
            [[ $which == base ]] && dir=$base
            # shellcheck disable=SC2086 # the rows' flags are words
            step "bench-$which-$rep" 90 "$bin/shmemrun" -n 1 "$dir/shmem-bench" --backend gpu --impl shmem $rows \
                --json "$out/bench-$which-$rep.jsonl"
            [[ -z $bench ]] && step "bench-layer-$which-$rep" 90 "$bin/shmemrun" -n 1 "$dir/shmem-bench" \
                --backend gpu --impl shmem $layer --json "$out/bench-layer-$which-$rep.jsonl"
        done
    done
fi

export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY=$out/mps-log
CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d)
mkdir -p "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "gpu-share: the CUDA MPS daemon did not start" | tee -a "$summary"; exit 1; }
trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1' EXIT
gpus=$(nvidia-smi -L | grep -c '^GPU')
args=()
[[ $filter != suite ]] && args=("$filter")
for shape in $shapes; do
    pes=${shape%[rn]}
    per=$(((pes + gpus - 1) / gpus))
    run=("$bin/shmemrun" -n "$pes")
    vars=(SHMEM_PES_PER_GPU="$per" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / per)))
    case $shape in
    *r) vars+=(SHMEM_FORCE_RMA=1) ;;
    *n) run+=(--nodes 2) ;;
    esac
    # The 1-PE world runs the scenarios, whose jobs of 2 PEs share the GPU.
    ((pes == 1)) && vars=(SHMEM_PES_PER_GPU=2 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 SHMEM_TEST_SCENARIO_BACKEND=gpu)
    step "spmd-$shape" 300 env "${vars[@]}" "${run[@]}" "$bin/spmd" "${args[@]}"
done
tar -C "$out" -czf "$out/logs.tgz" --exclude logs.tgz . 2>/dev/null
cat "$summary"
