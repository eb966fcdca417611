// Kernels of the compute–communication overlap (shmem/src/overlap.rs):
// the SM copy that moves a chunk beside a running GEMM, and the sum of the
// partial products a matmul + reduce-scatter gathers into each PE.

#include "core/common.cuh"

// Copies `bytes` from `src` to `dst`, device addresses of which either may
// be a peer's NVLink mapping. The grid is small (the caller's choice): the
// point is to leave the other SMs to the GEMM beside it.
extern "C" __global__ void shmem_copy_sm(uint64_t dst, uint64_t src, uint64_t bytes) {
    char *d = reinterpret_cast<char *>(dst);
    const char *s = reinterpret_cast<const char *>(src);
    const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    uint64_t head = 0;
    if (((dst | src) & 15) == 0) {
        const uint64_t vecs = bytes / 16;
        const uint4 *sv = reinterpret_cast<const uint4 *>(s);
        uint4 *dv = reinterpret_cast<uint4 *>(d);
        // Four loads in flight a thread: NVLink latency wants them.
        uint64_t i = tid;
        for (; i + 3 * stride < vecs; i += 4 * stride) {
            uint4 a = sv[i], b = sv[i + stride], c = sv[i + 2 * stride], e = sv[i + 3 * stride];
            dv[i] = a;
            dv[i + stride] = b;
            dv[i + 2 * stride] = c;
            dv[i + 3 * stride] = e;
        }
        for (; i < vecs; i += stride) dv[i] = sv[i];
        head = vecs * 16;
    }
    for (uint64_t i = head + tid; i < bytes; i += stride) d[i] = s[i];
}

// out[i] = slot 0[i] + slot 1[i] + … + slot n-1[i], slots `stride`
// elements apart, added in slot (PE) order in the accumulation type and
// rounded once: the same sum on every PE, whatever the timing.
namespace shmem {
namespace k {

template <typename T>
__device__ void sum_slots(T *out, const T *slots, uint64_t count, uint64_t stride, int n) {
    const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint64_t step = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t i = tid; i < count; i += step) {
        typename Acc<T>::type acc = to_acc(slots[i]);
        for (int j = 1; j < n; ++j) acc = acc + to_acc(slots[j * stride + i]);
        out[i] = from_acc<T>(acc);
    }
}

}  // namespace k
}  // namespace shmem

#define SUM_SLOTS(name, T)                                                                                        \
    extern "C" __global__ void shmem_sum_slots_##name(uint64_t out, uint64_t slots, uint64_t count,               \
                                                      uint64_t stride, int n) {                                   \
        shmem::k::sum_slots<T>(reinterpret_cast<T *>(out), reinterpret_cast<const T *>(slots), count, stride, n); \
    }
SUM_SLOTS(f32, float)
SUM_SLOTS(f16, __half)
SUM_SLOTS(bf16, __nv_bfloat16)
