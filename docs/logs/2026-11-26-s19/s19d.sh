#!/usr/bin/env bash
# Session 19 run 4, two GPUs. The MoE line kernel's senders with a second
# pass take both at once (this build): the line kernel three ways (old/:
# 8621847, 120-byte lines; mid/: run 3's build; this one), three times;
# the stress test; `gpu-run.sh --moe` (MoE tests both ways, moe_server,
# PyTorch check).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-26-s19/common.sh"
unpack_old
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
lines3 3
stress bin new 250 21 22
OUT=$dest/g timeout 150 bash "$here/gpu-run.sh" --moe >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run --moe: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
pack
