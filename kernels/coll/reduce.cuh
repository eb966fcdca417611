// Reduction kernels: all-reduce (low-latency, one-shot, two-shot) and
// reduce-scatter. Every reduction combines the members' values in team
// order (the host backend's order), so results equal its bit for bit.
// Instantiated per element type by reduce_<dtype>.cu (one file each, so
// they compile in parallel).
#pragma once
#include "core/common.cuh"
#include "core/phases.cuh"
#include "coll/reduce_nodes.cuh"

namespace shmem {
namespace k {

// Elements [lo, hi) of `count` that block `b` of `blocks` takes, in whole
// 16-byte vectors except at the end.
template <typename T> __device__ __forceinline__ Range block_elems(uint64_t count, uint64_t b, uint64_t blocks) {
    constexpr uint64_t kN = Vec<T>::kN;
    Range r = split((count + kN - 1) / kN, b, blocks);
    return {min(r.lo * kN, count), min(r.hi * kN, count)};
}

// One-shot: after a barrier every PE reduces the whole vector from every
// member's source into its own destination; a second barrier keeps the
// sources until every PE has read them. Out of place only.
template <typename T, int OP, int NP>
__device__ void allreduce_oneshot(const TeamSync &t, uint64_t dst_off, uint64_t src_off, uint64_t count) {
    uint64_t epoch = begin_epoch(t);
    exchange(t, Arrive, epoch);
    Range r = block_elems<T>(count, blockIdx.x, gridDim.x);
    reduce_range<T, OP, NP>(t, t.mine<T>(dst_off), dst_off, src_off, r.lo, r.hi, false);
    exchange(t, Depart, epoch);
    end_epoch(t, epoch);
}

// Two-shot: PE r reduces share r of the vector (reading every member's
// source) and writes it into every member's destination, then signals.
// In place is safe: share r of a source is read only by PE r, before PE r
// writes it.
template <typename T, int OP, int NP>
__device__ void allreduce_twoshot(const TeamSync &t, uint64_t dst_off, uint64_t src_off, uint64_t count) {
    uint64_t epoch = begin_epoch(t);
    exchange(t, Arrive, epoch);
    constexpr uint64_t kN = Vec<T>::kN;
    Range share = split((count + kN - 1) / kN, t.rank, t.n);
    Range in = split(share.hi - share.lo, blockIdx.x, gridDim.x);
    uint64_t lo = min((share.lo + in.lo) * kN, count), hi = min((share.lo + in.hi) * kN, count);
    T *dst = t.mine<T>(dst_off);
    reduce_range<T, OP, NP>(t, dst, dst_off, src_off, lo, hi, true);
    __syncthreads();
    for (int i = 1; i < t.n; i++) {
        int pe = t.after(i);
        if (!t.nvlink(pe))
            block_send(t, pe, dst_off + lo * sizeof(T), reinterpret_cast<const uint8_t *>(dst + lo),
                       (hi - lo) * sizeof(T));
    }
    __syncthreads();
    for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x)
        if (pe != t.rank) signal(t, Data, pe, epoch);
    wait_all(t, Data, epoch, t.rank);
    if (t.rma && threadIdx.x == 0) nvshmem_quiet();
    end_epoch(t, epoch);
}

// Two-shot by stores alone, for a team of two over NVLink, out of place:
// PE r's share of the vector is half r. Each PE first stores its source's
// half of the peer's share into the peer's destination there (which the
// result overwrites later, so no staging is needed); once the peer's block
// b has done the same for this PE's share, block b reduces its part of the
// share from this PE's source and its destination (the peer's values), in
// team order, into its destination and the peer's. Both halves cross the
// link as stores, which move large vectors faster than the pulling
// two-shot's loads.
template <typename T, int OP, int NP>
__device__ void allreduce_twoshot_stores(const TeamSync &t, uint64_t dst_off, uint64_t src_off, uint64_t count) {
    __shared__ const T *srcs[2];
    __shared__ T *dsts[2];
    uint64_t epoch = begin_epoch(t);
    exchange(t, Arrive, epoch);
    constexpr uint64_t kN = Vec<T>::kN;
    const int peer = 1 - t.rank;
    const uint64_t vectors = (count + kN - 1) / kN;
    // Block b's elements of share `s`.
    auto part = [&](int s) {
        Range share = split(vectors, s, 2);
        Range in = split(share.hi - share.lo, blockIdx.x, gridDim.x);
        return Range{min((share.lo + in.lo) * kN, count), min((share.lo + in.hi) * kN, count)};
    };
    const Range theirs = part(peer), mine = part(t.rank);
    block_copy(t.at<uint8_t>(peer, dst_off + theirs.lo * sizeof(T)), t.mine<uint8_t>(src_off + theirs.lo * sizeof(T)),
               (theirs.hi - theirs.lo) * sizeof(T));
    __syncthreads();
    if (threadIdx.x == 0) signal(t, Data, peer, epoch);
    wait_all(t, Data, epoch, t.rank);
    if (threadIdx.x == 0) {
        srcs[t.rank] = t.mine<T>(src_off) + mine.lo;
        srcs[peer] = t.mine<T>(dst_off) + mine.lo;
        dsts[0] = t.mine<T>(dst_off) + mine.lo;
        dsts[1] = t.at<T>(peer, dst_off) + mine.lo;
    }
    __syncthreads();
    block_reduce<T, OP, NP>(dsts, 2, srcs, 2, mine.hi - mine.lo);
    exchange(t, Depart, epoch);
    end_epoch(t, epoch);
}

// Reduce-scatter: PE r reduces block r of every member's source (`count`
// elements each) into its destination; a second barrier keeps the
// sources until every PE has read them. The destination may be block r of
// this PE's source.
template <typename T, int OP, int NP>
__device__ void reduce_scatter(const TeamSync &t, uint64_t dst_off, uint64_t src_off, uint64_t count) {
    uint64_t epoch = begin_epoch(t);
    exchange(t, Arrive, epoch);
    Range r = block_elems<T>(count, blockIdx.x, gridDim.x);
    reduce_range<T, OP, NP>(t, t.mine<T>(dst_off), dst_off, src_off + t.rank * count * sizeof(T), r.lo, r.hi, false);
    exchange(t, Depart, epoch);
    end_epoch(t, epoch);
}

// Push all-reduce (see `Push` in prims/push.cuh): block b stores its share of
// this PE's source into every peer's staging, then reduces the same share
// from its own source and the staged copies, in team order. In place is
// safe: a block reads and writes only its own share of this PE's buffers.
template <typename T, int OP, int NP>
__device__ void allreduce_push(const TeamSync &t, uint64_t dst_off, uint64_t src_off, uint64_t count) {
    __shared__ const T *srcs[kPushMaxTeam];
    __shared__ T *dsts[1];
    Push push(t);
    Range r = block_elems<T>(count, blockIdx.x, gridDim.x);
    const T *src = t.mine<T>(src_off);
    const uint64_t off = r.lo * sizeof(T), bytes = (r.hi - r.lo) * sizeof(T);
    for (int i = 1; i < t.n; i++)
        push.send(t.after(i), off, reinterpret_cast<const uint8_t *>(src + r.lo), bytes);
    push.flag_and_wait();
    if (threadIdx.x == 0) {
        dsts[0] = t.mine<T>(dst_off) + r.lo;
        for (int pe = 0; pe < t.n; pe++) srcs[pe] = pe == t.rank ? src + r.lo : push.received<T>(pe, off);
    }
    __syncthreads();
    block_reduce<T, OP, NP>(dsts, 1, srcs, t.n, r.hi - r.lo);
    push.end();
}

// Push reduce-scatter: block b stores its share of block p of this PE's
// source into member p's staging, then reduces its share of block `rank`
// from every member, in team order. The destination may be block `rank`
// of the source (a block reads its share before writing it).
template <typename T, int OP, int NP>
__device__ void reduce_scatter_push(const TeamSync &t, uint64_t dst_off, uint64_t src_off, uint64_t count) {
    __shared__ const T *srcs[kPushMaxTeam];
    __shared__ T *dsts[1];
    Push push(t);
    Range r = block_elems<T>(count, blockIdx.x, gridDim.x);
    const T *src = t.mine<T>(src_off);
    const uint64_t off = r.lo * sizeof(T), bytes = (r.hi - r.lo) * sizeof(T);
    for (int i = 1; i < t.n; i++) {
        int pe = t.after(i);
        push.send(pe, off, reinterpret_cast<const uint8_t *>(src + pe * count + r.lo), bytes);
    }
    push.flag_and_wait();
    if (threadIdx.x == 0) {
        dsts[0] = t.mine<T>(dst_off) + r.lo;
        for (int pe = 0; pe < t.n; pe++)
            srcs[pe] = pe == t.rank ? src + t.rank * count + r.lo : push.received<T>(pe, off);
    }
    __syncthreads();
    block_reduce<T, OP, NP>(dsts, 1, srcs, t.n, r.hi - r.lo);
    push.end();
}

// Low-latency all-reduce (see `LL` in prims/ll.cuh): each thread takes 8
// bytes of the source, sends them to every peer, then reduces what every
// peer sent for the same 8 bytes in team order.
template <typename T, int OP>
__device__ void allreduce_ll(const TeamSync &t, uint64_t dst_off, uint64_t src_off, uint64_t count) {
    using A = typename Acc<T>::type;
    constexpr int kPer = 8 / sizeof(T);
    phase_begin("ll_allreduce");
    LL ll(t);
    phase_mark("epoch");
    uint64_t bytes = count * sizeof(T);
    const uint8_t *src = t.mine<uint8_t>(src_off);
    uint8_t *dst = t.mine<uint8_t>(dst_off);
    for (uint64_t c = ll.first(); c < ll.chunks(bytes); c += ll.stride()) {
        uint64_t v = load8(src, c, bytes);
        for (int i = 1; i < t.n; i++) ll.send(t.after(i), c, v);
    }
    phase_mark("send");
    for (uint64_t c = ll.first(); c < ll.chunks(bytes); c += ll.stride()) {
        union {
            uint64_t u;
            T x[kPer];
        } mine, got;
        // In place, only this thread wrote chunk c of dst (= src), and it
        // does so below: the source is still unchanged here.
        mine.u = load8(src, c, bytes);
        A acc[kPer];
        for (int pe = 0; pe < t.n; pe++) {
            got.u = pe == t.rank ? mine.u : ll.recv(pe, c);
#pragma unroll
            for (int e = 0; e < kPer; e++) acc[e] = pe == 0 ? to_acc(got.x[e]) : combine<OP>(acc[e], to_acc(got.x[e]));
        }
#pragma unroll
        for (int e = 0; e < kPer; e++) mine.x[e] = from_acc<T>(acc[e]);
        store8(dst, c, bytes, mine.u);
    }
    phase_mark("recv_reduce");
    ll.end();
    phase_mark("end");
    phase_end();
}

// The eager all-reduce of a few bytes (at most kAgreeDataBytes) over
// NVLink, one block: the source travels in the agreement's packets (see
// core/agree.cuh), behind this PE's row, so that the call is agreed and its
// data moved in one round trip instead of two. Every thread sends its
// share of the row's and the data's packets to every peer, then the
// rows are compared (`rows_agree`, as `agree` does); on a difference the kernel
// returns having written nothing (it touches no low-latency buffer or
// epoch counter either way). Else thread c reduces chunk c of every
// member's data in team order into the destination. The choice of this
// kernel reads the size, the settings and the topology only, the same
// on every member; a PE that runs another kernel for a mismatched call
// still sends its row, so the verdict is reached either way.
//
// In place is safe: every packet of the source is sent before the
// barrier of the comparison, and chunk c of the destination is written
// after it, by the one thread that reads chunk c of the source then.
template <typename T, int OP>
__device__ void allreduce_agreed(const TeamSync &t, uint64_t dst_off, uint64_t src_off, uint64_t count) {
    using A = typename Acc<T>::type;
    constexpr int kPer = 8 / sizeof(T);
    const uint64_t e = t.agree;
    const uint32_t flag = agree_flag(e);
    const uint64_t bytes = count * sizeof(T);
    const int chunks = static_cast<int>((bytes + 7) / 8);
    const int per_peer = kAgreeWords + chunks;
    const uint8_t *src = t.mine<uint8_t>(src_off);
    for (int i = threadIdx.x; i < (t.n - 1) * per_peer; i += blockDim.x) {
        const int pe = t.after(1 + i / per_peer), w = i % per_peer;
        const uint64_t v = w < kAgreeWords ? own_word(t, w) : load8(src, w - kAgreeWords, bytes);
        packet_store(t.at<uint4>(pe, t.agree_packet(e & 1, t.rank, w)), v, flag);
    }
    if (!rows_agree(t, e)) {
        agree_report(t, e);
        return;
    }
    uint8_t *dst = t.mine<uint8_t>(dst_off);
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        union {
            uint64_t u;
            T x[kPer];
        } got;
        A acc[kPer];
        for (int pe = 0; pe < t.n; pe++) {
            got.u = pe == t.rank ? load8(src, c, bytes)
                                 : packet_load(t.mine<uint4>(t.agree_packet(e & 1, pe, kAgreeWords + c)), flag,
                                               "a peer's data of an agreed all-reduce", pe);
#pragma unroll
            for (int k = 0; k < kPer; k++) acc[k] = pe == 0 ? to_acc(got.x[k]) : combine<OP>(acc[k], to_acc(got.x[k]));
        }
#pragma unroll
        for (int k = 0; k < kPer; k++) got.x[k] = from_acc<T>(acc[k]);
        store8(dst, c, bytes, got.u);
    }
}

