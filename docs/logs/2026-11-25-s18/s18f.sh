#!/usr/bin/env bash
# Session 18 run 6, two H100s. The MoE line kernel's gate raised by block
# 0's split-sending warps alone, with no block barrier (this build),
# against run 4's build (mid/, ceb556d) and dc17ab6 (old/): the MoE forms
# at 1, 32 and 128 tokens, graphs, each build three times in turn. Then
# `gpu-run.sh --moe` (MoE tests both ways, moe_server, the PyTorch check,
# the MoE bench rows).
# The same steps as run 5 (s18e.sh), on this build.
exec bash "$(dirname "${BASH_SOURCE[0]}")/s18e.sh"
