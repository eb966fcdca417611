#!/usr/bin/env bash
# Session 12 run 8, one GPU: the line kernel moving two passes of lines a
# warp at once (recv_n) against the build before it (5536cea, as old.tar.xz), A/B
# in one call, each twice alternating: the MoE forms at 1 PE and at 2 PEs
# sharing the GPU. Then every moe:: test at 1 PE and at 2, 4 and 3 PEs
# shared, both ways, coll:: at 2 shared (recv is recv_n<1>), and the line
# tests under compute-sanitizer at 2.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/common.sh"
unpack_old
ab_moe 1
run pe1-moe 100 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 1 "$bin/spmd" moe::
for p in 2 4 3; do
    mps_on "$p"
    ((p == 2)) && ab_moe 2
    run "pe$p-moe" 120 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n "$p" "$bin/spmd" moe::
    run "pe$p-moe-forced-rma" 120 env SHMEM_FORCE_RMA=1 SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n "$p" "$bin/spmd" moe::
    ((p == 2)) && run pe2-coll 240 env SHMEM_HEAP_SIZE=4G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
    mps_off
done
sanitize_lines
pack
