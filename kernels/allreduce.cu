// All-reduce kernels. One-shot over NVLink: every PE reads every peer's
// source through its peer address and reduces the whole vector, combining
// the PEs in team order (the host backend's order, so results match it
// bit for bit). A barrier on entry (every source is ready) and on exit (no
// PE still reads a source) brackets it; out of place only.
#include "common.cuh"

namespace shmem {

// 16-byte vectors of T.
template <typename T> struct alignas(16) Vec16 {
    static constexpr int kN = 16 / sizeof(T);
    T v[kN];
};

template <typename T, int OP>
__device__ void allreduce_oneshot(TeamSync t, T *dst, uint64_t src_offset, uint64_t count) {
    using A = typename Acc<T>::type;
    using V = Vec16<T>;
    team_barrier(t);
    uint64_t tid = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
    // Heap offsets are 256-byte aligned, so whole vectors start at element 0.
    uint64_t vectors = count / V::kN;
    for (uint64_t i = tid; i < vectors; i += stride) {
        V in = reinterpret_cast<const V *>(t.peer_heap[0] + src_offset)[i];
        A acc[V::kN];
#pragma unroll
        for (int k = 0; k < V::kN; k++) acc[k] = to_acc(in.v[k]);
        for (int pe = 1; pe < t.n; pe++) {
            V x = reinterpret_cast<const V *>(t.peer_heap[pe] + src_offset)[i];
#pragma unroll
            for (int k = 0; k < V::kN; k++) acc[k] = combine<OP>(acc[k], to_acc(x.v[k]));
        }
        V out;
#pragma unroll
        for (int k = 0; k < V::kN; k++) out.v[k] = from_acc<T>(acc[k]);
        reinterpret_cast<V *>(dst)[i] = out;
    }
    // The tail that does not fill a vector.
    for (uint64_t i = vectors * V::kN + tid; i < count; i += stride) {
        A acc = to_acc(reinterpret_cast<const T *>(t.peer_heap[0] + src_offset)[i]);
        for (int pe = 1; pe < t.n; pe++)
            acc = combine<OP>(acc, to_acc(reinterpret_cast<const T *>(t.peer_heap[pe] + src_offset)[i]));
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
