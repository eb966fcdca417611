// Shared device code of shmem's own collective kernels, one header per
// concern:
//
// - abi.cuh: what the host passes (structs, limits, constants);
// - core/team_sync.cuh: epochs, signals and barriers of a team;
// - core/agree.cuh: the members' agreement on an eager call, before it moves anything;
// - core/elem.cuh: element types, operators, block-wide reduction;
// - prims/simple.cuh: block copies and sends (NVLink stores or RMA);
// - prims/ll.cuh: the low-latency protocol (8-byte packets);
// - prims/lines.cuh: the line protocol (128-byte lines);
// - prims/push.cuh: the push protocol (staging and one flag a block).
#pragma once
#include "abi.cuh"
#include "core/agree.cuh"
#include "core/elem.cuh"
#include "core/phases.cuh"
#include "prims/lines.cuh"
#include "prims/ll.cuh"
#include "prims/push.cuh"
#include "prims/simple.cuh"
#include "core/team_sync.cuh"
