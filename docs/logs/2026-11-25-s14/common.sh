# Sourced by this session's drivers, after session 12's common.sh (the
# box's environment, `run`, `mps_on`/`mps_off`, `unpack_old`, `ab_each`,
# `ab_reps`, `pack`): `unpack_phases` and `phases PES`, a profiling
# build's (phases.tar.xz: shmem-bench and shmemrun built with
# SHMEM_KERNEL_PHASES=1) stamps of the MoE forms, one token, each op its
# own bench process so that its stamps are its own; `ab_topk`,
# `moe_tests_2`, `sanitize_forms`, `moe_shared` and `ab_run` below. (The
# drivers had these steps inline when they ran; the same commands.)
unpack_phases() {
    mkdir -p "$here/phases"
    tar -C "$here/phases" -xJf "$here/phases.tar.xz"
}
phases() {
    local p=$1 b=$here/phases/bin impl op
    for impl in shmem shmem-lines; do
        for op in dispatch combine all_to_all_v; do
            run "ph-pe$p-$impl-$op" 60 "$b/shmemrun" -n "$p" --tag-output "$b/shmem-bench" --backend gpu --op "$op" \
                --tokens 1 --graph --impl "$impl" --json "$dest/r/ph-pe$p-$impl-$op.jsonl"
        done
    done
}
# The MoE forms' bench with each token sent to K experts (--topk), the old
# build then the new, once each (files PES-{old,new}1-topkK: ab.py reads
# them as one more set).
ab_topk() {
    ab_each "pe$1-{v}1-topk$2" 60 "$1" --op moe --tokens 1,32,128 --graph --topk "$2" --impl shmem,shmem-lines
}
# The new build's `moe::` at 2 PEs sharing the GPU both ways (NVLink and
# SHMEM_FORCE_RMA=1) and `moe_server` at 2 (under mps_on 2).
moe_tests_2() {
    run pe2-moe 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
    run pe2-moe-forced-rma 120 env SHMEM_FORCE_RMA=1 SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" moe::
    run pe2-moe_server 90 "$bin/shmemrun" -n 2 --tag-output "$bin/moe_server"
}
# compute-sanitizer (memcheck, racecheck, both ways) over the one-kernel,
# two-kernel and line forms' tests at 2 PEs sharing the GPU.
sanitize_forms() {
    OUT=$dest/r/san SHMEM_GPU_PES=2 SAN_JOBS=4 SAN_TIMEOUT=200 \
        SANITIZE_TESTS='^moe::((plan_then_move::|lines::)?(all_to_all_v|all_to_all_v_2d|all_to_all_v_2d_offset)|errors::(negative_offset|offsets_out_of_order|output_overflow_by_padding|bad_on_one_pe)|dispatch_then_combine_ops)$' \
        timeout 260 bash "$here/gpu-run.sh" --share --sanitize >"$dest/r/san.log" 2>&1
    echo "== san: rc $?" >>"$log"
}
# `moe_shared PES LIMIT HEAP [CMD...]`: under mps_on PES, CMD (if any),
# then the new build's `moe::` at PES PEs sharing the GPU.
moe_shared() {
    local p=$1 limit=$2 heap=$3
    shift 3
    mps_on "$p"
    (($#)) && "$@"
    run "pe$p-moe" "$limit" env SHMEM_HEAP_SIZE="$heap" "$bin/shmemrun" -n "$p" "$bin/spmd" moe::
    mps_off
}
# `ab_run [--phases] [--topk|--topk1] [--reps2 N] [--then FN]`: an A/B
# run's steps at 1 PE and at 2 PEs sharing the GPU: the two builds'
# bench (`ab_reps`, three times; at 2 PEs N times), the new build's
# `moe::` at 1 PE and `moe_tests_2` at 2; with --phases the profiling
# build's stamps after the tests at each; with --topk (--topk1: at 1 PE
# only) `ab_topk PES 8` after the bench; with --then, `FN PES` after that.
ab_run() {
    local ph='' tk1='' tk2='' reps2=3 then=''
    while (($#)); do
        case $1 in
        --phases) ph=1 ;;
        --topk) tk1=1 tk2=1 ;;
        --topk1) tk1=1 ;;
        --reps2) reps2=$2 && shift ;;
        --then) then=$2 && shift ;;
        esac
        shift
    done
    unpack_old
    [[ -n $ph ]] && unpack_phases
    ab_reps 1 3
    [[ -n $tk1 ]] && ab_topk 1 8
    [[ -n $then ]] && "$then" 1
    run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
    [[ -n $ph ]] && phases 1
    mps_on 2
    ab_reps 2 "$reps2"
    [[ -n $tk2 ]] && ab_topk 2 8
    [[ -n $then ]] && "$then" 2
    moe_tests_2
    [[ -n $ph ]] && phases 2
    mps_off
}
