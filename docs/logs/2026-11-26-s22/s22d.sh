#!/usr/bin/env bash
# Session 22 run 4. The build on main (0e8cd49): the standard sweep
# (every op and implementation, f32 and bf16, eager to 256 MiB and graphs
# to 1 MiB; the all-gather target; the MoE forms) and targets.py on it,
# as `gpu-run.sh --bench` runs them but without its test pass; the
# examples and failure cases (`gpu-run.sh --examples`); the MoE forms and
# the all-reduce 256 KiB–1 MiB against main before this session (old/,
# 7695814), once; then the whole SPMD suite at 2 PEs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s22/common.sh"
sweep
tar -C "$dest" -czf "$dest/g.tgz" g
gpu_run e 100 gpu-run-examples.out --examples
ab_each "moe-{v}1" 60 2 --op moe --tokens 1,32,128 --graph --impl shmem,shmem-lines
ab_each "lar-{v}1" 60 2 --op all_reduce --dtype bf16 --min-bytes 256K --max-bytes 1M --graph --impl shmem
run suite 260 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
rm -rf "$g"
pack