// The lines of a reduction of `T`: 4-byte flags, unless a 4-byte word
// would split an element (see `LinesOf` in prims/lines.cuh).
template <typename T> using LinesFor = LinesOf<sizeof(T) == 8 ? 8 : 4>;

// The second half of the all-reduce and reduce-scatter by lines: what
// every peer sent this PE, reduced in team order with this PE's own part
// `own` (`bytes`), into `dst`: each member's words of a line in team
// order, this PE's own from `own`, the peers' as they arrive. `dst` may
// be `own`: only this lane reads and writes its words of a line, and it
// reads them first. One line a pass: by default every warp's lines take
// one pass (blocks of as many warps as one pass needs, up to 20), and the
// code for two lines at once (for tuned grids of fewer threads) made the
// all-reduce's kernel spill and its start slower.
template <typename T, int OP>
__device__ void reduce_lines(const LinesFor<T> &ll, uint8_t *dst, const uint8_t *own, uint64_t bytes) {
    using A = typename Acc<T>::type;
    constexpr int kPer = 16 / sizeof(T);
    union Words {
        uint64_t u[2];
        T x[kPer];
    };
    const TeamSync &t = ll.packets.t;
    const uint64_t lines = ll.lines(bytes);
    const uint64_t s = ll.stride();
    for (uint64_t base = ll.base(); base < lines; base += s) {
        const uint64_t line = ll.line_of(base);
        const bool live = line < lines;
        A acc[kPer];
        for (int pe = 0; pe < t.n; pe++) {
            uint64_t a, b;
            if (pe == t.rank)
                ll.load(own, bytes, line, live, a, b);
            else
                ll.recv(pe, line, live, a, b);
            Words got;
            got.u[0] = a, got.u[1] = b;
#pragma unroll
            for (int e = 0; e < kPer; e++) acc[e] = pe == 0 ? to_acc(got.x[e]) : combine<OP>(acc[e], to_acc(got.x[e]));
        }
        Words out;
#pragma unroll
        for (int e = 0; e < kPer; e++) out.x[e] = from_acc<T>(acc[e]);
        ll.store(dst, bytes, line, live, out.u[0], out.u[1]);
    }
}

