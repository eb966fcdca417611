#!/usr/bin/env bash
# Session 19 run 6. b29e154's build (mid/, the code on main but for
# comments) as bin/: what runs 3 and 5 left out of the full gpu-run: the
# examples and failure cases, the suite but `coll::` under mpirun and
# with RMA forced (the buffers' layout moved the RMA staging); the stress
# test.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-26-s19/common.sh"
mid_as_bin
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
OUT=$dest/g timeout 200 bash "$here/gpu-run.sh" --examples >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run --examples: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
run forced-rma 150 env SHMEM_FORCE_RMA=1 SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" --skip coll::
run mpirun 150 mpirun --allow-run-as-root -np 2 -x SHMEM_HEAP_SIZE=2G -x SHMEM_BACKEND -x LD_LIBRARY_PATH \
    -x NVSHMEM_HOME -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS "$bin/spmd" --skip coll::
stress bin mid 250 31 32 33 34
pack
