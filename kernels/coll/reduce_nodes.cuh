// The node-aware all-reduce and reduce-scatter in PE order (the chain),
// over the rail pipes (prims/rail.cuh). Their results are the flat fold
// x0 ⊕ x1 ⊕ … ⊕ x(n−1) in the accumulator type, rounded once: the same bits
// as the flat kernels and the host backend, on any number of nodes.
//
// All-reduce: shard i of the vector (whole 16-byte vectors, split over the
// L rails as `algo::rail_share` splits it) is rail i's. Each kernel has 2C
// blocks: C reducers and C forwarders, one pipe channel each (reducers c,
// forwarders C + c), and each channel takes its part of the shard, in
// chunks of kRailChunk bytes of the accumulator type.
//   - reducer on node 0: R = x(0,0) ⊕ … ⊕ x(0,L−1) (its node peers' sources
//     read over NVLink), into its outbox, sent to node 1;
//   - reducer on node 0 < a < N−1: R = R_in ⊕ x(a,0) ⊕ … ⊕ x(a,L−1), R_in
//     from node a−1's pipe, sent on to node a+1;
//   - reducer on node N−1: Y = round(R_in ⊕ x(N−1,0) ⊕ …), stored into its
//     own and its node peers' destinations, and sent from its destination
//     to every other node's PE of the rail (N ≤ 3), or to node 0 only (the
//     ring N−1 → 0 → 1 → … → N−2, N ≥ 4);
//   - forwarder on node b < N−1: takes Y from its pipe, stores it into its
//     own and its node peers' destinations (and on the ring sends it on
//     from its destination to node b+1 unless that is N−1).
// Partial values cross in the accumulator type (2× the bytes of f16 and
// bf16), so no partial is rounded twice.
//
// Reduce-scatter: member b·L + i's block is chained on rail i in the same
// way (each reducer takes its channel's part of every one of the N blocks
// of its rail, block after block); node N−1's reducer stores block N−1's
// rounded result into its own destination and sends block b's to node
// b's PE of the rail from its outbox, whose forwarder stores it into its
// destination. Only sources are read across a node; no PE writes another.
//
// Safety of in place (the destination is the source, or this PE's block
// of it): element e of shard i of a source is read only by the reducer of
// rail i on its node, and written only with its result, which exists only
// after that read (the chain carries it), by the same thread where the
// reducer writes it itself.
//
// No barrier across nodes: the kernel begins with a node barrier (every
// NVLink read and store reaches a PE in this call), the pipes' credits
// keep every inbox and outbox slot from being overwritten while in use,
// and a PE of another node writes only into this PE's inbox. It ends with
// a node barrier (`rail_finish`), so that no peer still reads a source or
// writes a destination of a PE whose kernel has ended.
//
// Deadlock freedom: reducers wait on their predecessor on the chain and
// on credits from their successor (node N−1's: from the forwarders);
// forwarders wait on node N−1 (or their predecessor on the ring) and on
// credits from their successor on the ring; node N−1's reducers never wait
// on the chain's senders. Each wait chain ends, given that every block of
// every PE's grid is resident at once: the host keeps the grid within the
// blocks resident on every PE's GPU (`Kernels::rail_channels`).
#pragma once
#include "core/elem.cuh"
#include "prims/rail.cuh"