// All-reduce by lines (see `LinesOf` in prims/lines.cuh): each lane takes two
// words of a line (lanes 3 and 7, beside their half's flag, one and a
// half, or one with 8-byte flags), sends them to every peer, then
// reduces what every peer sent for them in team order. One line a pass,
// as `reduce_lines`.
template <typename T, int OP>
__device__ void allreduce_ll128(const TeamSync &t, uint64_t dst_off, uint64_t src_off, uint64_t count) {
    phase_begin("ll128_allreduce");
    const uint64_t counter = lane_ll_counter(t);
    LinesFor<T> ll(t, typename LinesFor<T>::Later{});
    const uint64_t bytes = count * sizeof(T);
    const uint8_t *src = t.mine<uint8_t>(src_off);
    ll.template send_all<true, 1>(src, bytes, nullptr, counter);
    phase_mark("send");
    reduce_lines<T, OP>(ll, t.mine<uint8_t>(dst_off), src, bytes);
    phase_mark("recv_reduce");
    ll.end();
    phase_mark("end");
    phase_end();
}

// Reduce-scatter by lines: block r of this PE's source (`count` elements)
// goes to PE r in lines; PE r reduces what arrives in team order (the
// destination may be this PE's own block of the source).
template <typename T, int OP>
__device__ void reduce_scatter_ll128(const TeamSync &t, uint64_t dst_off, uint64_t src_off, uint64_t count) {
    LinesFor<T> ll(t);
    const uint64_t bytes = count * sizeof(T);
    const uint8_t *src = t.mine<uint8_t>(src_off);
    ll.send_blocks(src, bytes);
    reduce_lines<T, OP>(ll, t.mine<uint8_t>(dst_off), src + t.rank * bytes, bytes);
    ll.end();
}

