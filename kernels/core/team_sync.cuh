// The per-team synchronisation of shmem's own kernels, which makes them
// graph-safe: epochs live in device memory and advance on the device,
// never reset by the host. Each block channel of a team has its signal
// words in every member's heap (`TeamSync::word`), set by release stores
// through NVLink or by NVSHMEM's signal where a peer is reached through
// RMA; a wait is an acquire load that traps after kWaitCycles, or once
// the host has seen a PE of the job die (`wait_gives_up`). Also the
// RMA calls, which the signals and the simple protocol share.
#pragma once
#include <nvshmem.h>
#include <nvshmemx.h>
#include <cstdint>
#include <cstdio>
#include "abi.cuh"
#include "shmem_device.cuh"

// A word of host memory mapped into the device (set at load by
// `Kernels::load`, null until then) that the host sets once it sees a PE
// of the job die: the kernels' waits give up on it at once instead of at
// their time limit, so the PEs waiting for a dead one fail within its
// liveness check's time.
extern "C" __device__ const volatile uint32_t *shmem_peer_died;

namespace shmem {
namespace k {

// Signal arrays of a team's synchronisation state (`kSignalArrays` of
// them), each kMaxBlocks × n 64-bit words: word [channel][sender] of a PE
// is set by `sender`.
enum Array { Arrive = 0, Data = 1, Depart = 2 };
static_assert(Depart + 1 == kSignalArrays, "the signal arrays");

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

// How often a wait that has spun for a while looks at `shmem_peer_died`:
// about every half millisecond of the SM's clock (a read of host memory
// costs about a microsecond).
constexpr long long kPeerDiedPollCycles = 1'000'000;

// Whether a wait that began at `start` gives up: past kWaitCycles, or once
// the host has seen a PE of the job die (`shmem_peer_died`, looked at from
// the wait's first kPeerDiedPollCycles on, then as often; `next` is the
// wait's own clock of that). A wait that gives up prints why and traps.
__device__ __forceinline__ bool wait_gives_up(long long start, long long &next) {
    const long long now = clock64();
    if (now - start > kWaitCycles) return true;
    if (now < next) return false;
    next = now + kPeerDiedPollCycles;
    const volatile uint32_t *died = shmem_peer_died;
    return died != nullptr && *died != 0;
}

// Waits until `*p >= target` (signals only grow), trapping when
// `wait_gives_up`.
__device__ __forceinline__ void wait_geq(const uint64_t *p, uint64_t target) {
    if (ld_acquire64(p) >= target) return;
    const long long start = clock64();
    long long next = start + kPeerDiedPollCycles;
    while (ld_acquire64(p) < target) {
        if (wait_gives_up(start, next)) {
            printf("shmem: a collective stopped waiting for a peer: a PE died or the wait ran out of time (signal %llu, want %llu)\n",
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

// This PE's NetCounters when member `pe` is on another node, else null:
// the RMA calls below count their traffic with other nodes' PEs there
// (relaxed adds: the host reads the counters after the stream's kernels
// have ended, and they order nothing).
__device__ __forceinline__ NetCounters *remote_counters(const TeamSync &t, int pe) {
    return t.remote >> pe & 1 ? t.mine<NetCounters>(t.net_offset) : nullptr;
}

// Counts, in `c` (this PE's NetCounters, or null for a member of this
// node), one transfer of `bytes` (`got`: a get, else a put) and `signals`
// signals.
__device__ __forceinline__ void count_rma(NetCounters *c, bool got, uint64_t bytes, unsigned long long signals) {
    if (!c) return;
    atomicAdd(got ? &c->bytes_got : &c->bytes_put, static_cast<unsigned long long>(bytes));
    atomicAdd(got ? &c->gets : &c->puts, 1ull);
    if (signals) atomicAdd(&c->signals, signals);
}

// The RMA calls, out of line (one copy in each .cu for all its kernels)
// on plain values: `c` is the caller's NetCounters for a member on
// another node (else null), `pe` the member's world PE. A reference to
// the kernel's TeamSync parameter passed out of line would make every
// kernel of the .cu copy the parameter to its stack, every thread, at
// its start, whether it ever calls these or not. The block-wide ones
// count from thread 0, once a call.
static __device__ __noinline__ void rma_get_out(NetCounters *c, int pe, void *dst, const void *src, uint64_t bytes) {
    count_rma(threadIdx.x == 0 ? c : nullptr, true, bytes, 0);
    nvshmemx_getmem_block(dst, src, bytes, pe);
}
static __device__ __noinline__ void rma_put_out(NetCounters *c, int pe, void *dst, const void *src, uint64_t bytes) {
    count_rma(threadIdx.x == 0 ? c : nullptr, false, bytes, 0);
    nvshmemx_putmem_nbi_block(dst, src, bytes, pe);
}
static __device__ __noinline__ void rma_signal_out(NetCounters *c, int pe, uint64_t *word, uint64_t v) {
    if (c) atomicAdd(&c->signals, 1ull);
    nvshmem_quiet();
    nvshmemx_signal_op(word, v, NVSHMEM_SIGNAL_SET, pe);
}
static __device__ __noinline__ void rma_put_signal_out(NetCounters *c, int pe, void *dst, const void *src,
                                                       uint64_t bytes, uint64_t *word, uint64_t v) {
    count_rma(c, false, bytes, 1);
    nvshmem_putmem_signal_nbi(dst, src, bytes, word, v, NVSHMEM_SIGNAL_SET, pe);
}

// The RMA calls with member `pe` of `t` (whole block for the get and the
// put).
__device__ __forceinline__ void rma_get(const TeamSync &t, int pe, void *dst, const void *src, uint64_t bytes) {
    rma_get_out(remote_counters(t, pe), t.pes[pe], dst, src, bytes);
}
__device__ __forceinline__ void rma_put(const TeamSync &t, int pe, void *dst, const void *src, uint64_t bytes) {
    rma_put_out(remote_counters(t, pe), t.pes[pe], dst, src, bytes);
}
// One thread's signal: `v` into member `pe`'s symmetric `word`, after this
// PE's puts are delivered. Counted as a signal, not as bytes.
__device__ __forceinline__ void rma_signal(const TeamSync &t, int pe, uint64_t *word, uint64_t v) {
    rma_signal_out(remote_counters(t, pe), t.pes[pe], word, v);
}
// One thread's put of `bytes` at `src` to symmetric `dst` of member `pe`,
// then `v` into its symmetric `word` once the data is delivered.
__device__ __forceinline__ void rma_put_signal(const TeamSync &t, int pe, void *dst, const void *src, uint64_t bytes,
                                               uint64_t *word, uint64_t v) {
    rma_put_signal_out(remote_counters(t, pe), t.pes[pe], dst, src, bytes, word, v);
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
        rma_signal(t, pe, w, v);
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

}  // namespace k
}  // namespace shmem
