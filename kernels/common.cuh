// Shared device code of shmem's own collective kernels: element types and
// their accumulators, reduction operators, the per-team synchronisation
// state that makes the kernels graph-safe (epochs live in device memory
// and advance on the device, never reset by the host), and the two ways
// of reaching a peer: its NVLink address (plain loads and stores), or
// NVSHMEM's RMA (put-with-signal, get) where it has none or RMA is forced.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <cstdint>
#include "phases.cuh"
#include "shmem_device.cuh"

namespace shmem {
namespace k {

// Most blocks a collective kernel uses: one channel of every signal array each.
constexpr int kMaxBlocks = 128;
// Most threads a block of the line kernels (`Lines` below) takes
// (`LINES_MAX_THREADS` in algo.rs): 20 warps, so that 128 blocks take a
// peer's 1 MiB (9363 lines) in one pass; at most 96 registers a thread.
constexpr int kLinesMaxThreads = 640;

// Most blocks when some peer is reached through RMA, and the staging each
// such block has per peer for gets.
constexpr int kRmaBlocks = 32;
constexpr uint64_t kRmaChunk = 8192;
// Largest team the kernels take (checked on the host).
constexpr int kMaxTeam = 64;
// The push kernels (`Push` below): the most bytes one PE sends another, and
// the largest world they have staging for (`PUSH_*` in kernels.rs).
constexpr uint64_t kPushMaxBytes = 1 << 20;
constexpr int kPushMaxTeam = 8;

// Signal arrays of a team's synchronisation state, each kMaxBlocks × n
// 64-bit words: word [channel][sender] of a PE is set by `sender`.
enum Array { Arrive = 0, Data = 1, Depart = 2 };

// A team's view of the symmetric heap and its synchronisation state:
// at `sync_offset` of every member's heap, the three signal arrays, then
// kMaxBlocks epoch counters (one per block channel, this PE's own), then
// kMaxBlocks epoch counters that the low-latency and push kernels share
// (world team only; see `LL`).
struct TeamSync {
    const uint64_t *peer_heap;  // n heap bases; 0 where the peer is reached through RMA
    const int *pes;             // n world PE numbers (for NVSHMEM)
    uint64_t heap;              // this PE's heap base (also the symmetric address)
    uint64_t sync_offset;       // heap offset of the team's synchronisation state
    uint64_t ll_offset;         // heap offset of the low-latency packets (world)
    uint64_t temp_offset;       // heap offset of this PE's RMA staging
    int rank;
    int n;
    int rma;                    // some peer is reached through RMA

