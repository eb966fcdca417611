// Barrier kernel, and the module's self-check that NVSHMEM registered it.
#include <nvshmem.h>
#include "common.cuh"

// One block: a team barrier over the signal pads (NVLink peers).
extern "C" __global__ void shmem_barrier(shmem::TeamSync t) { shmem::team_barrier(t); }

// Writes nvshmem_my_pe() and n_pes(): run once at load, this proves the
// module's NVSHMEM device state was initialised (nvshmemx_cumodule_init).
extern "C" __global__ void shmem_selfcheck(int *out) {
    out[0] = nvshmem_my_pe();
    out[1] = nvshmem_n_pes();
}
