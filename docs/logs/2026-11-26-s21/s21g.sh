#!/usr/bin/env bash
# Session 21 run 9. The build on main (6150e2f: the byte loops rolled for
# the packets and the MoE line kernel, not for the line collectives;
# every kernel's machine code d5aa52e's or beac472's) against d5aa52e
# (old/): `ab_all 1`; then the whole SPMD suite at 2 PEs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s21/common.sh"
ab_all 1
run suite 260 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
pack
