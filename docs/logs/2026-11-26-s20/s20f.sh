#!/usr/bin/env bash
# Session 20 run 6. Run 4's build (fab65c0; the code on main after run 5's
# change was taken back) as bin/: `gpu-run.sh --bench` (the standard
# sweep, targets.txt) and `gpu-run.sh --examples` (the examples and the
# failure cases), each into its own folder.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
nvidia-smi -L >"$dest/r/gpus.txt" 2>&1
OUT=$dest/g timeout 240 bash "$here/gpu-run.sh" --bench >"$dest/r/gpu-run.out" 2>&1
echo "== gpu-run --bench: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$dest/g"
OUT=$dest/e timeout 100 bash "$here/gpu-run.sh" --examples >"$dest/r/gpu-run-examples.out" 2>&1
echo "== gpu-run --examples: rc $?" >>"$log"
tar -C "$dest" -czf "$dest/e.tgz" e && rm -rf "$dest/e"
pack
