// shmem's public device header: what a user's own CUDA kernel needs to
// work on symmetric memory through a `PeerHandle` (see the Rust docs of
// `SymmetricBuffer::handle` and `shmem::DEVICE_HEADER`): every PE's address
// of a buffer, a signal pad per PE, put and put-with-signal over NVLink,
// waits for signals, and a barrier among the PEs over the signal pads.
// Every wait traps after a time limit, so a dead peer ends the kernel
// instead of hanging it. Everything is inline; the header compiles with
// nvcc and with NVRTC (which has no C library headers).
//
// Signal pads. Each PE has one pad of `kPadWordsPerPeer * world_size`
// zeroed u32 words, reachable from every PE. Word
//
//     pad(pe)[channel * world_size + from]
//
// is where PE `from` signals PE `pe` on `channel` (0 <= channel <
// kPadWordsPerPeer): one word per ordered pair of PEs and channel, written
// only by `from`. Values only grow (compared modulo 2^32, so they may wrap):
// a set stores an epoch or sequence number, an add counts arrivals. Give
// each block that synchronises its own channel, and give barriers channels
// of their own: a barrier and a put_signal on the same channel share words.
//
// Who calls what: "block" functions are called by every thread of the
// block (they use __syncthreads); "thread" functions by one thread.
#pragma once
#ifdef __CUDACC_RTC__
// NVRTC ships no <cstdint>: the LP64 fixed-width types it would give.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
#else
#include <cstddef>
#include <cstdint>
#endif