// Low-latency reduce-scatter: block r of this PE's source (`count`
// elements) goes to PE r; PE r reduces what arrives in team order.
template <typename T, int OP>
__device__ void reduce_scatter_ll(const TeamSync &t, uint64_t dst_off, uint64_t src_off, uint64_t count) {
    using A = typename Acc<T>::type;
    constexpr int kPer = 8 / sizeof(T);
    LL ll(t);
    uint64_t bytes = count * sizeof(T);
    const uint8_t *src = t.mine<uint8_t>(src_off);
    uint8_t *dst = t.mine<uint8_t>(dst_off);
    for (uint64_t c = ll.first(); c < ll.chunks(bytes); c += ll.stride()) {
        for (int i = 1; i < t.n; i++) {
            int pe = t.after(i);
            ll.send(pe, c, load8(src + pe * bytes, c, bytes));
        }
    }
    for (uint64_t c = ll.first(); c < ll.chunks(bytes); c += ll.stride()) {
        union {
            uint64_t u;
            T x[kPer];
        } got;
        A acc[kPer];
        for (int pe = 0; pe < t.n; pe++) {
            got.u = pe == t.rank ? load8(src + pe * bytes, c, bytes) : ll.recv(pe, c);
#pragma unroll
            for (int e = 0; e < kPer; e++) acc[e] = pe == 0 ? to_acc(got.x[e]) : combine<OP>(acc[e], to_acc(got.x[e]));
        }
#pragma unroll
        for (int e = 0; e < kPer; e++) got.x[e] = from_acc<T>(acc[e]);
        store8(dst, c, bytes, got.u);
    }
    ll.end();
}

}  // namespace k
}  // namespace shmem

