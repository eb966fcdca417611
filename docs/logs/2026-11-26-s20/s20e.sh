#!/usr/bin/env bash
# Session 20 run 5. The next member's heap base a kernel parameter
# (`TeamSync::next_heap`) and prefetched as the low-latency kernels start
# (`LL::warm_next`), against run 4's build (old/, fab65c0): `ab_all 2`;
# the profiling build's stamps of the all-reduce; this build's stress
# test; `gpu-run.sh --bench` (the standard sweep, targets.txt); the whole
# SPMD suite at 2 PEs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s14/common.sh"
. "$here/../docs/logs/2026-11-26-s19/common.sh"
. "$here/../docs/logs/2026-11-26-s20/common.sh"
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
unpack_old
unpack_phases
ab_all 2
phases_ar 8 256K 1M
stress bin new 250 71 72
OUT=$dest/g timeout 200 bash "$here/gpu-run.sh" --bench >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run --bench: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
run suite 230 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
pack
