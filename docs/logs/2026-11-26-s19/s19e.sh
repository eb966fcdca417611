#!/usr/bin/env bash
# Session 19 run 5, the pair of H200s (if lent). Run 3's build (mid/, the
# defaults with lines a flag a half) as bin/: the stress test on it and on
# old/ (8621847, one flag a line); `gpu-run.sh --moe --bench` (MoE tests
# both ways, moe_server, PyTorch check, the standard sweep, targets.txt);
# the whole SPMD suite at 2 PEs.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-26-s19/common.sh"
mid_as_bin
unpack_old
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
stress old/bin old 250 1 2 3 4
stress bin mid 250 1 2 3 4 5 6
OUT=$dest/g timeout 220 bash "$here/gpu-run.sh" --moe --bench >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run --moe --bench: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
run suite 230 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd"
pack
