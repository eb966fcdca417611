# Sourced by this session's drivers, after session 12's common.sh (the
# box's environment, `run`, `mps_on`/`mps_off`, `unpack_old`, `pack`):
# `ab_reps PES REPS`, the MoE forms' bench at PES PEs, the old build
# (old.tar.xz) and the new alternating REPS times; `unpack_phases` and
# `phases PES`, a profiling build's (phases.tar.xz: shmem-bench and
# shmemrun built with SHMEM_KERNEL_PHASES=1) stamps of the MoE forms, one
# token, each op its own bench process so that its stamps are its own.
# (The drivers had these steps inline when they ran; the same commands.)
ab_reps() {
    local p=$1 reps=$2 k v b
    for ((k = 1; k <= reps; k++)); do
        for v in old new; do
            b=$here/bin
            [[ $v == old ]] && b=$here/old/bin
            run "pe$p-$v$k-moe" 60 "$b/shmemrun" -n "$p" "$b/shmem-bench" --backend gpu --op moe --tokens 1,32,128 --graph \
                --impl shmem,shmem-lines --json "$dest/r/pe$p-$v$k-moe.jsonl"
        done
    done
}
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
    local p=$1 k=$2 v b
    for v in old new; do
        b=$here/bin
        [[ $v == old ]] && b=$here/old/bin
        run "pe$p-${v}1-topk$k" 60 "$b/shmemrun" -n "$p" "$b/shmem-bench" --backend gpu --op moe --tokens 1,32,128 --graph \
            --topk "$k" --impl shmem,shmem-lines --json "$dest/r/pe$p-${v}1-topk$k.jsonl"
    done
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
