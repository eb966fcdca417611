#!/usr/bin/env bash
# Session 20 run 6. Run 4's build (fab65c0; the code on main after run 5's
# change was taken back) as bin/: `gpu-run.sh --bench` (the standard
# sweep, targets.txt) and `gpu-run.sh --examples` (the examples and the
# failure cases), each into its own folder.
# (Its start and steps, inline when it ran, are common.sh's now: the
# same commands.)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-26-s20/common.sh"
gpu_run g 240 gpu-run.out --bench
gpu_run e 100 gpu-run-examples.out --examples
pack
