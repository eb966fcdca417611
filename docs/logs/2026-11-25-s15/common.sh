# Sourced by this session's drivers, after sessions 12's and 14's
# common.sh: `ab_large PES`, the one kernel's MoE bench of 4096 tokens at
# PES PEs, the old build then the new, once each (files
# PES-{old,new}1-large: ab.py reads them as one more set). (Run 4's driver
# had it inline as `large`; the same commands.)
ab_large() {
    local p=$1 v b
    for v in old new; do
        b=$here/bin
        [[ $v == old ]] && b=$here/old/bin
        run "pe$p-${v}1-large" 60 "$b/shmemrun" -n "$p" "$b/shmem-bench" --backend gpu --op moe --tokens 4096 --graph \
            --impl shmem --json "$dest/r/pe$p-${v}1-large.jsonl"
    done
}