#define SHMEM_REDUCE_NP(NAME, T, OP, NP)                                                                           \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                          \
        shmem_allreduce_oneshot_##NAME##_##NP(shmem::k::TeamSync t, uint64_t dst, uint64_t src, uint64_t count) {  \
        shmem::k::follow_stream();                                                                                 \
        if (!shmem::k::agree(t)) return;                                                                           \
        shmem::k::allreduce_oneshot<T, shmem::k::OP, NP>(t, dst, src, count);                                      \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                          \
        shmem_allreduce_twoshot_##NAME##_##NP(shmem::k::TeamSync t, uint64_t dst, uint64_t src, uint64_t count) {  \
        shmem::k::follow_stream();                                                                                 \
        if (!shmem::k::agree(t)) return;                                                                           \
        shmem::k::allreduce_twoshot<T, shmem::k::OP, NP>(t, dst, src, count);                                      \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                          \
        shmem_reducescatter_##NAME##_##NP(shmem::k::TeamSync t, uint64_t dst, uint64_t src, uint64_t count) {      \
        shmem::k::follow_stream();                                                                                 \
        if (!shmem::k::agree(t)) return;                                                                           \
        shmem::k::reduce_scatter<T, shmem::k::OP, NP>(t, dst, src, count);                                         \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                          \
        shmem_allreduce_push_##NAME##_##NP(shmem::k::TeamSync t, uint64_t dst, uint64_t src, uint64_t count) {     \
        shmem::k::follow_stream();                                                                                 \
        if (!shmem::k::agree(t)) return;                                                                           \
        shmem::k::allreduce_push<T, shmem::k::OP, NP>(t, dst, src, count);                                         \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                          \
        shmem_reducescatter_push_##NAME##_##NP(shmem::k::TeamSync t, uint64_t dst, uint64_t src, uint64_t count) { \
        shmem::k::follow_stream();                                                                                 \
        if (!shmem::k::agree(t)) return;                                                                           \
        shmem::k::reduce_scatter_push<T, shmem::k::OP, NP>(t, dst, src, count);                                    \
    }

