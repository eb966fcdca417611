#!/usr/bin/env bash
# Session 13 run 3, one GPU: is the control's time instruction fetch? A
# profiling build (exp.tar.xz beside the bundle: shmem-bench and
# shmemrun only) whose line kernel runs its control (sums, plans,
# verdict; idempotent) three times in a loop; if the second and third
# passes are much faster than the first, the first pays for cold code.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
mkdir -p "$here/exp"
tar -C "$here/exp" -xJf "$here/exp.tar.xz"
b=$here/exp/bin
for t in 1 128; do
    run "pe1-exp-lines-dispatch-$t" 60 "$b/shmemrun" -n 1 --tag-output "$b/shmem-bench" --backend gpu \
        --op dispatch --tokens "$t" --graph --impl shmem-lines --json "$dest/r/pe1-exp-lines-dispatch-$t.jsonl"
done
pack