namespace shmem {

// ---- Memory-model helpers at system scope (peers are other GPUs) ----

// Thread: load with acquire semantics: later loads see what the writer
// released before its store of this value.
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Thread: store with release semantics: this thread's earlier writes are
// visible to whoever acquires the value.
__device__ __forceinline__ void st_release(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Thread: atomic add with release semantics (no result returned).
__device__ __forceinline__ void add_release(uint32_t *p, uint32_t v) {
    asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Spin budget of a wait: about 10 s of the GPU's clock before trapping.
constexpr long long kWaitCycles = 20'000'000'000LL;

// Thread: waits until `*p - target` is non-negative (values wrap around),
// with acquire semantics. Traps, after printing the word, past kWaitCycles.
__device__ __forceinline__ void wait_at_least(const uint32_t *p, uint32_t target) {
    long long start = clock64();
    while (static_cast<int32_t>(ld_acquire(p) - target) < 0) {
        if (clock64() - start > kWaitCycles) {
            printf("shmem: a wait for a peer timed out (signal %u, want %u)\n", ld_acquire(p), target);
            __trap();
        }
    }
}

// ---- The handle ----

// The view of one symmetric buffer a kernel gets from a PeerHandle (Rust:
// `PeerHandle::device_arg`, passed by value as a kernel argument).
struct PeerHandle {
    void *const *buffer_ptrs;        // world_size addresses (0: not reachable)
    uint32_t *const *signal_pads;    // world_size signal pads
    int rank;
    int world_size;
};
// The layout of `DevicePeerHandle` (shmem/src/handle.rs), which must agree
// (the offsets where there is an `offsetof`: not under NVRTC).
static_assert(sizeof(PeerHandle) == 24, "PeerHandle: size");
#ifndef __CUDACC_RTC__
static_assert(offsetof(PeerHandle, buffer_ptrs) == 0, "PeerHandle::buffer_ptrs");
static_assert(offsetof(PeerHandle, signal_pads) == 8, "PeerHandle::signal_pads");
static_assert(offsetof(PeerHandle, rank) == 16, "PeerHandle::rank");
static_assert(offsetof(PeerHandle, world_size) == 20, "PeerHandle::world_size");
#endif

// Words of a signal pad per peer: the number of channels
// (`SIGNAL_PAD_WORDS_PER_PEER` on the Rust side).
constexpr int kPadWordsPerPeer = 32;

// PE `pe`'s copy of the buffer, as T; null where it is not reachable.
template <typename T = void>
__device__ __forceinline__ T *peer_ptr(const PeerHandle &h, int pe) {
    return static_cast<T *>(h.buffer_ptrs[pe]);
}

// Whether this PE can load and store PE `pe`'s copy (an NVLink peer).
__device__ __forceinline__ bool reachable(const PeerHandle &h, int pe) {
    return h.buffer_ptrs[pe] != nullptr;
}

// The word of PE `pe`'s pad where PE `from` signals on `channel`.
__device__ __forceinline__ uint32_t *signal_word(const PeerHandle &h, int pe, int channel, int from) {
    return h.signal_pads[pe] + channel * h.world_size + from;
}

// ---- Copies ----

namespace detail {

__device__ __forceinline__ uint64_t thread_in_block() {
    return threadIdx.x + blockDim.x * (threadIdx.y + static_cast<uint64_t>(blockDim.y) * threadIdx.z);
}

__device__ __forceinline__ uint64_t threads_in_block() {
    return static_cast<uint64_t>(blockDim.x) * blockDim.y * blockDim.z;
}

// `bytes` from src to dst in units of V, dst and src being equally aligned
// modulo sizeof(V); the unaligned head and the tail go byte by byte.
template <typename V>
__device__ __forceinline__ void copy_in_units(uint8_t *dst, const uint8_t *src, uint64_t bytes) {
    const uint64_t t = thread_in_block(), stride = threads_in_block();
    uint64_t head = (sizeof(V) - reinterpret_cast<uint64_t>(dst) % sizeof(V)) % sizeof(V);
    if (head > bytes) head = bytes;
    const uint64_t units = (bytes - head) / sizeof(V);
    const uint64_t tail = head + units * sizeof(V);
    V *d = reinterpret_cast<V *>(dst + head);
    const V *s = reinterpret_cast<const V *>(src + head);
    for (uint64_t i = t; i < units; i += stride) d[i] = s[i];
    for (uint64_t i = t; i < head; i += stride) dst[i] = src[i];
    for (uint64_t i = tail + t; i < bytes; i += stride) dst[i] = src[i];
}

}  // namespace detail

// Block: copies `bytes` from `src` to `dst` (any addresses this GPU can
// reach, a peer's included): 16-byte vectors where the two addresses are
// equally aligned modulo 16, 4-byte words where modulo 4, else bytes. No
// synchronisation: __syncthreads before `src` is overwritten.
__device__ inline void block_copy(void *dst, const void *src, uint64_t bytes) {
    auto *d = static_cast<uint8_t *>(dst);
    const auto *s = static_cast<const uint8_t *>(src);
    const uint64_t skew = reinterpret_cast<uint64_t>(d) ^ reinterpret_cast<uint64_t>(s);
    if (skew % 16 == 0) {
        detail::copy_in_units<uint4>(d, s, bytes);
    } else if (skew % 4 == 0) {
        detail::copy_in_units<uint32_t>(d, s, bytes);
    } else {
        detail::copy_in_units<uint8_t>(d, s, bytes);
    }
}

// ---- Puts and signals ----

enum SignalOp { kSignalSet, kSignalAdd };

// Thread: signals `peer` on `channel`: sets (or adds `value` to) the word
// of peer's pad that belongs to this PE, with release semantics for this
// thread's earlier writes. For the whole block's writes, use block_signal.
__device__ inline void signal_op(const PeerHandle &h, int peer, int channel, uint32_t value, SignalOp op) {
    uint32_t *word = signal_word(h, peer, channel, h.rank);
    if (op == kSignalAdd) {
        add_release(word, value);
    } else {
        st_release(word, value);
    }
}

// Thread: signal_op that sets the word to `value`.
__device__ inline void signal_set(const PeerHandle &h, int peer, int channel, uint32_t value) {
    signal_op(h, peer, channel, value, kSignalSet);
}

// Thread: signal_op that adds `value` (counts arrivals, e.g. one per block
// of the sender).
__device__ inline void signal_add(const PeerHandle &h, int peer, int channel, uint32_t value) {
    signal_op(h, peer, channel, value, kSignalAdd);
}

// Block: signals `peer` on `channel` once every thread of the block has
// issued its earlier stores, and they are visible to the system.
__device__ inline void block_signal(const PeerHandle &h, int peer, int channel, uint32_t value,
                                    SignalOp op = kSignalSet) {
    __syncthreads();
    // The release is cumulative: the barrier puts every thread's stores
    // before it (no fence.sc.sys needed).
    if (detail::thread_in_block() == 0) {
        signal_op(h, peer, channel, value, op);
    }
}

// Block: copies `bytes` from `src` (this GPU) to byte `dst_offset` of
// `peer`'s copy of the buffer, through its peer pointer (peer must be
// reachable). No completion: signal after it (block_signal) if a peer
// is to read the data.
__device__ inline void put(const PeerHandle &h, int peer, uint64_t dst_offset, const void *src, uint64_t bytes) {
    block_copy(peer_ptr<uint8_t>(h, peer) + dst_offset, src, bytes);
}

// Block: put, then signal `peer` on `channel` with `value` (set, or add):
// once the peer sees the value (wait_signal_from), the bytes are there.
// `src` may be overwritten when it returns.
__device__ inline void put_signal(const PeerHandle &h, int peer, uint64_t dst_offset, const void *src,
                                  uint64_t bytes, int channel, uint32_t value, SignalOp op = kSignalSet) {
    put(h, peer, dst_offset, src, bytes);
    block_signal(h, peer, channel, value, op);
}

// ---- Waits ----

// Thread: waits until word `slot` (= channel * world_size + peer) of this
// PE's own pad is at least `value`.
__device__ inline void signal_wait(const PeerHandle &h, int slot, uint32_t value) {
    wait_at_least(h.signal_pads[h.rank] + slot, value);
}

// Thread: waits until `peer`'s signal to this PE on `channel` is at least
// `value`. Then this thread sees what the peer released with it; other
// threads of the block do after a __syncthreads.
__device__ inline void wait_signal_from(const PeerHandle &h, int peer, int channel, uint32_t value) {
    wait_at_least(signal_word(h, h.rank, channel, peer), value);
}

// Block: waits until every other PE's signal to this PE on `channel` is at
// least `value`; then every thread of the block sees what they released.
__device__ inline void block_wait_signals(const PeerHandle &h, int channel, uint32_t value) {
    for (uint64_t peer = detail::thread_in_block(); peer < static_cast<uint64_t>(h.world_size);
         peer += detail::threads_in_block()) {
        if (static_cast<int>(peer) != h.rank) wait_signal_from(h, static_cast<int>(peer), channel, value);
    }
    __syncthreads();
}

// ---- Barrier ----

// Block: a barrier of the block `channel` of every PE: every thread's
// earlier stores (peers' memory included) are visible to every PE's block
// after it. The same channel must run on every PE, with the same `epoch`,
// which grows by one per barrier on that channel (keep it in device memory
// to stay graph-safe). Needs blockDim.x >= world_size.
__device__ inline void barrier(const PeerHandle &h, int channel, uint32_t epoch) {
    __syncthreads();
    if (threadIdx.x < h.world_size) {
        int peer = threadIdx.x;
        st_release(signal_word(h, peer, channel, h.rank), epoch);
        wait_at_least(signal_word(h, h.rank, channel, peer), epoch);
    }
    __syncthreads();
}

// ---- MoE arrivals (MoeAllToAll::arrivals) ----
//
// A decode step's expert kernel can start on one source's rows as they
// land: the dispatch stores, per (local expert, source PE), the epoch of
// the dispatch in a flag once that source's rows are all in the expert's
// block, with release semantics after the rows at the scope of this
// PE's GPU, where the waiting kernels run (a pair that receives no row is
// marked too). The k-th dispatch of an exchange marks k; flags only
// grow, so nothing is reset and CUDA-graph replays keep working: the host
// reads the last epoch (`Arrivals::last_epoch`) and a kernel waits for a
// later one, counting its own steps in device memory under graph replays.

// The view of an exchange's flags a kernel gets (Rust:
// `Arrivals::device_arg`, passed by value).
struct MoeArrivals {
    const uint64_t *flags;  // experts_per_pe * n_pes, entry expert * n_pes + source
    const uint64_t *epoch;  // the epoch of the last dispatch to have started placing rows
    int n_pes;
    int experts_per_pe;
};
// The layout of `DeviceMoeArrivals` (shmem/src/moe/arrivals.rs).
static_assert(sizeof(MoeArrivals) == 24, "MoeArrivals: size");
#ifndef __CUDACC_RTC__
static_assert(offsetof(MoeArrivals, flags) == 0, "MoeArrivals::flags");
static_assert(offsetof(MoeArrivals, epoch) == 8, "MoeArrivals::epoch");
static_assert(offsetof(MoeArrivals, n_pes) == 16, "MoeArrivals::n_pes");
static_assert(offsetof(MoeArrivals, experts_per_pe) == 20, "MoeArrivals::experts_per_pe");
#endif

// Thread: a 64-bit load with acquire semantics.
__device__ __forceinline__ uint64_t ld_acquire_u64(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Thread: whether the rows of PE `source` for local expert `expert` of
// the dispatch of `epoch` (or a later one) are placed; if so this thread
// sees them.
__device__ inline bool moe_arrived(const MoeArrivals &a, int expert, int source, uint64_t epoch) {
    return ld_acquire_u64(a.flags + static_cast<int64_t>(expert) * a.n_pes + source) >= epoch;
}

// Thread: waits until moe_arrived; then this thread sees the rows (other
// threads of the block after a __syncthreads: block_moe_wait_arrival).
// Traps, after printing the flag, past kWaitCycles.
__device__ inline void moe_wait_arrival(const MoeArrivals &a, int expert, int source, uint64_t epoch) {
    const long long start = clock64();
    while (!moe_arrived(a, expert, source, epoch)) {
        if (clock64() - start > kWaitCycles) {
            printf("shmem: a wait for MoE rows timed out (expert %d, source %d: flag %llu, want %llu)\n", expert,
                   source, static_cast<unsigned long long>(a.flags[static_cast<int64_t>(expert) * a.n_pes + source]),
                   static_cast<unsigned long long>(epoch));
            __trap();
        }
    }
}

// Block: moe_wait_arrival by one thread, then a __syncthreads: every
// thread of the block sees the rows.
__device__ inline void block_moe_wait_arrival(const MoeArrivals &a, int expert, int source, uint64_t epoch) {
    if (detail::thread_in_block() == 0) moe_wait_arrival(a, expert, source, epoch);
    __syncthreads();
}

}  // namespace shmem