// The two-shot by stores (teams of two): suffix _0, and _2 for sums.
#define SHMEM_REDUCE_PAIR(NAME, T, OP, NP)                                                                         \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                          \
        shmem_allreduce_twoshot2_##NAME##_##NP(shmem::k::TeamSync t, uint64_t dst, uint64_t src, uint64_t count) { \
        shmem::k::follow_stream();                                                                                 \
        if (!shmem::k::agree(t)) return;                                                                           \
        shmem::k::allreduce_twoshot_stores<T, shmem::k::OP, NP>(t, dst, src, count);                               \
    }

// The node-aware chain and the node-grouped order (coll/reduce_nodes.cuh): any
// world laid out node by node.
#define SHMEM_REDUCE_NODES(NAME, T, OP)                                                                           \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                         \
        shmem_allreduce_nodes_##NAME(shmem::k::TeamSync t, shmem::k::RailOp op) {                                 \
        shmem::k::follow_stream();                                                                                \
        if (!shmem::k::agree(t)) return;                                                                          \
        shmem::k::allreduce_nodes<T, shmem::k::OP>(t, op);                                                        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                         \
        shmem_reducescatter_nodes_##NAME(shmem::k::TeamSync t, shmem::k::RailOp op) {                             \
        shmem::k::follow_stream();                                                                                \
        if (!shmem::k::agree(t)) return;                                                                          \
        shmem::k::reduce_scatter_nodes<T, shmem::k::OP>(t, op);                                                   \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                         \
        shmem_allreduce_grouped_##NAME(shmem::k::TeamSync t, shmem::k::RailOp op) {                               \
        shmem::k::follow_stream();                                                                                \
        if (!shmem::k::agree(t)) return;                                                                          \
        shmem::k::allreduce_grouped<T, shmem::k::OP>(t, op);                                                      \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                         \
        shmem_reducescatter_grouped_##NAME(shmem::k::TeamSync t, shmem::k::RailOp op) {                           \
        shmem::k::follow_stream();                                                                                \
        if (!shmem::k::agree(t)) return;                                                                          \
        shmem::k::reduce_scatter_grouped<T, shmem::k::OP>(t, op);                                                 \
    }

