# Sourced by this session's drivers (from s15a.sh on, but for s15b.sh
# and s15c.sh): sessions 12's and 14's common.sh (the box's environment,
# `run`, MPS, `pack`; `ab_reps`, `ab_topk`, `moe_tests_2`,
# `sanitize_forms`), then `ab_large PES`, the one kernel's MoE bench of
# 4096 tokens at PES PEs, the old build then the new, once each (files
# PES-{old,new}1-large: ab.py reads them as one more set). (Run 4's driver
# had it inline as `large` when it ran; the same commands.)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
ab_large() {
    local p=$1 v b
    for v in old new; do
        b=$here/bin
        [[ $v == old ]] && b=$here/old/bin
        run "pe$p-${v}1-large" 60 "$b/shmemrun" -n "$p" "$b/shmem-bench" --backend gpu --op moe --tokens 4096 --graph \
            --impl shmem --json "$dest/r/pe$p-${v}1-large.jsonl"
    done
}
# Runs 4 and 5's steps (their drivers had them inline when they ran; the
# same commands): the A/B at 1 PE and at 2 PEs sharing the GPU (three
# repetitions, 8 experts a token, 4096 tokens), the new build's `moe::` at
# 1 PE, at 2 shared both ways and at 3 shared, `moe_server` at 2; with
# `grid_steps 3`, the A/B once at 3 shared too.
grid_steps() {
    unpack_old
    ab_reps 1 3
    ab_topk 1 8
    ab_large 1
    run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
    mps_on 2
    ab_reps 2 3
    ab_topk 2 8
    ab_large 2
    moe_tests_2
    mps_off
    mps_on 3
    [[ ${1:-} == 3 ]] && ab_reps 3 1
    run pe3-moe 150 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 3 "$bin/spmd" moe::
    mps_off
    pack
}
# Runs 1 and 6's first steps (inline in their drivers when they ran; the
# same commands): the A/B at 1 PE, three repetitions and 8 experts a token
# once, and the new build's `moe::` at 1 PE.
ab_one_pe() {
    unpack_old
    ab_reps 1 3
    ab_topk 1 8
    run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
}