    __device__ uint64_t *word(int array, int channel, int sender) const {
        return reinterpret_cast<uint64_t *>(heap + sync_offset) + (array * kMaxBlocks + channel) * n + sender;
    }
    __device__ uint64_t *epoch_counter(int channel) const {
        return reinterpret_cast<uint64_t *>(heap + sync_offset) + 3 * kMaxBlocks * n + channel;
    }
    __device__ uint64_t *ll_counter(int block) const { return epoch_counter(kMaxBlocks + block); }
    __device__ bool nvlink(int pe) const { return peer_heap[pe] != 0; }
    // The member `i` places after this PE, (rank + i) % n for 0 <= i < n,
    // without a division (a runtime `%` costs some 30 instructions, on the
    // way to every kernel's first send).
    __device__ int after(int i) const { return rank + i < n ? rank + i : rank + i - n; }
    // A peer's copy of heap offset `off` (NVLink path only).
    template <typename T> __device__ T *at(int pe, uint64_t off) const {
        return reinterpret_cast<T *>(peer_heap[pe] + off);
    }
    // This PE's copy of heap offset `off` (also the symmetric address for NVSHMEM).
    template <typename T> __device__ T *mine(uint64_t off) const { return reinterpret_cast<T *>(heap + off); }
};

__device__ __forceinline__ uint64_t ld_acquire64(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release64(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Programmatic dependent launch: the collectives are launched with it
// (`Kernels::launch_shared`), so that a kernel's launch overlaps the end
// of the kernel before it on the stream. The first step of each: wait
// until that kernel has finished and its writes are visible (at once
// when launched without it), then let the next kernel's launch begin.
__device__ __forceinline__ void follow_stream() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Waits until `*p >= target` (signals only grow), trapping after kWaitCycles.
__device__ __forceinline__ void wait_geq(const uint64_t *p, uint64_t target) {
    if (ld_acquire64(p) >= target) return;
    long long start = clock64();
    while (ld_acquire64(p) < target) {
        if (clock64() - start > kWaitCycles) {
            printf("shmem: a collective waited too long for a peer (signal %llu, want %llu)\n",
                   static_cast<unsigned long long>(ld_acquire64(p)), static_cast<unsigned long long>(target));
            __trap();
        }
    }
}

// The epoch of this kernel on block channel `blockIdx.x`: every kernel
// advances its blocks' counters by one (kept in shared memory for the
// block, written back by `end_epoch`).
__device__ __forceinline__ uint64_t begin_epoch(const TeamSync &t) {
    __shared__ uint64_t epoch;
    if (threadIdx.x == 0) epoch = *t.epoch_counter(blockIdx.x) + 1;
    __syncthreads();
    return epoch;
}

__device__ __forceinline__ void end_epoch(const TeamSync &t, uint64_t epoch) {
    if (threadIdx.x == 0) *t.epoch_counter(blockIdx.x) = epoch;
}

// The RMA calls, out of line: one copy for every kernel that uses them.
static __device__ __noinline__ void rma_get(void *dst, const void *src, uint64_t bytes, int pe) {
    nvshmemx_getmem_block(dst, src, bytes, pe);
}
static __device__ __noinline__ void rma_put(void *dst, const void *src, uint64_t bytes, int pe) {
    nvshmemx_putmem_nbi_block(dst, src, bytes, pe);
}
static __device__ __noinline__ void rma_signal(uint64_t *word, uint64_t v, int pe) {
    nvshmem_quiet();
    nvshmemx_signal_op(word, v, NVSHMEM_SIGNAL_SET, pe);
}

// Sets word [array][blockIdx.x][rank] of member `pe` to `v`, after every
// store and put this block made before (call from one thread, after a
// __syncthreads).
//
// On the NVLink path the release store alone orders them: the block's
// earlier stores come before it through the barrier (a release is
// cumulative), and it compiles to MEMBAR.ALL.SYS before the store, which
// waits for them. A __threadfence_system() before it (fence.sc.sys) would
// add a MEMBAR.SC.SYS, which also orders this thread's later loads, for
// nothing.
__device__ __forceinline__ void signal(const TeamSync &t, int array, int pe, uint64_t v) {
    uint64_t *w = t.word(array, blockIdx.x, t.rank);
    if (t.nvlink(pe)) {
        uint64_t off = reinterpret_cast<uint64_t>(w) - t.heap;
        st_release64(reinterpret_cast<uint64_t *>(t.peer_heap[pe] + off), v);
    } else {
        rma_signal(w, v, t.pes[pe]);
    }
}

// Every member signals every member on `array`, then waits for all of
// them: a barrier of this block channel.
__device__ __forceinline__ void exchange(const TeamSync &t, int array, uint64_t epoch) {
    __syncthreads();
    for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x) {
        signal(t, array, pe, epoch);
        wait_geq(t.word(array, blockIdx.x, pe), epoch);
    }
    __syncthreads();
}

// Waits (whole block) until every member other than `skip` has signalled
// `array` with `epoch` on this channel.
__device__ __forceinline__ void wait_all(const TeamSync &t, int array, uint64_t epoch, int skip) {
    for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x)
        if (pe != skip) wait_geq(t.word(array, blockIdx.x, pe), epoch);
    __syncthreads();
}

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
// kMaxTeam, maybe 0; pointers in shared memory), by the whole block, in one pass:
// a thread loads its next four 16-byte vectors of a pair and stores them,
// then goes on to the next pair at the same place. A PE's own copy (a
// pair whose destination is its own memory) so rides along its stores
// through NVLink instead of after them, when the link sits idle (the
// all-gather of 256 MiB a rank took 864 µs on 2×H100 with the copy after
// the sends, where a put of the same bytes takes 679). With `one_src`
// every pair's source is srcs[0], loaded once for all of them. Pairs
// with a pointer not 16-byte aligned are copied one after another.
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
        rma_put(t.mine<uint8_t>(dst_off), src, bytes, t.pes[pe]);
    }
}

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
        // member a thread left the link short of requests (on 2×H100 the
        // pulling two-shot all-reduce of 256 MiB took 809 µs so, 796 now;
        // a put of the same bytes takes 679).
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
                rma_get(const_cast<T *>(srcs[pe]), t.mine<T>(src_off) + c, len * sizeof(T), t.pes[pe]);
        __syncthreads();
        block_reduce<T, OP, NP>(dsts, nd, srcs, t.n, len);
    }
}


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
//
// The packets' room per sender: 128 KiB in any world, 1 MiB in worlds of
// up to kPushMaxTeam (`LL_*` in kernels.rs).
constexpr uint64_t kLLMaxBytes = 128 << 10;
constexpr uint64_t kLLMaxBytesSmallTeam = 1 << 20;
__device__ __forceinline__ uint64_t ll_max_bytes(int n) {
    return n <= kPushMaxTeam ? kLLMaxBytesSmallTeam : kLLMaxBytes;
}
// A sender's buffer (for one epoch parity): its packets' room, twice its
// data, and 64 KiB more that only lines use (512 lines), so that the MoE
// line kernel's 128 tokens of 7168 bf16 fit with their splits
// (`low_latency_buffer_bytes` in algo.rs, which must agree).
constexpr uint64_t kLinesSlackBytes = 64 << 10;
__device__ __forceinline__ uint64_t ll_buffer_bytes(int n) { return 2 * ll_max_bytes(n) + kLinesSlackBytes; }

