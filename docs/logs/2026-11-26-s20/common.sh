# Sourced by this session's drivers, after session 12's common.sh (the
# box's environment, `run`, `unpack_old`, `ab_each`, `pack`) and session
# 14's (`unpack_phases`).
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
# all-reduce (bf16, graphs, the default choice) at each size, each its own
# bench process.
phases_ar() {
    local s b=$here/phases/bin
    for s in "$@"; do
        run "ph-ar$s" 40 "$b/shmemrun" -n 2 --tag-output "$b/shmem-bench" --backend gpu --op all_reduce --dtype bf16 \
            --min-bytes "$s" --max-bytes "$s" --graph --impl shmem --json "$dest/r/ph-ar$s.jsonl"
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
            run "ar-t$t-$k" 40 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 \
                --min-bytes 256K --max-bytes 1M --graph --impl shmem --ll-threads "$t" --json "$dest/r/ar-t$t-$k.jsonl"
            run "ar768K-t$t-$k" 40 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 \
                --min-bytes 768K --max-bytes 768K --graph --impl shmem --ll-threads "$t" \
                --json "$dest/r/ar768K-t$t-$k.jsonl"
            run "mv-t$t-$k" 60 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu \
                --op all_gather,reduce_scatter,all_to_all,broadcast --dtype bf16 --min-bytes 256K --max-bytes 1M \
                --graph --impl shmem --ll-threads "$t" --json "$dest/r/mv-t$t-$k.jsonl"
        done
    done
}
# `phases_ar_t THREADS SIZE...`: as `phases_ar`, the blocks of THREADS.
phases_ar_t() {
    local t=$1 s b=$here/phases/bin
    shift
    for s in "$@"; do
        run "ph-t$t-ar$s" 40 "$b/shmemrun" -n 2 --tag-output "$b/shmem-bench" --backend gpu --op all_reduce \
            --dtype bf16 --min-bytes "$s" --max-bytes "$s" --graph --impl shmem --ll-threads "$t" \
            --json "$dest/r/ph-t$t-ar$s.jsonl"
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
    local reps=$1 k t b=$here/alt/bin
    shift
    mkdir -p "$here/alt"
    tar -C "$here/alt" -xJf "$here/alt.tar.xz"
    for ((k = 1; k <= reps; k++)); do
        for t in "$@"; do
            run "alt-t$t-$k" 40 "$b/shmemrun" -n 2 "$b/shmem-bench" --backend gpu --op all_reduce --dtype bf16 \
                --min-bytes 512K --max-bytes 2M --graph --impl shmem --ll-threads "$t" --json "$dest/r/alt-t$t-$k.jsonl"
            run "alt768K-t$t-$k" 40 "$b/shmemrun" -n 2 "$b/shmem-bench" --backend gpu --op all_reduce --dtype bf16 \
                --min-bytes 768K --max-bytes 768K --graph --impl shmem --ll-threads "$t" \
                --json "$dest/r/alt768K-t$t-$k.jsonl"
        done
    done
}
# `size_threads SIZE THREADS...`: this build's all-reduce (bf16, graphs) of
# SIZE with blocks of each THREADS in turn.
size_threads() {
    local s=$1 t
    shift
    for t in "$@"; do
        run "ar$s-t$t" 40 "$bin/shmemrun" -n 2 "$bin/shmem-bench" --backend gpu --op all_reduce --dtype bf16 \
            --min-bytes "$s" --max-bytes "$s" --graph --impl shmem --ll-threads "$t" --json "$dest/r/ar$s-t$t.jsonl"
    done
}
