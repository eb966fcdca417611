// The low-latency protocol (world team, every peer over NVLink, at most
// `ll_max_bytes(n)` from one PE to another per operation): data travels as
// 16-byte packets {4 data bytes, flag, 4 data bytes, flag} stored into the
// receiver's buffer for the sender; the receiver polls until both flags
// are this operation's, so data and its arrival are one store, with no
// barrier. Two buffers alternate by epoch. A PE writes a buffer again two
// epochs later, after it has received something from the receiver in the
// epoch between, which the receiver sent only after it had finished
// reading that buffer (its kernels run in stream order) — so every LL
// operation receives at least one packet from every peer. A flag is never
// 0 (the zeroed buffer) nor the flag of two epochs before. A thread sends
// all its chunks before it waits for any, so one round trip, not one per
// chunk, is on its critical path.
//
// Epochs: the low-latency and push kernels share one counter per block
// channel (`ll_counter`), and every such kernel, whatever its grid, ends
// by writing its epoch into all kMaxBlocks of them (block b writes b,
// b + grid, …), so they stay equal and the host may pick a grid per call.
#pragma once
#include <cstdint>
#include "core/team_sync.cuh"

namespace shmem {
namespace k {

// The packets' room per sender (`low_latency_room_bytes` in algo.rs,
// which must agree).
__device__ __forceinline__ uint64_t ll_max_bytes(int n) {
    return n <= kPushMaxTeam ? kLLMaxBytesSmallTeam : kLLMaxBytes;
}
// A sender's buffer (for one epoch parity): its packets' room, twice its
// data, and 64 KiB more that only lines use (512 lines), so that the MoE
// line kernel's 128 tokens of 7168 bf16 fit with their splits
// (`low_latency_buffer_bytes` in algo.rs, which must agree).
__device__ __forceinline__ uint64_t ll_buffer_bytes(int n) { return 2 * ll_max_bytes(n) + kLinesSlackBytes; }

// Writes `epoch` into every shared LL/push counter this block owns, a
// thread each (a one-block kernel owns all kMaxBlocks).
__device__ __forceinline__ void ll_counters_end(const TeamSync &t, uint64_t epoch) {
    __syncthreads();
    for (int j = blockIdx.x + threadIdx.x * gridDim.x; j < kMaxBlocks; j += gridDim.x * blockDim.x)
        *t.ll_counter(j) = epoch;
}

__device__ __forceinline__ void st_volatile_v4(uint4 *p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ uint4 ld_volatile_v4(const uint4 *p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// `N` (4 or 8) bytes at byte `off` of `p` (`len` long), zero past the
// end; any alignment. With `kRolled` the byte loop (a tail, an unaligned
// buffer) stays a loop, else the compiler unrolls it at every call site.
// Rolled, the kernels' code is a third to a half as long, which made the
// packets' collectives and the MoE line kernel faster and the line
// collectives slower: the packets (`load8`, `store8`) and the MoE line
// kernel (`MoeLines`) roll them, the line collectives do not.
template <int N, bool kRolled = true>
__device__ __forceinline__ uint64_t load_at(const uint8_t *p, uint64_t off, uint64_t len) {
    const uint8_t *q = p + off;
    if (off + N <= len && reinterpret_cast<uint64_t>(q) % N == 0)
        return N == 8 ? *reinterpret_cast<const uint64_t *>(q) : *reinterpret_cast<const uint32_t *>(q);
    uint64_t v = 0;
    if (kRolled) {
#pragma unroll 1
        for (uint64_t b = off; b < len && b < off + N; b++) v |= static_cast<uint64_t>(p[b]) << (8 * (b - off));
    } else {
        for (uint64_t b = off; b < len && b < off + N; b++) v |= static_cast<uint64_t>(p[b]) << (8 * (b - off));
    }
    return v;
}

// Stores the low `N` bytes of `v` that fall before `len` at byte `off` of
// `p` (`kRolled` as `load_at`).
template <int N, bool kRolled = true>
__device__ __forceinline__ void store_at(uint8_t *p, uint64_t off, uint64_t len, uint64_t v) {
    uint8_t *q = p + off;
    if (off + N <= len && reinterpret_cast<uint64_t>(q) % N == 0) {
        if (N == 8)
            *reinterpret_cast<uint64_t *>(q) = v;
        else
            *reinterpret_cast<uint32_t *>(q) = static_cast<uint32_t>(v);
        return;
    }
    if (kRolled) {
#pragma unroll 1
        for (uint64_t b = off; b < len && b < off + N; b++) p[b] = static_cast<uint8_t>(v >> (8 * (b - off)));
    } else {
        for (uint64_t b = off; b < len && b < off + N; b++) p[b] = static_cast<uint8_t>(v >> (8 * (b - off)));
    }
}

// Bytes [8c, 8c + 8) of `p` (`len` long), zero past the end; any alignment.
__device__ __forceinline__ uint64_t load8(const uint8_t *p, uint64_t c, uint64_t len) { return load_at<8>(p, c * 8, len); }

// Stores the bytes of `v` that fall before `len` at `p + 8c`.
__device__ __forceinline__ void store8(uint8_t *p, uint64_t c, uint64_t len, uint64_t v) { store_at<8>(p, c * 8, len, v); }

// One packet: 8 data bytes with `flag` beside each half, in one 16-byte
// store (each 8-byte half arrives whole).
__device__ __forceinline__ void packet_store(uint4 *p, uint64_t data, uint32_t flag) {
    st_volatile_v4(p, make_uint4(static_cast<uint32_t>(data), flag, static_cast<uint32_t>(data >> 32), flag));
}

// Waits until both halves of the packet at `p` carry `flag`, and returns
// its data; traps when `wait_gives_up`, naming `what` and the sender.
__device__ __forceinline__ uint64_t packet_load(const uint4 *p, uint32_t flag, const char *what, int pe) {
    uint4 v = ld_volatile_v4(p);
    if (v.y != flag || v.w != flag) {
        const long long start = clock64();
        long long next = start + kPeerDiedPollCycles;
        do {
            if (wait_gives_up(start, next)) {
                printf("shmem: stopped waiting for %s from PE %d: a PE died or the wait ran out of time\n", what, pe);
                __trap();
            }
            v = ld_volatile_v4(p);
        } while (v.y != flag || v.w != flag);
    }
    return static_cast<uint64_t>(v.x) | static_cast<uint64_t>(v.z) << 32;
}

// This kernel's low-latency epoch, read by one thread and shared with the
// block (whole block: a barrier).
__device__ __forceinline__ uint64_t block_ll_epoch(const TeamSync &t) {
    __shared__ uint64_t shared_epoch;
    if (threadIdx.x == 0) shared_epoch = *t.ll_counter(blockIdx.x) + 1;
    __syncthreads();
    return shared_epoch;
}

// The same for a warp, without a barrier, in two steps so that the load
// can be in flight beside the caller's others: `lane_ll_counter` (lane 0
// loads the block's counter), then `warp_ll_epoch` of what it loaded
// (whole warp).
__device__ __forceinline__ uint64_t lane_ll_counter(const TeamSync &t) {
    return threadIdx.x % 32 == 0 ? *t.ll_counter(blockIdx.x) : 0;
}
__device__ __forceinline__ uint64_t warp_ll_epoch(uint64_t counter) {
    return __shfl_sync(0xffffffffu, counter, 0) + 1;
}

struct LL {
    const TeamSync &t;
    uint64_t epoch;
    uint32_t flag;
    uint64_t parity;
    // The next member's heap base, (rank + 1) % n: loaded as the object is
    // made, beside the epoch's load and the caller's first loads, so that
    // a send to it (at 2 PEs every send) waits for no load of its own.
    // Else `send` would load `peer_heap[pe]` after its data was in,
    // another load's latency on the way to the link. (Not a kernel
    // parameter: passing it so, and prefetching the peer's buffers from
    // every warp as the kernel starts, made every operation far slower.)
    uint64_t next_heap;

    __device__ LL(const TeamSync &team) : t(team), next_heap(team.peer_heap[team.after(1)]) {
        set_epoch(block_ll_epoch(team));
    }
    // With this kernel's epoch `e`, read already.
    __device__ LL(const TeamSync &team, uint64_t e) : t(team), next_heap(team.peer_heap[team.after(1)]) {
        set_epoch(e);
    }
    __device__ void set_epoch(uint64_t e) {
        epoch = e;
        flag = 1 + mod_2_32_minus_1(e);
        parity = e & 1;
    }
    // `e % 0xffffffff` (2^32 = 1 there, so the halves' sum twice), in a
    // few instructions: the compiler's 64-bit remainder by a constant is
    // a dozen, on the way from the epoch's load to the first send.
    static __device__ uint32_t mod_2_32_minus_1(uint64_t e) {
        uint64_t m = (e & 0xffffffffull) + (e >> 32);
        m = (m & 0xffffffffull) + (m >> 32);
        return m == 0xffffffffull ? 0 : static_cast<uint32_t>(m);
    }
    // Chunks of 8 bytes to move for `bytes` (at least one, so that every
    // peer hears from every peer).
    __device__ uint64_t chunks(uint64_t bytes) const { return bytes == 0 ? 1 : (bytes + 7) / 8; }
    __device__ uint64_t first() const { return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
    __device__ uint64_t stride() const { return static_cast<uint64_t>(gridDim.x) * blockDim.x; }
    __device__ uint64_t slot(int sender, uint64_t c) const {
        return t.ll_offset + (parity * t.n + sender) * ll_buffer_bytes(t.n) + c * 16;
    }
    // Member `pe`'s heap base (NVLink).
    __device__ uint64_t heap_of(int pe) const { return pe == t.after(1) ? next_heap : t.peer_heap[pe]; }
    __device__ void send(int pe, uint64_t c, uint64_t data) const {
        packet_store(reinterpret_cast<uint4 *>(heap_of(pe) + slot(t.rank, c)), data, flag);
    }
    __device__ uint64_t recv(int pe, uint64_t c) const {
        return packet_load(t.mine<uint4>(slot(pe, c)), flag, "a low-latency collective's data", pe);
    }
    __device__ void end() const { ll_counters_end(t, epoch); }
};

}  // namespace k
}  // namespace shmem
