#!/usr/bin/env bash
# Session 18 run 3, two H100s. Run 2's `coll::` failed once: in
# `coll::all_to_all::default` (u32 × 65541 in place, by lines), PE 1 read
# the first 64 bytes of one line stale (an earlier packet operation's)
# under that line's new flag. Does it repeat, with run 2's seed and with
# others, on this session's build (bin/) and on dc17ab6's (old/)?
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
unpack_old
seed=1795642967963517520
for k in 1 2 3; do
    for v in new old; do
        b=$here/bin
        [[ $v == old ]] && b=$here/old/bin
        run "a2a-$v$k" 60 env SHMEM_TEST_SEED=$seed SHMEM_HEAP_SIZE=2G "$b/shmemrun" -n 2 "$b/spmd" \
            coll::all_to_all::default
    done
done
for k in 1 2 3; do
    for v in new old; do
        b=$here/bin
        [[ $v == old ]] && b=$here/old/bin
        run "lines-$v$k" 90 env SHMEM_HEAP_SIZE=2G "$b/shmemrun" -n 2 "$b/spmd" ::lines
    done
done
pack
