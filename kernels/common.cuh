// Shared device utilities of shmem's own kernels: element types and their
// accumulators, reduction operators, and the per-team synchronisation
// state that makes the kernels graph-safe (epochs live in device memory
// and advance on the device, never reset by the host).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include "shmem_device.cuh"

namespace shmem {

// Most blocks a collective kernel uses (one signal-pad channel each).
constexpr int kMaxBlocks = kPadWordsPerPeer;

// A team's synchronisation state, in this PE's symmetric heap: a signal
// pad of kMaxBlocks × n words, then kMaxBlocks epoch counters.
struct TeamSync {
    const uint64_t *peer_heap;  // n heap base addresses (device array)
    uint64_t sync_offset;       // heap offset of the pads
    int rank;
    int n;

    __device__ uint32_t *pad(int pe) const {
        return reinterpret_cast<uint32_t *>(peer_heap[pe] + sync_offset);
    }
    __device__ uint32_t *epoch_counter(int block) const {
        return pad(rank) + kMaxBlocks * n + block;
    }
};

// Barrier of block `blockIdx.x` across the team; advances its epoch.
__device__ inline void team_barrier(const TeamSync &t) {
    __shared__ uint32_t epoch;
    if (threadIdx.x == 0) epoch = *t.epoch_counter(blockIdx.x) + 1;
    __syncthreads();
    if (threadIdx.x < t.n) {
        int peer = threadIdx.x;
        st_release(t.pad(peer) + blockIdx.x * t.n + t.rank, epoch);
        wait_at_least(t.pad(t.rank) + blockIdx.x * t.n + peer, epoch);
    }
    __syncthreads();
    if (threadIdx.x == 0) *t.epoch_counter(blockIdx.x) = epoch;
    __syncthreads();
}

template <typename T> struct Acc { using type = T; };
template <> struct Acc<__half> { using type = float; };
template <> struct Acc<__nv_bfloat16> { using type = float; };

template <typename T> __device__ __forceinline__ typename Acc<T>::type to_acc(T x) { return x; }
template <> __device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_acc(typename Acc<T>::type x) { return x; }
template <> __device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

enum Op { Sum, Min, Max, Prod };

template <int OP, typename A> __device__ __forceinline__ A combine(A a, A b) {
    if constexpr (OP == Sum) return a + b;
    if constexpr (OP == Prod) return a * b;
    if constexpr (OP == Min) return b < a ? b : a;
    if constexpr (OP == Max) return b > a ? b : a;
}

}  // namespace shmem