// Every op on T: kernels for any team size (suffix _0), the low-latency
// ones and the node-aware chain.
#define SHMEM_REDUCE(NAME, T, OP)                                                                            \
    SHMEM_REDUCE_NP(NAME, T, OP, 0)                                                                          \
    SHMEM_REDUCE_PAIR(NAME, T, OP, 0)                                                                        \
    SHMEM_REDUCE_NODES(NAME, T, OP)                                                                          \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                    \
        shmem_allreduce_ll_##NAME(shmem::k::TeamSync t, uint64_t dst, uint64_t src, uint64_t count) {        \
        shmem::k::follow_stream();                                                                           \
        if (!shmem::k::agree(t)) return;                                                                     \
        shmem::k::allreduce_ll<T, shmem::k::OP>(t, dst, src, count);                                         \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                    \
        shmem_allreduce_agreed_##NAME(shmem::k::TeamSync t, uint64_t dst, uint64_t src, uint64_t count) {    \
        shmem::k::follow_stream();                                                                           \
        shmem::k::allreduce_agreed<T, shmem::k::OP>(t, dst, src, count);                                     \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(shmem::k::kLinesMaxThreads, 1)                              \
        shmem_allreduce_ll128_##NAME(shmem::k::TeamSync t, uint64_t dst, uint64_t src, uint64_t count) {     \
        shmem::k::follow_stream();                                                                           \
        if (!shmem::k::agree(t)) return;                                                                     \
        shmem::k::allreduce_ll128<T, shmem::k::OP>(t, dst, src, count);                                      \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)                                    \
        shmem_reducescatter_ll_##NAME(shmem::k::TeamSync t, uint64_t dst, uint64_t src, uint64_t count) {    \
        shmem::k::follow_stream();                                                                           \
        if (!shmem::k::agree(t)) return;                                                                     \
        shmem::k::reduce_scatter_ll<T, shmem::k::OP>(t, dst, src, count);                                    \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(shmem::k::kLinesMaxThreads, 1)                              \
        shmem_reducescatter_ll128_##NAME(shmem::k::TeamSync t, uint64_t dst, uint64_t src, uint64_t count) { \
        shmem::k::follow_stream();                                                                           \
        if (!shmem::k::agree(t)) return;                                                                     \
        shmem::k::reduce_scatter_ll128<T, shmem::k::OP>(t, dst, src, count);                                 \
    }

// Sums also get kernels built for teams of 2, 4 and 8 (suffixes _2, _4, _8).
#define SHMEM_REDUCE_SUM(NAME, T)            \
    SHMEM_REDUCE(NAME##_sum, T, Sum)         \
    SHMEM_REDUCE_NP(NAME##_sum, T, Sum, 2)   \
    SHMEM_REDUCE_PAIR(NAME##_sum, T, Sum, 2) \
    SHMEM_REDUCE_NP(NAME##_sum, T, Sum, 4)   \
    SHMEM_REDUCE_NP(NAME##_sum, T, Sum, 8)

#define SHMEM_REDUCE_FLOAT(NAME, T)  \
    SHMEM_REDUCE_SUM(NAME, T)        \
    SHMEM_REDUCE(NAME##_min, T, Min) \
    SHMEM_REDUCE(NAME##_max, T, Max) \
    SHMEM_REDUCE(NAME##_prod, T, Prod)

#define SHMEM_REDUCE_INT(NAME, T)    \
    SHMEM_REDUCE_FLOAT(NAME, T)      \
    SHMEM_REDUCE(NAME##_and, T, And) \
    SHMEM_REDUCE(NAME##_or, T, Or)   \
    SHMEM_REDUCE(NAME##_xor, T, Xor)
