// Shared device code of shmem's own collective kernels, one header per
// concern:
//
// - abi.cuh: what the host passes (structs, limits, constants);
// - team_sync.cuh: epochs, signals and barriers of a team;
// - agree.cuh: the members' agreement on an eager call, before it moves anything;
// - elem.cuh: element types, operators, block-wide reduction;
// - prims_simple.cuh: block copies and sends (NVLink stores or RMA);
// - prims_ll.cuh: the low-latency protocol (8-byte packets);
// - prims_lines.cuh: the line protocol (128-byte lines);
// - prims_push.cuh: the push protocol (staging and one flag a block).
#pragma once
#include "abi.cuh"
#include "agree.cuh"
#include "elem.cuh"
#include "phases.cuh"
#include "prims_lines.cuh"
#include "prims_ll.cuh"
#include "prims_push.cuh"
#include "prims_simple.cuh"
#include "team_sync.cuh"
