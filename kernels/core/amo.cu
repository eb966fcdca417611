// Host-initiated atomics on a peer without an NVLink address (another
// node's PE): one thread performs NVSHMEM's device atomic, which its
// transport carries, and writes the old value back for the host.
#include <nvshmem.h>
#include <cstdint>

namespace {

// `op` as `gpu/amo.rs` numbers it: fetch, set (swap), compare-and-swap,
// fetch-add, -and, -or, -xor.
template <typename T>
__device__ T amo(T *p, int op, T a, T b, int pe);

template <>
__device__ uint32_t amo<uint32_t>(uint32_t *p, int op, uint32_t a, uint32_t b, int pe) {
    switch (op) {
    case 0: return nvshmem_uint32_atomic_fetch(p, pe);
    case 1: return nvshmem_uint32_atomic_swap(p, a, pe);
    case 2: return nvshmem_uint32_atomic_compare_swap(p, a, b, pe);
    case 3: return nvshmem_uint32_atomic_fetch_add(p, a, pe);
    case 4: return nvshmem_uint32_atomic_fetch_and(p, a, pe);
    case 5: return nvshmem_uint32_atomic_fetch_or(p, a, pe);
    default: return nvshmem_uint32_atomic_fetch_xor(p, a, pe);
    }
}

template <>
__device__ uint64_t amo<uint64_t>(uint64_t *p, int op, uint64_t a, uint64_t b, int pe) {
    switch (op) {
    case 0: return nvshmem_uint64_atomic_fetch(p, pe);
    case 1: return nvshmem_uint64_atomic_swap(p, a, pe);
    case 2: return nvshmem_uint64_atomic_compare_swap(p, a, b, pe);
    case 3: return nvshmem_uint64_atomic_fetch_add(p, a, pe);
    case 4: return nvshmem_uint64_atomic_fetch_and(p, a, pe);
    case 5: return nvshmem_uint64_atomic_fetch_or(p, a, pe);
    default: return nvshmem_uint64_atomic_fetch_xor(p, a, pe);
    }
}

}  // namespace

// `op` on PE `pe`'s element at symmetric address `sym` (4 or 8 `bytes`);
// the old value to `old`.
extern "C" __global__ void shmem_amo(uint64_t sym, int op, uint64_t a, uint64_t b, int bytes, int pe,
                                     uint64_t *old) {
    if (bytes == 4)
        *old = amo<uint32_t>(reinterpret_cast<uint32_t *>(sym), op, static_cast<uint32_t>(a),
                             static_cast<uint32_t>(b), pe);
    else
        *old = amo<uint64_t>(reinterpret_cast<uint64_t *>(sym), op, a, b, pe);
}
