// All-reduce kernels. One-shot over NVLink: every PE reads every peer's
// source through its peer address and reduces the whole vector, combining
// the PEs in team order (the host backend's order, so results match it
// bit for bit). A barrier on entry (every source is ready) and on exit (no
// PE still reads a source) brackets it; out of place only.
#include "common.cuh"

namespace shmem {

template <typename T, int OP>
__device__ void allreduce_oneshot(TeamSync t, T *dst, uint64_t src_offset, uint64_t count) {
    using A = typename Acc<T>::type;
    team_barrier(t);
    uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
    for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
        const T *src0 = reinterpret_cast<const T *>(t.peer_heap[0] + src_offset);
        A acc = to_acc(src0[i]);
        for (int pe = 1; pe < t.n; pe++) {
            const T *src = reinterpret_cast<const T *>(t.peer_heap[pe] + src_offset);
            acc = combine<OP>(acc, to_acc(src[i]));
        }
        dst[i] = from_acc<T>(acc);
    }
    team_barrier(t);
}

}  // namespace shmem

#define SHMEM_ALLREDUCE(NAME, T, OP)                                                                    \
    extern "C" __global__ void shmem_allreduce_oneshot_##NAME(shmem::TeamSync t, T *dst, uint64_t src_offset, \
                                                               uint64_t count) {                        \
        shmem::allreduce_oneshot<T, shmem::OP>(t, dst, src_offset, count);                              \
    }

#define SHMEM_ALLREDUCE_FLOAT(NAME, T)   \
    SHMEM_ALLREDUCE(NAME##_sum, T, Sum)  \
    SHMEM_ALLREDUCE(NAME##_min, T, Min)  \
    SHMEM_ALLREDUCE(NAME##_max, T, Max)  \
    SHMEM_ALLREDUCE(NAME##_prod, T, Prod)

#define SHMEM_ALLREDUCE_OTHER(NAME, T)  \
    SHMEM_ALLREDUCE(NAME##_sum, T, Sum) \
    SHMEM_ALLREDUCE(NAME##_min, T, Min) \
    SHMEM_ALLREDUCE(NAME##_max, T, Max)

SHMEM_ALLREDUCE_FLOAT(f32, float)
SHMEM_ALLREDUCE_FLOAT(f16, __half)
SHMEM_ALLREDUCE_FLOAT(bf16, __nv_bfloat16)
SHMEM_ALLREDUCE_OTHER(f64, double)
SHMEM_ALLREDUCE_OTHER(i32, int32_t)
SHMEM_ALLREDUCE_OTHER(i64, int64_t)
SHMEM_ALLREDUCE_OTHER(u32, uint32_t)
SHMEM_ALLREDUCE_OTHER(u64, uint64_t)
