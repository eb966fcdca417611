// shmem's public device header: what a user's own CUDA kernel needs to
// work on symmetric memory through a `PeerHandle` (see the Rust docs of
// `SymmetricBuffer::handle`): every PE's address of a buffer, a signal pad
// per PE, a barrier among the PEs over the signal pads, put-with-signal
// over NVLink, and a bounded wait. Every wait traps after a time limit, so
// a dead peer ends the kernel instead of hanging it.
#pragma once
#include <cstdint>

namespace shmem {

// Memory-model helpers at system scope (peers are other GPUs).
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Spin budget of a wait: about 10 s of the GPU's clock before trapping.
constexpr long long kWaitCycles = 20'000'000'000LL;

// Waits until `*p - target` is non-negative (epochs wrap around).
__device__ __forceinline__ void wait_at_least(const uint32_t *p, uint32_t target) {
    long long start = clock64();
    while (static_cast<int32_t>(ld_acquire(p) - target) < 0) {
        if (clock64() - start > kWaitCycles) {
            printf("shmem: a wait for a peer timed out (signal %u, want %u)\n", ld_acquire(p), target);
            __trap();
        }
    }
}

// The view of one symmetric buffer a kernel gets from a PeerHandle.
struct PeerHandle {
    void *const *buffer_ptrs;        // world_size addresses (0: not reachable)
    uint32_t *const *signal_pads;    // world_size signal pads
    int rank;
    int world_size;
};

// Slots of a signal pad: `SIGNAL_PAD_WORDS_PER_PEER` words per peer.
constexpr int kPadWordsPerPeer = 32;

// A barrier of the block `channel` (< kPadWordsPerPeer) of every PE: the
// same channel must run on every PE, with the same `epoch`, which grows by
// one per barrier (keep it in device memory to stay graph-safe). Call
// from every thread of the block.
__device__ inline void barrier(const PeerHandle &h, int channel, uint32_t epoch) {
    __syncthreads();
    if (threadIdx.x < h.world_size) {
        int peer = threadIdx.x;
        uint32_t *mine = h.signal_pads[h.rank] + channel * h.world_size + peer;
        uint32_t *theirs = h.signal_pads[peer] + channel * h.world_size + h.rank;
        st_release(theirs, epoch);
        wait_at_least(mine, epoch);
    }
    __syncthreads();
}

}  // namespace shmem
