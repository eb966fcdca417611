# Sourced by this session's drivers, after session 12's common.sh (the
# box's environment, `run`, `mps_on`/`mps_off`, `unpack_old`, `pack`):
# `ab_reps PES REPS`, the MoE forms' bench at PES PEs, the old build
# (old.tar.xz) and the new alternating REPS times; `unpack_phases` and
# `phases PES`, a profiling build's (phases.tar.xz: shmem-bench and
# shmemrun built with SHMEM_KERNEL_PHASES=1) stamps of the MoE forms, one
# token, each op its own bench process so that its stamps are its own.
# (s14a.sh to s14c.sh had the first and the last inline; the same commands.)
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