namespace shmem {
namespace k {

// 16 bytes of T in the accumulator type.
template <typename T> struct alignas(16) AccVec {
    typename Acc<T>::type v[Vec<T>::kN];
};

// For i < count: acc = (in ? in[i] : to_acc(xs[0][i])) ⊕ to_acc(xs[..][i]) …
// (the rest of the `nx` members in order), then `acc_out[i] = acc` and
// `dsts[d][i] = from_acc(acc)` for every d < nd (whole block; pointers in
// shared memory). Each element is read and written by one thread, its
// loads before its stores, so a destination may be a source.
template <typename T, int OP>
__device__ void rail_fold(const typename Acc<T>::type *in, const T *const *xs, int nx, typename Acc<T>::type *acc_out,
                          T *const *dsts, int nd, uint64_t count) {
    using A = typename Acc<T>::type;
    using V = Vec<T>;
    using AV = AccVec<T>;
    constexpr int kN = V::kN;
    constexpr int kU = 8;  // members' loads issued together
    uint64_t align = 0;
    for (int p = 0; p < nx; p++) align |= reinterpret_cast<uint64_t>(xs[p]);
    for (int d = 0; d < nd; d++) align |= reinterpret_cast<uint64_t>(dsts[d]);
    const uint64_t vectors = align % 16 == 0 ? count / kN : 0;
    for (uint64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
        A acc[kN];
        int p = 0;
        if (in != nullptr) {
            const AV a = reinterpret_cast<const AV *>(in)[i];
#pragma unroll
            for (int e = 0; e < kN; e++) acc[e] = a.v[e];
        }
        while (p < nx) {
            V x[kU];
#pragma unroll
            for (int u = 0; u < kU; u++)
                if (p + u < nx) x[u] = reinterpret_cast<const V *>(xs[p + u])[i];
#pragma unroll
            for (int u = 0; u < kU; u++)
                if (p + u < nx)
#pragma unroll
                    for (int e = 0; e < kN; e++)
                        acc[e] = (in == nullptr && p + u == 0) ? to_acc(x[u].v[e]) : combine<OP>(acc[e], to_acc(x[u].v[e]));
            p += kU;
        }
        if (acc_out != nullptr) {
            AV o;
#pragma unroll
            for (int e = 0; e < kN; e++) o.v[e] = acc[e];
            reinterpret_cast<AV *>(acc_out)[i] = o;
        }
        if (nd > 0) {
            V y;
#pragma unroll
            for (int e = 0; e < kN; e++) y.v[e] = from_acc<T>(acc[e]);
            for (int d = 0; d < nd; d++) reinterpret_cast<V *>(dsts[d])[i] = y;
        }
    }
    for (uint64_t i = vectors * kN + threadIdx.x; i < count; i += blockDim.x) {
        A acc = in != nullptr ? in[i] : to_acc(xs[0][i]);
        for (int p = in != nullptr ? 0 : 1; p < nx; p++) acc = combine<OP>(acc, to_acc(xs[p][i]));
        if (acc_out != nullptr) acc_out[i] = acc;
        const T y = from_acc<T>(acc);
        for (int d = 0; d < nd; d++) dsts[d][i] = y;
    }
}

// Elements [lo, hi) of `count` that channel `c` of `C` takes of part `p`
// of `parts` (whole 16-byte vectors, the last part ending at `count`).
template <typename T> __device__ __forceinline__ Range rail_elems(uint64_t count, int p, int parts, int c, int C) {
    constexpr uint64_t kN = Vec<T>::kN;
    const Range share = split((count + kN - 1) / kN, p, parts);
    const Range in = split(share.hi - share.lo, c, C);
    return {min((share.lo + in.lo) * kN, count), min((share.lo + in.hi) * kN, count)};
}

// Reducer: `len` elements at element `at` of every member of this node's
// source at heap offset `src_off` (this PE's own, the others' over
// NVLink), folded onto `in` (or from scratch), into `acc_out` or, rounded,
// into `dsts` (nd of them, already set).
template <typename T, int OP>
__device__ __forceinline__ void fold_node(const Rail &r, uint64_t src_off, uint64_t at,
                                          const typename Acc<T>::type *in, typename Acc<T>::type *acc_out,
                                          T *const *dsts, int nd, uint64_t len) {
    __shared__ const T *xs[kMaxTeam];
    __syncthreads();
    if (threadIdx.x == 0)
        for (int k = 0; k < r.L; k++) {
            const int pe = r.local(k);
            xs[k] = (pe == r.t.rank ? r.t.mine<const T>(src_off) : r.t.at<const T>(pe, src_off)) + at;
        }
    __syncthreads();
    rail_fold<T, OP>(in, xs, r.L, acc_out, dsts, nd, len);
}

// The PE whose Y this PE's forwarder takes on the all-reduce, and whether
// it sends it on (see the top of this file).
__device__ __forceinline__ int y_from(const Rail &r) { return r.N <= 3 || r.node == 0 ? r.N - 1 : r.node - 1; }
__device__ __forceinline__ bool y_forwards(const Rail &r) { return r.N > 3 && r.node + 1 < r.N - 1; }

template <typename T, int OP> __device__ void allreduce_nodes(const TeamSync &t, const RailOp &op) {
    using A = typename Acc<T>::type;
    __shared__ T *dsts[kMaxTeam];
    __shared__ const T *ysrc[1];
    const Rail r(t, op);
    const int C = op.channels;
    const bool reducer = static_cast<int>(blockIdx.x) < C;
    const int c = reducer ? blockIdx.x : blockIdx.x - C;
    const int ych = C + c;  // the pipe channel of Y
    const int last = r.N - 1;
    const uint64_t epoch = rail_start(r);
    const Range part = rail_elems<T>(op.count, r.rail, r.L, c, C);
    // A chunk: kRailChunk bytes of the accumulator type (whole vectors of T).
    constexpr uint64_t kChunk = kRailChunk / sizeof(A);
    for (uint64_t x = part.lo; x < part.hi; x += kChunk) {
        const uint64_t len = min(kChunk, part.hi - x);
        const uint64_t off = op.dst + x * sizeof(T);
        if (reducer) {
            const A *in = r.node > 0 ? rail_wait<A>(r, c, r.node - 1) : nullptr;
            if (r.node < last) {
                A *out = rail_outbox<A>(r, c, r.node + 1);
                fold_node<T, OP>(r, op.src, x, in, out, nullptr, 0, len);
                if (in != nullptr) rail_release(r, c, r.node - 1);
                rail_send(r, c, r.node + 1, out, len * sizeof(A));
            } else {
                const int nd = node_dsts(r, reinterpret_cast<uint8_t **>(dsts), off, false);
                fold_node<T, OP>(r, op.src, x, in, nullptr, dsts, nd, len);
                rail_release(r, c, r.node - 1);
                const T *y = t.mine<const T>(off);
                if (r.N <= 3) {
                    for (int b = 0; b < last; b++) rail_send(r, ych, b, y, len * sizeof(T));
                } else {
                    rail_send(r, ych, 0, y, len * sizeof(T));
                }
            }
        } else if (r.node < last) {
            const int from = y_from(r);
            const T *y = rail_wait<T>(r, ych, from);
            if (threadIdx.x == 0) ysrc[0] = y;
            const int nd = node_dsts(r, reinterpret_cast<uint8_t **>(dsts), off, false);
            block_copy_pairs<true>(reinterpret_cast<uint8_t *const *>(dsts),
                                   reinterpret_cast<const uint8_t *const *>(ysrc), nd, len * sizeof(T));
            rail_release(r, ych, from);
            if (y_forwards(r)) rail_send(r, ych, r.node + 1, t.mine<const T>(off), len * sizeof(T));
        }
    }
    rail_finish(r, epoch);
}

template <typename T, int OP> __device__ void reduce_scatter_nodes(const TeamSync &t, const RailOp &op) {
    using A = typename Acc<T>::type;
    __shared__ T *dsts[1];
    const Rail r(t, op);
    const int C = op.channels;
    const bool reducer = static_cast<int>(blockIdx.x) < C;
    const int c = reducer ? blockIdx.x : blockIdx.x - C;
    const int ych = C + c;
    const int last = r.N - 1;
    const uint64_t epoch = rail_start(r);
    const Range part = rail_elems<T>(op.count, 0, 1, c, C);
    // A chunk: kRailChunk bytes of the accumulator type (whole vectors of T).
    constexpr uint64_t kChunk = kRailChunk / sizeof(A);
    T *own = t.mine<T>(op.dst);
    if (reducer) {
        for (int b = 0; b < r.N; b++) {
            // Member b·L + i's block of every source on this node.
            const uint64_t src_off = op.src + static_cast<uint64_t>(r.on_node(b)) * op.count * sizeof(T);
            for (uint64_t x = part.lo; x < part.hi; x += kChunk) {
                const uint64_t len = min(kChunk, part.hi - x);
                const A *in = r.node > 0 ? rail_wait<A>(r, c, r.node - 1) : nullptr;
                if (r.node < last) {
                    A *out = rail_outbox<A>(r, c, r.node + 1);
                    fold_node<T, OP>(r, src_off, x, in, out, nullptr, 0, len);
                    if (in != nullptr) rail_release(r, c, r.node - 1);
                    rail_send(r, c, r.node + 1, out, len * sizeof(A));
                } else {
                    T *y = b == last ? own + x : rail_outbox<T>(r, ych, b);
                    if (threadIdx.x == 0) dsts[0] = y;
                    fold_node<T, OP>(r, src_off, x, in, nullptr, dsts, 1, len);
                    rail_release(r, c, r.node - 1);
                    if (b != last) rail_send(r, ych, b, y, len * sizeof(T));
                }
            }
        }
    } else if (r.node < last) {
        for (uint64_t x = part.lo; x < part.hi; x += kChunk) {
            const uint64_t len = min(kChunk, part.hi - x);
            const T *y = rail_wait<T>(r, ych, last);
            block_copy(reinterpret_cast<uint8_t *>(own + x), reinterpret_cast<const uint8_t *>(y), len * sizeof(T));
            rail_release(r, ych, last);
        }
    }
    rail_finish(r, epoch);
}

// ---- The node-grouped order (`ReduceOrder::NodeGrouped`) ----
//
// Each node's PE-order fold P_a (in the accumulator type, rounded to T)
// crosses the network; the receiver folds the nodes' partials in node
// order: from_acc(to_acc(P_0) ⊕ to_acc(P_1) ⊕ …), the host backend's
// order and bits. Two roles of C blocks: senders (channel c) put partials,
// receivers (channel c for partials, C + c for results) fold them.
//
// Reduce-scatter: sender c of (a, i) folds its node's block b·L + i
// (its channel's part of it) for every other node b, chunk by chunk, and
// puts it to (b, i), the block's owner; receiver c of (b, i) takes chunk j
// from every other node at once, folds them with its own node's partial
// (read over NVLink) and writes its destination. Bytes out of a node per
// PE: (N−1)/N·S/L.
//
// All-reduce: rail i's shard of the vector is split over the N nodes (part
// b, whole 16-byte vectors). Sender c of (a, i) puts its node's partial of
// part b to (b, i) for every other b; receiver c of (b, i) folds part b's
// partials as above into its own and its node peers' destinations, puts
// the result to every other node's PE of the rail, and takes theirs (part
// a from (a, i)) into its own and its node peers' destinations. Bytes out
// of a node per PE: 2 (N−1)/N·S/L.
//
// Both loop over chunk indices and, for each, over the nodes, so that no
// pipe waits on another one's later chunks: a sender's chunk j waits only
// on credits of chunk j − kRailDepth, which every receiver returns once
// all senders reached chunk j − kRailDepth; a receiver's chunk j waits on
// the senders' chunk j and on the other receivers' results of chunk j
// (sent before they wait for anything of chunk j + 1) and credits of chunk
// j − kRailDepth. The slowest block can always go on (given the whole grid
// resident, as for the chain).
//
// In place: element e of part p of a source (all-reduce; of block b·L + i,
// reduce-scatter) is read by one role of one PE of its node, and the
// results written there are those of the same element, by the same thread
// after its reads (a receiver's own part), or exist only after the
// senders' reads of it (the other nodes' results carry them).

// Elements [lo, hi) of `count` that channel `c` of `C` takes of part `p` of
// `parts` of rail `rail`'s share (of `L`): whole 16-byte vectors, the
// last ending at `count`; as `algo::rail_share` splits the vector, then
// the share.
template <typename T>
__device__ __forceinline__ Range grouped_elems(uint64_t count, int rail, int L, int p, int parts, int c, int C) {
    constexpr uint64_t kN = Vec<T>::kN;
    const Range share = split((count + kN - 1) / kN, rail, L);
    const Range part = split(share.hi - share.lo, p, parts);
    const Range in = split(part.hi - part.lo, c, C);
    const uint64_t lo = share.lo + part.lo + in.lo, hi = share.lo + part.lo + in.hi;
    return {min(lo * kN, count), min(hi * kN, count)};
}

// For i < len: this node's fold of element `at + i` of its members'
// sources at `src_off` (rounded to T) folded in node order with the other
// nodes' partials `ins[a][i]` (ins[r.node] unused), rounded, into `dsts`
// (nd of them; pointers in shared memory, whole block). Each element is
// read and written by one thread, its loads before its stores.
template <typename T, int OP>
__device__ void fold_partials(const Rail &r, uint64_t src_off, uint64_t at, const T *const *ins, T *const *dsts,
                              int nd, uint64_t len) {
    using A = typename Acc<T>::type;
    __shared__ const T *xs[kMaxTeam];
    __syncthreads();
    if (threadIdx.x == 0)
        for (int k = 0; k < r.L; k++) {
            const int pe = r.local(k);
            xs[k] = (pe == r.t.rank ? r.t.mine<const T>(src_off) : r.t.at<const T>(pe, src_off)) + at;
        }
    __syncthreads();
    for (uint64_t i = threadIdx.x; i < len; i += blockDim.x) {
        A p = to_acc(xs[0][i]);
        for (int k = 1; k < r.L; k++) p = combine<OP>(p, to_acc(xs[k][i]));
        const T own = from_acc<T>(p);
        A acc = to_acc(r.node == 0 ? own : ins[0][i]);
        for (int a = 1; a < r.N; a++) acc = combine<OP>(acc, to_acc(a == r.node ? own : ins[a][i]));
        const T y = from_acc<T>(acc);
        for (int d = 0; d < nd; d++) dsts[d][i] = y;
    }
}

// Sender: chunk `j` (kChunk elements) of `part` of this node's sources at
// `src_off`, folded and rounded into the outbox to node `b` and sent.
template <typename T, int OP>
__device__ __forceinline__ void send_partial(const Rail &r, int c, int b, uint64_t src_off, Range part, uint64_t j,
                                             uint64_t chunk) {
    __shared__ T *out[1];
    const uint64_t x = part.lo + j * chunk;
    if (x >= part.hi) return;
    const uint64_t len = min(chunk, part.hi - x);
    T *o = rail_outbox<T>(r, c, b);
    if (threadIdx.x == 0) out[0] = o;
    fold_node<T, OP>(r, src_off, x, nullptr, nullptr, out, 1, len);
    rail_send(r, c, b, o, len * sizeof(T));
}

// Receiver: the other nodes' partials of chunk `j` of `part` (channel
// `c`), folded with this node's own into `dsts` at element `x` (set by
// `set_dsts(x)`, returning their number); false where the part has no
// chunk j.
template <typename T, int OP, typename SetDsts>
__device__ __forceinline__ bool take_partials(const Rail &r, int c, uint64_t src_off, Range part, uint64_t j,
                                              uint64_t chunk, T *const *dsts, SetDsts set_dsts) {
    __shared__ const T *ins[kMaxTeam];
    const uint64_t x = part.lo + j * chunk;
    if (x >= part.hi) return false;
    const uint64_t len = min(chunk, part.hi - x);
    for (int k = 1; k < r.N; k++) {
        const int a = (r.node + r.N - k) % r.N;
        const T *in = rail_wait<T>(r, c, a);
        if (threadIdx.x == 0) ins[a] = in;
    }
    const int nd = set_dsts(x);
    fold_partials<T, OP>(r, src_off, x, ins, dsts, nd, len);
    for (int k = 1; k < r.N; k++) rail_release(r, c, (r.node + r.N - k) % r.N);
    return true;
}

template <typename T, int OP> __device__ void reduce_scatter_grouped(const TeamSync &t, const RailOp &op) {
    __shared__ T *dsts[1];
    const Rail r(t, op);
    const int C = op.channels;
    const bool sender = static_cast<int>(blockIdx.x) < C;
    const int c = sender ? blockIdx.x : blockIdx.x - C;
    const uint64_t epoch = rail_start(r);
    const Range part = rail_elems<T>(op.count, 0, 1, c, C);
    constexpr uint64_t kChunk = kRailChunk / sizeof(T);
    const uint64_t chunks = (part.hi - part.lo + kChunk - 1) / kChunk;
    // Member b·L + i's block of every source on this node.
    auto block_of = [&](int b) { return op.src + static_cast<uint64_t>(r.on_node(b)) * op.count * sizeof(T); };
    for (uint64_t j = 0; j < chunks; j++) {
        if (sender) {
            for (int k = 1; k < r.N; k++) {
                const int b = (r.node + k) % r.N;
                send_partial<T, OP>(r, c, b, block_of(b), part, j, kChunk);
            }
        } else {
            take_partials<T, OP>(r, c, block_of(r.node), part, j, kChunk, dsts, [&](uint64_t x) {
                __syncthreads();
                if (threadIdx.x == 0) dsts[0] = t.mine<T>(op.dst) + x;
                __syncthreads();
                return 1;
            });
        }
    }
    rail_finish(r, epoch);
}

template <typename T, int OP> __device__ void allreduce_grouped(const TeamSync &t, const RailOp &op) {
    __shared__ T *dsts[kMaxTeam];
    __shared__ const T *ysrc[1];
    const Rail r(t, op);
    const int C = op.channels;
    const bool sender = static_cast<int>(blockIdx.x) < C;
    const int c = sender ? blockIdx.x : blockIdx.x - C;
    const int ych = C + c;  // the pipe channel of the results
    const uint64_t epoch = rail_start(r);
    constexpr uint64_t kChunk = kRailChunk / sizeof(T);
    auto part_of = [&](int p) { return grouped_elems<T>(op.count, r.rail, r.L, p, r.N, c, C); };
    uint64_t chunks = 0;
    for (int p = 0; p < r.N; p++) {
        const Range q = part_of(p);
        chunks = max(chunks, (q.hi - q.lo + kChunk - 1) / kChunk);
    }
    const Range mine = part_of(r.node);
    for (uint64_t j = 0; j < chunks; j++) {
        if (sender) {
            for (int k = 1; k < r.N; k++) {
                const int b = (r.node + k) % r.N;
                send_partial<T, OP>(r, c, b, op.src, part_of(b), j, kChunk);
            }
            continue;
        }
        const bool took = take_partials<T, OP>(r, c, op.src, mine, j, kChunk, dsts, [&](uint64_t x) {
            return node_dsts(r, reinterpret_cast<uint8_t **>(dsts), op.dst + x * sizeof(T), false);
        });
        if (took) {
            const uint64_t x = mine.lo + j * kChunk;
            const uint64_t len = min(kChunk, mine.hi - x);
            for (int k = 1; k < r.N; k++)
                rail_send(r, ych, (r.node + k) % r.N, t.mine<const T>(op.dst + x * sizeof(T)), len * sizeof(T));
        }
        for (int k = 1; k < r.N; k++) {
            const int a = (r.node + r.N - k) % r.N;
            const Range q = part_of(a);
            const uint64_t x = q.lo + j * kChunk;
            if (x >= q.hi) continue;
            const uint64_t len = min(kChunk, q.hi - x);
            const T *y = rail_wait<T>(r, ych, a);
            if (threadIdx.x == 0) ysrc[0] = y;
            const int nd = node_dsts(r, reinterpret_cast<uint8_t **>(dsts), op.dst + x * sizeof(T), false);
            block_copy_pairs<true>(reinterpret_cast<uint8_t *const *>(dsts),
                                   reinterpret_cast<const uint8_t *const *>(ysrc), nd, len * sizeof(T));
            rail_release(r, ych, a);
        }
    }
    rail_finish(r, epoch);
}

}  // namespace k
}  // namespace shmem
