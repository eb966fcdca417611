#!/usr/bin/env bash
# Session 22 run 5. The build on main (0e8cd49's kernels) again, on
# whatever cards the call got: the standard sweep and targets.py, as
# `gpu-run.sh --bench` runs them but without its test pass.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s22/common.sh"
sweep
tar -C "$dest" -czf "$dest/g.tgz" g && rm -rf "$g"
pack
