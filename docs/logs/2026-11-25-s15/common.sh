# Sourced by this session's drivers (s15a.sh, s15d.sh to s15f.sh):
# sessions 12's and 14's common.sh (the box's environment, `run`, MPS,
# `pack`, `ab_each`, `ab_reps`; `ab_topk`, `moe_tests_2`,
# `sanitize_forms`, `moe_shared`, `ab_run`), then `ab_large PES`, the one
# kernel's MoE bench of 4096 tokens at PES PEs, the old build then the
# new, once each (files PES-{old,new}1-large: ab.py reads them as one more
# set). (The drivers had their steps inline when they ran; the same
# commands.)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
ab_large() {
    ab_each "pe$1-{v}1-large" 60 "$1" --op moe --tokens 4096 --graph --impl shmem
}
