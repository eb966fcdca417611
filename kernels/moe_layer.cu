// The device side of `MoeAllToAll` (shmem/src/moe/layer.rs), so that a
// whole MoE step can be captured in a CUDA graph: `shmem_moe_route` sorts
// the (token, slot) pairs by global expert, `shmem_moe_gather` copies the
// tokens into send order, and `shmem_moe_combine_<dtype>` sums each
// token's returned rows with its weights. The token count is read on the
// device. A bad expert id or token count poisons the dispatch's first
// split with a marker, so the dispatch's check fails on every PE and
// the host names the token.
#include "common.cuh"

namespace shmem {
namespace k {

// This call's tokens, or -1 when the count is out of range.
__device__ __forceinline__ int64_t route_tokens(const TeamSync &t, const MoeRoute &r) {
    int64_t n = *t.mine<int64_t>(r.n_tokens);
    return n < 0 || n > r.max_tokens ? -1 : n;
}

}  // namespace k
}  // namespace shmem

using shmem::k::MoeRoute;
using shmem::k::TeamSync;

// One block: a stable counting sort. Thread o owns a contiguous range of
// slots; it counts them per expert (column o of the scratch), an exclusive
// scan in (expert, owner) order turns the counts into first rows, and each
// owner hands out rows to its slots in order — so each expert's rows are in
// (token, slot) order.
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_moe_route(TeamSync t, MoeRoute r) {
    using namespace shmem::k;
    const int owners = blockDim.x, o = threadIdx.x, E = r.experts;
    const int64_t *ids = t.mine<int64_t>(r.ids);
    int64_t *splits = t.mine<int64_t>(r.splits);
    int64_t *slot_rows = t.mine<int64_t>(r.slot_rows);
    uint32_t *count = t.mine<uint32_t>(r.scratch);  // [expert][owner]
    const int64_t n = route_tokens(t, r);
    const uint64_t slots = n < 0 ? 0 : static_cast<uint64_t>(n) * r.top_k;
    const Range mine = split(slots, o, owners);
    __shared__ unsigned long long bad;
    if (o == 0) bad = n < 0 ? 0 : ~0ull;
    for (int g = 0; g < E; g++) count[static_cast<uint64_t>(g) * owners + o] = 0;
    __syncthreads();
    for (uint64_t s = mine.lo; s < mine.hi; s++) {
        int64_t g = ids[s];
        if (g < 0 || g >= E) {
            atomicMin(&bad, s + 1);
        } else {
            count[static_cast<uint64_t>(g) * owners + o]++;
        }
    }
    __syncthreads();
    if (bad != ~0ull) {
        for (int g = o; g < E; g += owners) splits[g] = g == 0 ? kRouteBad - static_cast<int64_t>(bad) : 0;
        return;
    }
    for (int g = o; g < E; g += owners) {
        uint64_t sum = 0;
        for (int x = 0; x < owners; x++) sum += count[static_cast<uint64_t>(g) * owners + x];
        splits[g] = static_cast<int64_t>(sum);
    }
    // Exclusive scan of the E × owners counts: each thread a segment of E.
    __shared__ uint64_t seg[kBlockThreads];
    uint64_t sum = 0;
    for (int i = 0; i < E; i++) sum += count[static_cast<uint64_t>(o) * E + i];
    seg[o] = sum;
    __syncthreads();
    if (o == 0) {
        uint64_t at = 0;
        for (int x = 0; x < owners; x++) {
            uint64_t c = seg[x];
            seg[x] = at;
            at += c;
        }
    }
    __syncthreads();
    uint64_t at = seg[o];
    for (int i = 0; i < E; i++) {
        uint32_t *c = &count[static_cast<uint64_t>(o) * E + i];
        uint32_t here = *c;
        *c = static_cast<uint32_t>(at);
        at += here;
    }
    __syncthreads();
    for (uint64_t s = mine.lo; s < mine.hi; s++) {
        uint32_t *c = &count[static_cast<uint64_t>(ids[s]) * owners + o];
        slot_rows[s] = *c;
        *c = *c + 1;
    }
}

// Row of token s / top_k into send row slot_rows[s], a block per slot.
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_moe_gather(TeamSync t, MoeRoute r) {
    using namespace shmem::k;
    const int64_t n = route_tokens(t, r);
    if (n < 0) return;
    const uint64_t slots = static_cast<uint64_t>(n) * r.top_k;
    const int64_t *slot_rows = t.mine<int64_t>(r.slot_rows);
    const int64_t *ids = t.mine<int64_t>(r.ids);
    for (uint64_t s = blockIdx.x; s < slots; s += gridDim.x) {
        if (ids[s] < 0 || ids[s] >= r.experts) continue;  // the route failed: nothing is sent
        block_copy(t.mine<uint8_t>(r.send + slot_rows[s] * r.row_bytes),
                   t.mine<uint8_t>(r.tokens + (s / r.top_k) * r.row_bytes), r.row_bytes);
    }
}

namespace shmem {
namespace k {

// acc + w × x, rounded after each step as the host reference does (no FMA).
__device__ __forceinline__ float weigh(float acc, float w, float x) { return __fadd_rn(acc, __fmul_rn(w, x)); }
__device__ __forceinline__ double weigh(double acc, float w, double x) {
    return __dadd_rn(acc, __dmul_rn(static_cast<double>(w), x));
}

template <typename T> __device__ void combine_rows(const TeamSync &t, const MoeCombine &c) {
    using A = typename Acc<T>::type;
    int64_t n = *t.mine<int64_t>(c.n_tokens);
    if (n < 0 || n > c.max_tokens) return;
    const T *back = t.mine<T>(c.back);
    const int64_t *slot_rows = t.mine<int64_t>(c.slot_rows);
    const float *w = t.mine<float>(c.weights);
    T *out = t.mine<T>(c.out);
    for (int64_t tok = blockIdx.x; tok < n; tok += gridDim.x) {
        for (int64_t h = threadIdx.x; h < c.hidden; h += blockDim.x) {
            A acc = 0;
            for (int j = 0; j < c.top_k; j++) {
                int64_t s = tok * c.top_k + j;
                acc = weigh(acc, w[s], to_acc(back[slot_rows[s] * c.hidden + h]));
            }
            out[tok * c.hidden + h] = from_acc<T>(acc);
        }
    }
}

}  // namespace k
}  // namespace shmem

using shmem::k::MoeCombine;

#define SHMEM_MOE_COMBINE(name, T)                                        \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) \
        shmem_moe_combine_##name(TeamSync t, MoeCombine c) {              \
        shmem::k::combine_rows<T>(t, c);                                  \
    }
SHMEM_MOE_COMBINE(f32, float)
SHMEM_MOE_COMBINE(f64, double)
SHMEM_MOE_COMBINE(f16, __half)
SHMEM_MOE_COMBINE(bf16, __nv_bfloat16)
