// The module's self-check that NVSHMEM registered it, and the module's
// one definition of `shmem_peer_died` (core/team_sync.cuh).
#include <nvshmem.h>
#include <cstdint>

extern "C" __device__ const volatile uint32_t *shmem_peer_died = nullptr;

// Writes nvshmem_my_pe() and n_pes(): run once at load, this proves the
// module's NVSHMEM device state was initialised (nvshmemx_cumodule_init).
extern "C" __global__ void shmem_selfcheck(int *out) {
    out[0] = nvshmem_my_pe();
    out[1] = nvshmem_n_pes();
}
