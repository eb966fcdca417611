// Element types of the reductions: their accumulators (half precision
// sums in float), the operators, 16-byte vectors, and the block-wide
// reduction of several members' vectors in team order.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace shmem {
namespace k {

template <typename T> struct Acc { using type = T; };
template <> struct Acc<__half> { using type = float; };
template <> struct Acc<__nv_bfloat16> { using type = float; };

template <typename T> __device__ __forceinline__ typename Acc<T>::type to_acc(T x) { return x; }
template <> __device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_acc(typename Acc<T>::type x) { return x; }
template <> __device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

enum Op { Sum, Min, Max, Prod, And, Or, Xor };

template <int OP, typename A> __device__ __forceinline__ A combine(A a, A b) {
    if constexpr (OP == Sum) return a + b;
    if constexpr (OP == Prod) return a * b;
    if constexpr (OP == Min) return b < a ? b : a;
    if constexpr (OP == Max) return b > a ? b : a;
    if constexpr (OP == And) return a & b;
    if constexpr (OP == Or) return a | b;
    if constexpr (OP == Xor) return a ^ b;
}

// 16-byte vectors of T.
template <typename T> struct alignas(16) Vec {
    static constexpr int kN = 16 / sizeof(T);
    T v[kN];
};

// dsts[d][i] = srcs[0][i] op srcs[1][i] op … (members in team order) for
// i < count, by the whole block. `NP` is the team size when the host
// picked a kernel built for it (2, 4, 8), else 0 (a loop over `n`). Vectors where every
// pointer is 16-byte aligned; elements otherwise.
template <typename T, int OP, int NP>
__device__ void block_reduce(T *const *dsts, int ndst, const T *const *srcs, int n, uint64_t count) {
    using A = typename Acc<T>::type;
    using V = Vec<T>;
    constexpr int kN = V::kN;
    uint64_t align = 0;
    for (int p = 0; p < n; p++) align |= reinterpret_cast<uint64_t>(srcs[p]);
    for (int d = 0; d < ndst; d++) align |= reinterpret_cast<uint64_t>(dsts[d]);
    uint64_t vectors = align % 16 == 0 ? count / kN : 0;
    uint64_t i = threadIdx.x;
    if constexpr (NP > 0) {
        // kU vectors of every member's a thread in flight together (8 in
        // all, as block_copy's 4 a side), before any of their stores:
        // loads through NVLink wait about a microsecond, and one vector a
        // member a thread left the link short of requests.
        constexpr int kU = NP >= 8 ? 1 : 8 / NP;
        const uint64_t step = blockDim.x;
        auto reduce = [&](const V(&x)[NP]) {
            A acc[kN];
#pragma unroll
            for (int e = 0; e < kN; e++) acc[e] = to_acc(x[0].v[e]);
#pragma unroll
            for (int p = 1; p < NP; p++)
#pragma unroll
                for (int e = 0; e < kN; e++) acc[e] = combine<OP>(acc[e], to_acc(x[p].v[e]));
            V out;
#pragma unroll
            for (int e = 0; e < kN; e++) out.v[e] = from_acc<T>(acc[e]);
            return out;
        };
        for (; i + (kU - 1) * step < vectors; i += kU * step) {
            V x[kU][NP];
#pragma unroll
            for (int u = 0; u < kU; u++)
#pragma unroll
                for (int p = 0; p < NP; p++) x[u][p] = reinterpret_cast<const V *>(srcs[p])[i + u * step];
#pragma unroll
            for (int u = 0; u < kU; u++) {
                V out = reduce(x[u]);
                for (int d = 0; d < ndst; d++) reinterpret_cast<V *>(dsts[d])[i + u * step] = out;
            }
        }
        for (; i < vectors; i += step) {
            V x[NP];
#pragma unroll
            for (int p = 0; p < NP; p++) x[p] = reinterpret_cast<const V *>(srcs[p])[i];
            V out = reduce(x);
            for (int d = 0; d < ndst; d++) reinterpret_cast<V *>(dsts[d])[i] = out;
        }
    }
    if constexpr (NP == 0) {
        for (; i < vectors; i += blockDim.x) {
            // Up to 8 members' loads issued together, the rest one by one.
            constexpr int kU = 8;
            A acc[kN];
            V x[kU];
#pragma unroll
            for (int p = 0; p < kU; p++)
                if (p < n) x[p] = reinterpret_cast<const V *>(srcs[p])[i];
#pragma unroll
            for (int e = 0; e < kN; e++) acc[e] = to_acc(x[0].v[e]);
#pragma unroll
            for (int p = 1; p < kU; p++)
                if (p < n)
#pragma unroll
                    for (int e = 0; e < kN; e++) acc[e] = combine<OP>(acc[e], to_acc(x[p].v[e]));
            for (int p = kU; p < n; p++) {
                V y = reinterpret_cast<const V *>(srcs[p])[i];
#pragma unroll
                for (int e = 0; e < kN; e++) acc[e] = combine<OP>(acc[e], to_acc(y.v[e]));
            }
            V out;
#pragma unroll
            for (int e = 0; e < kN; e++) out.v[e] = from_acc<T>(acc[e]);
            for (int d = 0; d < ndst; d++) reinterpret_cast<V *>(dsts[d])[i] = out;
        }
    }
    for (uint64_t i = vectors * kN + threadIdx.x; i < count; i += blockDim.x) {
        A acc = to_acc(srcs[0][i]);
        for (int p = 1; p < n; p++) acc = combine<OP>(acc, to_acc(srcs[p][i]));
        T out = from_acc<T>(acc);
        for (int d = 0; d < ndst; d++) dsts[d][i] = out;
    }
}

}  // namespace k
}  // namespace shmem
