// The simple protocol: a block moves its share of the bytes to or from
// every peer, by plain loads and stores through a peer's NVLink address or
// by NVSHMEM's RMA (put, get) where it has none, and the signals of
// core/team_sync.cuh tell the receivers (any team). Also the splitting of work
// among blocks.
#pragma once
#include <cstdint>
#include "core/elem.cuh"
#include "core/team_sync.cuh"

namespace shmem {
namespace k {

// [lo, hi) of `units` split evenly over `parts`.
struct Range {
    uint64_t lo, hi;
};
// a / b, by a 32-bit division where both fit (a 64-bit one is a long
// subroutine on the GPU, on the path of every kernel's first step).
__device__ __forceinline__ uint64_t div64(uint64_t a, uint64_t b) {
    return (a | b) >> 32 == 0 ? static_cast<uint32_t>(a) / static_cast<uint32_t>(b) : a / b;
}
__device__ __forceinline__ Range split(uint64_t units, uint64_t part, uint64_t parts) {
    return {div64(units * part, parts), div64(units * (part + 1), parts)};
}

// Inclusive sum of `v` over the warp's lanes (whole warp).
template <typename T> __device__ __forceinline__ T warp_inclusive_sum(T v) {
    const int lane = threadIdx.x % 32;
    for (int o = 1; o < 32; o <<= 1) {
        const T u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

// Copies `bytes` by the `n` threads of a block whose index less the
// group's first is `tid` (whole warps): 16-byte vectors when both ends
// allow.
__device__ __forceinline__ void group_copy(uint8_t *dst, const uint8_t *src, uint64_t bytes, uint64_t tid,
                                           uint64_t n) {
    uint64_t align = reinterpret_cast<uint64_t>(dst) | reinterpret_cast<uint64_t>(src);
    uint64_t i = 0;
    if (align % 16 == 0) {
        const uint4 *s = reinterpret_cast<const uint4 *>(src);
        uint4 *d = reinterpret_cast<uint4 *>(dst);
        uint64_t v = bytes / 16;
        uint64_t j = tid;
        // Four 16-byte loads in flight a thread before their stores: the
        // stores through NVLink keep more of the link busy.
        for (; j + 3 * n < v; j += 4 * n) {
            uint4 a = s[j], b = s[j + n], c = s[j + 2 * n], e = s[j + 3 * n];
            d[j] = a;
            d[j + n] = b;
            d[j + 2 * n] = c;
            d[j + 3 * n] = e;
        }
        // The rest (at most three vectors a thread), its loads in flight
        // together too: a small copy costs one load's latency, not three.
        if (j < v) {
            uint4 a = s[j], b, c;
            if (j + n < v) b = s[j + n];
            if (j + 2 * n < v) c = s[j + 2 * n];
            d[j] = a;
            if (j + n < v) d[j + n] = b;
            if (j + 2 * n < v) d[j + 2 * n] = c;
        }
        i = v * 16;
    } else if (align % 4 == 0) {
        const uint32_t *s = reinterpret_cast<const uint32_t *>(src);
        uint32_t *d = reinterpret_cast<uint32_t *>(dst);
        for (uint64_t j = tid; j < bytes / 4; j += n) d[j] = s[j];
        i = bytes / 4 * 4;
    }
    for (uint64_t j = i + tid; j < bytes; j += n) dst[j] = src[j];
}

// Copies `bytes` by the whole block.
__device__ __forceinline__ void block_copy(uint8_t *dst, const uint8_t *src, uint64_t bytes) {
    group_copy(dst, src, bytes, threadIdx.x, blockDim.x);
}

// Copies `bytes` at `srcs[k]` to `dsts[k]` for every k < n (n at most
// kMaxTeam, maybe 0; pointers in shared memory), by the whole block, in
// one pass: a thread loads its next four 16-byte vectors of a pair and
// stores them, then goes on to the next pair at the same place. A PE's
// own copy (a pair whose destination is its own memory) so rides along
// its stores through NVLink instead of after them, when the link sits
// idle. With `kOneSrc` every pair's source is srcs[0], loaded once for
// all of them. Pairs with a pointer not 16-byte aligned are copied one
// after another.
template <bool kOneSrc>
__device__ __forceinline__ void block_copy_pairs(uint8_t *const *dsts, const uint8_t *const *srcs, int n,
                                                 uint64_t bytes) {
    // No pair (in place, every peer through RMA): srcs[0] is not set.
    if (n == 0) return;
    uint64_t align = 0;
    for (int k = 0; k < n; k++)
        align |= reinterpret_cast<uint64_t>(dsts[k]) | reinterpret_cast<uint64_t>(srcs[kOneSrc ? 0 : k]);
    if (align % 16 != 0 || n == 1) {
        for (int k = 0; k < n; k++) block_copy(dsts[k], srcs[kOneSrc ? 0 : k], bytes);
        return;
    }
    const uint64_t v = bytes / 16, step = blockDim.x;
    auto load4 = [&](const uint8_t *p, uint64_t j, uint4 (&x)[4]) {
        const uint4 *s = reinterpret_cast<const uint4 *>(p);
#pragma unroll
        for (int u = 0; u < 4; u++) x[u] = s[j + u * step];
    };
    auto store4 = [&](uint8_t *p, uint64_t j, const uint4 (&x)[4]) {
        uint4 *d = reinterpret_cast<uint4 *>(p);
#pragma unroll
        for (int u = 0; u < 4; u++) d[j + u * step] = x[u];
    };
    uint64_t j = threadIdx.x;
    for (; j + 3 * step < v; j += 4 * step) {
        uint4 x[4];
        if constexpr (kOneSrc) {
            load4(srcs[0], j, x);
            for (int k = 0; k < n; k++) store4(dsts[k], j, x);
        } else {
            for (int k = 0; k < n; k++) {
                load4(srcs[k], j, x);
                store4(dsts[k], j, x);
            }
        }
    }
    for (; j < v; j += step)
        for (int k = 0; k < n; k++)
            reinterpret_cast<uint4 *>(dsts[k])[j] = reinterpret_cast<const uint4 *>(srcs[kOneSrc ? 0 : k])[j];
    for (uint64_t i = v * 16 + threadIdx.x; i < bytes; i += step)
        for (int k = 0; k < n; k++) dsts[k][i] = srcs[kOneSrc ? 0 : k][i];
}

// Sends `bytes` at this PE's `src` to heap offset `dst_off` of member
// `pe` (whole block): stores through its NVLink address, or an RMA put
// whose completion `signal(.., pe, ..)` (quiet, then signal) awaits.
__device__ __forceinline__ void block_send(const TeamSync &t, int pe, uint64_t dst_off, const uint8_t *src,
                                           uint64_t bytes) {
    if (bytes == 0) return;
    if (t.nvlink(pe)) {
        block_copy(t.at<uint8_t>(pe, dst_off), src, bytes);
    } else {
        rma_put(t, pe, t.mine<uint8_t>(dst_off), src, bytes);
    }
}

// Reduces elements [lo, hi) of every member's source (heap offset
// `src_off`) into this PE's `dst + lo` and, when `to_peers`, into every
// NVLink peer's copy of `dst_off + lo`: peers' sources are read through
// their NVLink address, or fetched in chunks into this block's RMA
// staging with a get.
template <typename T, int OP, int NP>
__device__ void reduce_range(const TeamSync &t, T *dst, uint64_t dst_off, uint64_t src_off, uint64_t lo,
                             uint64_t hi, bool to_peers) {
    __shared__ const T *srcs[kMaxTeam];
    __shared__ T *dsts[kMaxTeam];
    __shared__ int nd;
    uint64_t chunk = t.rma ? kRmaChunk / sizeof(T) : hi - lo;
    for (uint64_t c = lo; c < hi; c += chunk) {
        uint64_t len = min(chunk, hi - c);
        __syncthreads();
        if (threadIdx.x == 0) {
            nd = 0;
            dsts[nd++] = dst + c;
            for (int pe = 0; pe < t.n; pe++) {
                if (pe == t.rank) {
                    srcs[pe] = t.mine<T>(src_off) + c;
                } else if (t.nvlink(pe)) {
                    srcs[pe] = t.at<T>(pe, src_off) + c;
                    if (to_peers) dsts[nd++] = t.at<T>(pe, dst_off) + c;
                } else {
                    srcs[pe] = reinterpret_cast<const T *>(
                        t.heap + t.temp_offset + (static_cast<uint64_t>(blockIdx.x) * t.n + pe) * kRmaChunk);
                }
            }
        }
        __syncthreads();
        for (int pe = 0; pe < t.n; pe++)
            if (pe != t.rank && !t.nvlink(pe))
                rma_get(t, pe, const_cast<T *>(srcs[pe]), t.mine<T>(src_off) + c, len * sizeof(T));
        __syncthreads();
        block_reduce<T, OP, NP>(dsts, nd, srcs, t.n, len);
    }
}

}  // namespace k
}  // namespace shmem
