#!/usr/bin/env bash
# Session 18 run 6, two H100s. The MoE line kernel's gate raised by block
# 0's split-sending warps alone, with no block barrier (this build),
# against run 4's build (mid/, ceb556d) and dc17ab6 (old/): the MoE forms
# at 1, 32 and 128 tokens, graphs, each build three times in turn. Then
# `gpu-run.sh --moe` (MoE tests both ways, moe_server, the PyTorch check,
# the MoE bench rows).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
unpack_old
mkdir -p "$here/mid"
tar -C "$here/mid" -xJf "$here/mid.tar.xz"
for k in 1 2 3; do
    for v in old mid new; do
        b=$here/bin
        [[ $v != new ]] && b=$here/$v/bin
        run "moe-$v$k" 60 "$b/shmemrun" -n 2 "$b/shmem-bench" --backend gpu --op moe --tokens 1,32,128 --graph \
            --impl shmem,nccl --json "$dest/r/moe-$v$k.jsonl"
    done
done
OUT=$dest/g timeout 150 bash "$here/gpu-run.sh" --moe >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run --moe: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
pack
