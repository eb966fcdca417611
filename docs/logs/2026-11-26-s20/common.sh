# Sourced by this session's drivers (their shared start and steps moved
# here after they ran; the same commands): session 12's common.sh (the
# box's environment, `run`, `unpack_old`, `ab_each`, `pack`), session
# 14's (`unpack_phases`) and session 19's (`stress`); the GPUs' names;
# old/ and phases/ unpacked where the bundle has them.
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
. "$here/../docs/logs/2026-11-26-s19/common.sh"
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
[[ -f $here/old.tar.xz ]] && unpack_old
[[ -f $here/phases.tar.xz ]] && unpack_phases

# `ar_at DIR NAME MIN MAX THREADS [ARG...]`: DIR's shmemrun (with ARGs)
# and shmem-bench, the all-reduce (bf16, graphs, shmem) from MIN to MAX
# bytes on blocks of THREADS (`-`: the default), its log and JSON NAME.
ar_at() {
    local b=$1 name=$2 lo=$3 hi=$4 t=$5 threads=()
    shift 5
    [[ $t != - ]] && threads=(--ll-threads "$t")
    run "$name" 40 "$b/shmemrun" -n 2 "$@" "$b/shmem-bench" --backend gpu --op all_reduce --dtype bf16 \
        --min-bytes "$lo" --max-bytes "$hi" --graph --impl shmem "${threads[@]}" --json "$dest/r/$name.jsonl"
}
# `ab_lines REPS`: the collectives by lines (bf16, graphs, the default
# choice), old/ (the build before) then this one, REPS times: all-reduce
# 128 KiB–2 MiB and at 640, 768 and 896 KiB; all-gather, reduce-scatter,
# all-to-all and broadcast at 256 KiB–1 MiB; the MoE line kernel at 1, 32
# and 128 tokens.
ab_lines() {
    local k s
    for ((k = 1; k <= $1; k++)); do
        ab_each "ar-{v}$k" 60 2 --op all_reduce --dtype bf16 --min-bytes 128K --max-bytes 2M --graph --impl shmem
        for s in 640K 768K 896K; do
            ab_each "ar$s-{v}$k" 40 2 --op all_reduce --dtype bf16 --min-bytes "$s" --max-bytes "$s" --graph --impl shmem
        done
        ab_each "mv-{v}$k" 60 2 --op all_gather,reduce_scatter,all_to_all,broadcast --dtype bf16 --min-bytes 256K \
            --max-bytes 1M --graph --impl shmem
        ab_each "moe-{v}$k" 60 2 --op moe --tokens 1,32,128 --graph --impl shmem-lines
    done
}
# `phases_ar SIZE...`: the profiling build's (phases/) stamps of the
# all-reduce (the default choice) at each size, each its own bench
# process; `phases_ar_t THREADS SIZE...`: the same on blocks of THREADS.
phases_ar() { phases_ar_t - "$@"; }
phases_ar_t() {
    local t=$1 s name
    shift
    for s in "$@"; do
        name=ph-t$t-ar$s
        [[ $t == - ]] && name=ph-ar$s
        ar_at "$here/phases/bin" "$name" "$s" "$s" "$t" --tag-output
    done
}
# `threads_sweep REPS THREADS...`: this build's collectives by lines (bf16,
# graphs) with the low-latency kernels' blocks of each THREADS in turn,
# REPS times: all-reduce 256 KiB–1 MiB and at 768 KiB, then all-gather,
# reduce-scatter, all-to-all and broadcast at 256 KiB–1 MiB.
threads_sweep() {
    local reps=$1 k t
    shift
    for ((k = 1; k <= reps; k++)); do
        for t in "$@"; do
            ar_at "$bin" "ar-t$t-$k" 256K 1M "$t"
            ar_at "$bin" "ar768K-t$t-$k" 768K 768K "$t"
            run "mv-t$t-$k" 60 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu \
                --op all_gather,reduce_scatter,all_to_all,broadcast --dtype bf16 --min-bytes 256K --max-bytes 1M \
                --graph --impl shmem --ll-threads "$t" --json "$dest/r/mv-t$t-$k.jsonl"
        done
    done
}
# `ab_all REPS`: old/ (the build before) then this one, REPS times, bf16,
# graphs, the default choices: the all-reduce 8 B–2 MiB, the other
# collectives 8 B–1 MiB, the MoE forms (default and line kernel) at 1, 32
# and 128 tokens.
ab_all() {
    local k
    for ((k = 1; k <= $1; k++)); do
        ab_each "ar-{v}$k" 60 2 --op all_reduce --dtype bf16 --max-bytes 2M --graph --impl shmem
        ab_each "mv-{v}$k" 90 2 --op all_gather,reduce_scatter,all_to_all,broadcast --dtype bf16 --max-bytes 1M \
            --graph --impl shmem
        ab_each "moe-{v}$k" 60 2 --op moe --tokens 1,32,128 --graph --impl shmem,shmem-lines
    done
}
# `alt_threads REPS THREADS...`: the alternative build in alt/ (alt.tar.xz:
# shmem-bench and shmemrun), the all-reduce (bf16, graphs) at 512 KiB–2
# MiB and at 768 KiB with blocks of each THREADS, REPS times.
alt_threads() {
    local reps=$1 k t
    shift
    mkdir -p "$here/alt"
    tar -C "$here/alt" -xJf "$here/alt.tar.xz"
    for ((k = 1; k <= reps; k++)); do
        for t in "$@"; do
            ar_at "$here/alt/bin" "alt-t$t-$k" 512K 2M "$t"
            ar_at "$here/alt/bin" "alt768K-t$t-$k" 768K 768K "$t"
        done
    done
}
# `size_threads SIZE THREADS...`: this build's all-reduce (bf16, graphs) of
# SIZE with blocks of each THREADS in turn.
size_threads() {
    local s=$1 t
    shift
    for t in "$@"; do
        ar_at "$bin" "ar$s-t$t" "$s" "$s" "$t"
    done
}
# `nccl_ar MIN MAX`: NCCL's all-reduce (bf16, graphs) from MIN to MAX.
nccl_ar() {
    run nccl 60 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 --min-bytes "$1" \
        --max-bytes "$2" --graph --impl nccl --json "$dest/r/nccl.jsonl"
}
# `gpu_run DIR LIMIT OUT ARGS...`: gpu-run.sh with ARGS into DIR/ (then
# DIR.tgz), its output in r/OUT, out of time after LIMIT seconds.
gpu_run() {
    local d=$1 limit=$2 out=$3
    shift 3
    OUT=$dest/$d timeout "$limit" bash "$here/gpu-run.sh" "$@" >"$dest/r/$out" 2>&1
    echo "== gpu-run $*: rc $?" >>"$log"
    tar -C "$dest" -czf "$dest/$d.tgz" "$d" && rm -rf "$dest/$d"
}