// Writes `epoch` into every shared LL/push counter this block owns, a
// thread each (a one-block kernel owns all 128).
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
// Rolled, the kernels' code is a third to a half as long (the line
// all-reduce's 2448 instructions against 6872), and on 2×H200 (session
// 21, run 8) the packets' collectives took 0.03–0.18 µs less and the MoE
// line kernel's dispatch of 1 and 32 tokens 0.22 less, but the line
// collectives 0.17–0.36 more: the packets (`load8`, `store8`) and the MoE
// line kernel (`MoeLines`) roll them, the line collectives do not.
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
// its data; traps after kWaitCycles, naming `what` and the sender.
__device__ __forceinline__ uint64_t packet_load(const uint4 *p, uint32_t flag, const char *what, int pe) {
    uint4 v = ld_volatile_v4(p);
    if (v.y != flag || v.w != flag) {
        long long start = clock64();
        do {
            if (clock64() - start > kWaitCycles) {
                printf("shmem: waited too long for %s from PE %d\n", what, pe);
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
    // Else `send` loaded `peer_heap[pe]` after its data was in, another
    // load's latency on the way to the link: the packets' all-reduce of 8
    // B sent 0.48–0.51 µs after its epoch against 0.66, and the MoE forms
    // took 0.06–0.35 µs less (2×H200, session 20, run 3). (Passing it as
    // a kernel parameter and prefetching the peer's buffers from every
    // warp as the kernel starts made every operation 10–100 µs slower:
    // run 5.)
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

__device__ __forceinline__ void st_volatile_v2u64(uint64_t *p, uint64_t a, uint64_t b) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

__device__ __forceinline__ void ld_volatile_v2u64(const uint64_t *p, uint64_t &a, uint64_t &b) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}

// The line protocol (LL128; world team, every peer over NVLink, the
// low-latency packets' room and epochs): data travels in 128-byte lines,
// each stored by 8 lanes of a warp with one 16-byte store each, so that
// the line is one 128-byte write on the link, and loaded the same way;
// the receiver retries the warp's load until every flag of its lines is
// this operation's. Each 64-byte half of a line carries its own flag, in
// the upper half of the second word of its last lane (lanes 3 and 7): a
// 4-byte flag, so that a line holds 120 data bytes (against 8 of 16 in the
// 8-byte packets), or that whole word (112 data bytes, `LinesOf<8>`):
// for reductions of 8-byte elements, which a 4-byte word would split
// across two lanes, and for the MoE line kernel (`MoeLines` in moe.cu).
// Lines of 120 took the all-reduce of 1 MiB (bf16, 2×H200, session 21,
// run 2) from 6.42 µs to 6.29, of 768 KiB from 5.45 to 5.33. NCCL's LL128
// trusts one flag a line, counting on an aligned 128-byte store of a warp
// to arrive whole; on 2×H100 and 2×H200 (docs/perf.md, sessions 18 and
// 19) a receiver saw a line's flag while its first 64 bytes still held
// the buffer's older contents, where an earlier operation's packets had
// ended inside that line (spmd's coll::all_to_all::lines_after_packets),
// as NVIDIA/nccl#2053 reports of 64-byte halves on GH200. A half's flag
// is its half's arrival.
//
// The lines of a sender go where its packets would (`LL::slot`), so the
// two protocols share the buffers, the epochs and the argument about
// reuse (every operation sends every peer at least one line). The flag is
// the packet's flag in the word's upper half (and, 8-byte, in its lower):
// whatever lay there before, a packet's or a line's of either layout,
// carries an older flag in that upper half, a zeroed buffer 0.
//
// Where a lane's words lie in a line's data (bytes), 4-byte flags: lanes
// 0–2 and 4–6 16 bytes each from 0 and from 48; lane 3 8 at 96 and 4 at
// 112, lane 7 8 at 104 and 4 at 116 (each 8-byte word 8-aligned in the
// line). 8-byte flags: 16 from 0, 16, 32 (lanes 0–2), 56, 72, 88 (4–6)
// and 8 at 48 and 104 (3 and 7).
// `kRolled`: the MoE line kernel's form (`MoeLines` in moe.cu): the byte
// loops of its loads and stores rolled (`load_at`), and every line taken
// through them, whole ones too (no `whole` path). Each measured faster
// for that kernel and slower for the collectives (session 21, run 8;
// session 22, run 3).
template <int kFlagBytes, bool kRolled = false>
struct LinesOf {
    static_assert(kFlagBytes == 4 || kFlagBytes == 8, "a line's flag is 4 or 8 bytes");
    LL packets;  // the team, the epoch, the flag and the slots the lines share
    // The packets' flag in the upper half (and, 8-byte flags, the lower).
    uint64_t flag;
    // Flags a line (one a 64-byte half), lanes a flag, data bytes a line.
    static constexpr int kFlags = 2;
    static constexpr int kLanesPerFlag = 8 / kFlags;
    static constexpr uint64_t kDataBytes = 128 - kFlags * kFlagBytes;
    // Passes a warp takes at once in `send_all` by default (the
    // all-reduce takes one: `reduce_lines` in reduce.cuh).
    static constexpr int kLinesUnroll = 2;

    __device__ LinesOf(const TeamSync &team) : LinesOf(team, block_ll_epoch(team)) {}
    // With this kernel's epoch `e`, read already.
    __device__ LinesOf(const TeamSync &team, uint64_t e) : packets(team, 0) { set_epoch(e); }
    // Without the epoch yet: `send_all` given the counter that
    // `lane_ll_counter` loaded sets it once its first loads are in flight
    // beside the counter's, so that the kernel's start waits for one load
    // instead of two in a row (and for no block barrier).
    struct Later {};
    __device__ LinesOf(const TeamSync &team, Later) : packets(team, 0), flag(0) {}
    // This kernel's epoch from what `lane_ll_counter` loaded (whole warp).
    __device__ void start(uint64_t counter) { set_epoch(warp_ll_epoch(counter)); }
    // The epoch `e`: the packets' and the lines' flags.
    __device__ void set_epoch(uint64_t e) {
        packets.set_epoch(e);
        flag = static_cast<uint64_t>(packets.flag) << 32 | (kFlagBytes == 8 ? packets.flag : 0);
    }
    // Whether a flag lane's second word `b` carries this operation's flag.
    __device__ bool flagged(uint64_t b) const { return kFlagBytes == 8 ? b == flag : b >> 32 == flag >> 32; }
    // A flag lane's second word: its data `b` (4-byte flags) and the flag.
    __device__ uint64_t with_flag(uint64_t b) const { return kFlagBytes == 8 ? flag : (b & 0xffffffffull) | flag; }
    // Lines a sender has in a receiver's buffer.
    __device__ uint64_t room() const { return ll_buffer_bytes(packets.t.n) / 128; }
    // Lines for `bytes` (at least one, so that every peer hears from every peer).
    __device__ uint64_t lines(uint64_t bytes) const { return bytes == 0 ? 1 : (bytes + kDataBytes - 1) / kDataBytes; }
    // A pass covers 4 lines a warp; `base()` is this warp's first, the
    // lane's line is base + lane / 8 (the loop bound stays warp-uniform).
    // The grid's warps are numbered across the blocks first (warp w of
    // block b is the grid's w * blocks + b), so that a pass's lines, where
    // they are fewer than the grid's warps take, and the lines past a
    // whole pass spread over every block's SM instead of filling the
    // first blocks' warps.
    __device__ uint64_t base() const { return (static_cast<uint64_t>(threadIdx.x / 32) * gridDim.x + blockIdx.x) * 4; }
    __device__ uint64_t stride() const { return static_cast<uint64_t>(gridDim.x) * blockDim.x / 8; }
    __device__ int lane8() const { return threadIdx.x % 8; }
    // Whether this lane's second word holds its half's flag (else data).
    __device__ bool flag_lane() const { return lane8() % kLanesPerFlag == kLanesPerFlag - 1; }
    __device__ uint64_t line_of(uint64_t base) const { return base + (threadIdx.x % 32) / 8; }
    // Byte of this lane's first word (8 bytes) in a line's data.
    __device__ uint32_t lane_a() const {
        const uint32_t l = lane8();
        if (kFlagBytes == 8) return 8 * (2 * l - l / kLanesPerFlag);
        return flag_lane() ? 96 + 8 * (l / kLanesPerFlag) : 16 * (l - l / kLanesPerFlag);
    }
    // Byte of its second: 8 bytes after the first, or for a flag lane
    // (4-byte flags; none with 8-byte) the 4 of its lower half.
    __device__ uint32_t lane_b() const {
        return flag_lane() ? 112 + 4 * (static_cast<uint32_t>(lane8()) / kLanesPerFlag) : lane_a() + 8;
    }
    // The same in `line` of the data.
    __device__ uint64_t offset_a(uint64_t line) const { return line * kDataBytes + lane_a(); }
    __device__ uint64_t offset_b(uint64_t line) const { return line * kDataBytes + lane_b(); }
    // Whether `line` of the `len` bytes at `p` is whole and `p` 8-aligned:
    // then this lane's words are plain loads and stores, without the
    // checks of `load_at` and `store_at` for each. Together with one line
    // a pass in the all-reduce, the flag's remainder and the peers'
    // numbers without divisions (`LL::set_epoch`, `TeamSync::after`), the
    // collectives by lines took 0.07–0.55 µs less on 2×H100 (session 22,
    // run 2; the all-reduce of 1 MiB 6.43 → 5.88) and those by packets up
    // to 0.22. Not for the MoE line kernel (`kRolled`): with them its
    // dispatch of 128 tokens took 9.60 µs against 9.40 (run 3), without
    // 9.48 and its combines 0.03–0.1 less.
    static __device__ bool whole(const uint8_t *p, uint64_t len, uint64_t line) {
        return (line + 1) * kDataBytes <= len && reinterpret_cast<uint64_t>(p) % 8 == 0;
    }
    // This lane's 16 bytes of `line` in `sender`'s slots of the heap at `heap`.
    __device__ uint64_t *at(uint8_t *heap, int sender, uint64_t line) const {
        return reinterpret_cast<uint64_t *>(heap + packets.slot(sender, 0) + line * 128 + lane8() * 16);
    }
    // This lane's words of `line` of the `len` bytes at `p` (zero past the
    // end; nothing loaded when not `live`).
    __device__ void load(const uint8_t *p, uint64_t len, uint64_t line, bool live, uint64_t &a, uint64_t &b) const {
        if (!kRolled && live && whole(p, len, line)) {
            const uint8_t *q = p + line * kDataBytes;
            a = *reinterpret_cast<const uint64_t *>(q + lane_a());
            if (!flag_lane())
                b = *reinterpret_cast<const uint64_t *>(q + lane_b());
            else
                b = kFlagBytes == 4 ? *reinterpret_cast<const uint32_t *>(q + lane_b()) : 0;
            return;
        }
        a = live ? load_at<8, kRolled>(p, offset_a(line), len) : 0;
        b = !live                 ? 0
            : !flag_lane()        ? load_at<8, kRolled>(p, offset_b(line), len)
            : kFlagBytes == 4     ? load_at<4, kRolled>(p, offset_b(line), len)
                                  : 0;
    }
    // Stores this lane's words of `line` into the `len` bytes at `p`.
    __device__ void store(uint8_t *p, uint64_t len, uint64_t line, bool live, uint64_t a, uint64_t b) const {
        if (!live) return;
        if (!kRolled && whole(p, len, line)) {
            uint8_t *q = p + line * kDataBytes;
            *reinterpret_cast<uint64_t *>(q + lane_a()) = a;
            if (!flag_lane())
                *reinterpret_cast<uint64_t *>(q + lane_b()) = b;
            else if (kFlagBytes == 4)
                *reinterpret_cast<uint32_t *>(q + lane_b()) = static_cast<uint32_t>(b);
            return;
        }
        store_at<8, kRolled>(p, offset_a(line), len, a);
        if (!flag_lane())
            store_at<8, kRolled>(p, offset_b(line), len, b);
        else if (kFlagBytes == 4)
            store_at<4, kRolled>(p, offset_b(line), len, b);
    }
    // This lane's 16 bytes of `line` into member `pe`'s buffer for this PE:
    // data words `a` and `b`, the flag in `b` for a `flag_lane`.
    // Whole warp: it converges first, so that a line leaves in one store
    // instruction of its 8 lanes, never in parts.
    __device__ void send(int pe, uint64_t line, bool live, uint64_t a, uint64_t b) const {
        const TeamSync &t = packets.t;
        __syncwarp();
        if (live)
            st_volatile_v2u64(at(reinterpret_cast<uint8_t *>(packets.heap_of(pe)), t.rank, line), a,
                              flag_lane() ? with_flag(b) : b);
    }
    // This lane's data words of `line` from member `pe` (whole warp; `live`
    // false for lanes past the last line, which load nothing). The warp
    // converges first, so that each line is read by one load instruction.
    __device__ void recv(int pe, uint64_t line, bool live, uint64_t &a, uint64_t &b) const {
        recv_lines<1>(pe, &line, &live, &a, &b);
    }
    // Reloads this lane's words of the line at `p` (from member `pe`)
    // until the warp's lines all carry the flag (whole warp; each reload
    // one load instruction of the converged warp).
    __device__ void wait_line(int pe, const uint64_t *p, bool live, uint64_t &a, uint64_t &b) const {
        long long start = 0;
        while (__any_sync(0xffffffffu, live && flag_lane() && !flagged(b))) {
            if (start == 0) start = clock64();
            if (clock64() - start > kWaitCycles) {
                if (live && flag_lane() && !flagged(b))
                    printf("shmem: waited too long for a line of a low-latency collective from PE %d\n", pe);
                __trap();
            }
            if (live) ld_volatile_v2u64(p, a, b);
        }
    }
    // `recv` of kU lines `line[u]` from member `pe`, their first loads in
    // flight together (whole warp): each load after the warp converges,
    // as in `recv`.
    template <int kU>
    __device__ void recv_lines(int pe, const uint64_t *line, const bool *live, uint64_t *a, uint64_t *b) const {
        const uint64_t *p[kU];
#pragma unroll
        for (int u = 0; u < kU; u++) {
            p[u] = at(reinterpret_cast<uint8_t *>(packets.t.heap), pe, line[u]);
            a[u] = b[u] = 0;
        }
#pragma unroll
        for (int u = 0; u < kU; u++) {
            __syncwarp();
            if (live[u]) ld_volatile_v2u64(p[u], a[u], b[u]);
        }
#pragma unroll
        for (int u = 0; u < kU; u++) wait_line(pe, p[u], live[u], a[u], b[u]);
    }
    // Every line of `in` (`bytes`) to every peer, and into `keep` as well
    // unless it is null (the all-gather's own block, out of place). A warp
    // takes its lines of kUnroll passes at once (by default kLinesUnroll),
    // loading them all before it sends any: past one pass (4 lines a warp of the
    // grid: by default, up to 10240 lines, 1200 KiB, on 128 blocks of 640)
    // the second pass's loads no longer wait for the first pass's sends.
    // With kStart (a `Later` object), every warp first `start`s from
    // `counter`, after its first loads.
    template <bool kStart = false, int kUnroll = kLinesUnroll>
    __device__ void send_all(const uint8_t *in, uint64_t bytes, uint8_t *keep, uint64_t counter = 0) {
        const TeamSync &t = packets.t;
        const uint64_t n_lines = lines(bytes);
        const uint64_t s = stride();
        // The first pass runs in every warp (one past the lines loads
        // nothing and sends nothing), so that every warp starts.
        for (uint64_t b0 = base(), first = 1; first || b0 < n_lines; b0 += kUnroll * s, first = 0) {
            uint64_t line[kUnroll], a[kUnroll], b[kUnroll];
            bool live[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                line[u] = line_of(b0 + u * s);
                live[u] = line[u] < n_lines;
                load(in, bytes, line[u], live[u], a[u], b[u]);
            }
            if (kStart && first) start(counter);
            if (first) {
                phase_mark("load");
                phase_wait(a[0] ^ b[0] ^ a[kUnroll - 1] ^ b[kUnroll - 1]);
                phase_mark("data");
            }
            if (b0 >= n_lines) break;
#pragma unroll 1
            for (int i = 1; i < t.n; i++) {
#pragma unroll
                for (int u = 0; u < kUnroll; u++) send(t.after(i), line[u], live[u], a[u], b[u]);
            }
            if (keep != nullptr) {
#pragma unroll
                for (int u = 0; u < kUnroll; u++) store(keep, bytes, line[u], live[u], a[u], b[u]);
            }
        }
    }
    // Block `pe` of `in` (`bytes` each) to every peer `pe`, every line of
    // it (the first half of the all-to-all and the reduce-scatter).
    __device__ void send_blocks(const uint8_t *in, uint64_t bytes) const {
        const TeamSync &t = packets.t;
        const uint64_t n_lines = lines(bytes);
        for (uint64_t b0 = base(); b0 < n_lines; b0 += stride()) {
            uint64_t line = line_of(b0);
            bool live = line < n_lines;
            for (int i = 1; i < t.n; i++) {
                int pe = t.after(i);
                uint64_t a, b;
                load(in + pe * bytes, bytes, line, live, a, b);
                send(pe, line, live, a, b);
            }
        }
    }
    __device__ void end() const { packets.end(); }
};

// The lines of the collectives but the reductions of 8-byte elements.
using Lines = LinesOf<4>;

// The push protocol (world team, every peer over NVLink, at most
// kPushMaxTeam PEs, at most kPushMaxBytes from one PE to another per
// operation): block b stores its share of what goes to each peer into
// that peer's staging for this PE, with plain 16-byte stores, and raises
// one flag there; once every peer's flag for block b is up, it reads the
// same share of every peer's staging. One link latency and no barrier, as
// the low-latency protocol, with one flag a block instead of one a word.
//
// The staging (after the low-latency packets, at every PE alike): flags
// [sender][block] (the epoch), then two buffers by epoch parity of
// kPushMaxBytes per sender. A PE writes a buffer again two epochs later,
// after it has seen every peer's flag of the epoch between, which each
// peer raised only once its kernel of the epoch before (which read that
// buffer) was over: the LL argument, with which it shares the epochs and
// their counters (every kernel of either kind hears from every peer:
// every block flags every peer, with or without data).
struct Push {
    const TeamSync &t;
    uint64_t epoch;
    uint64_t parity;

    __device__ Push(const TeamSync &team) : t(team) {
        __shared__ uint64_t shared_epoch;
        if (threadIdx.x == 0) shared_epoch = *t.ll_counter(blockIdx.x) + 1;
        __syncthreads();
        epoch = shared_epoch;
        parity = epoch & 1;
    }
    __device__ uint64_t flags() const { return t.ll_offset + 2 * t.n * ll_buffer_bytes(t.n); }
    // Heap offset (every PE alike) of the staging for what `sender` sends.
    __device__ uint64_t staging(int sender) const {
        uint64_t f = (static_cast<uint64_t>(t.n) * kMaxBlocks * 8 + 255) / 256 * 256;
        return flags() + f + (parity * t.n + sender) * kPushMaxBytes;
    }
    // `bytes` at `src` into member `pe`'s staging for this PE, at `off`.
    __device__ void send(int pe, uint64_t off, const uint8_t *src, uint64_t bytes) const {
        block_copy(t.at<uint8_t>(pe, staging(t.rank) + off), src, bytes);
    }
    // What member `pe` sent, in this PE's staging, at `off`.
    template <typename T> __device__ const T *received(int pe, uint64_t off) const {
        return reinterpret_cast<const T *>(t.mine<uint8_t>(staging(pe)) + off);
    }
    // Flags every peer (after this block's sends), then waits for every
    // peer's flag for this block.
    __device__ void flag_and_wait() const {
        __syncthreads();
        uint64_t *mine = t.mine<uint64_t>(flags());
        for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x) {
            if (pe == t.rank) continue;
            st_release64(t.at<uint64_t>(pe, flags()) + t.rank * kMaxBlocks + blockIdx.x, epoch);
        }
        for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x)
            if (pe != t.rank) wait_geq(mine + pe * kMaxBlocks + blockIdx.x, epoch);
        __syncthreads();
    }
    __device__ void end() const { ll_counters_end(t, epoch); }
};

}  // namespace k
}  // namespace shmem
