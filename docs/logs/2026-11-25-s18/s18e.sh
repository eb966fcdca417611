#!/usr/bin/env bash
# Session 18 run 5, two H100s. The MoE line kernel's splits sent first by
# block 0 without a barrier, the barrier and the gate only where the rows
# wait (this build), against run 4's build (mid/, ceb556d) and dc17ab6
# (old/): the MoE forms at 1, 32 and 128 tokens, graphs, each build three
# times in turn. Then `gpu-run.sh --moe` (MoE tests both ways,
# moe_server, the PyTorch check, the MoE bench rows).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s18/common.sh"
ab3 3
moe_run
pack
