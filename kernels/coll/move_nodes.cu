// The node-aware all-gather, broadcast and all-to-all, for the world team
// laid out node by node (see prims/rail.cuh): a byte crosses between nodes
// once, between two PEs of one rail, by the rail pipes; inside a node it
// goes by NVLink stores. The same routes as the host backend's forms
// (`host/nodes.rs`).
//
// Each kernel has 2C blocks: C senders and C receivers, channel c of each
// taking the c-th part of what crosses (whole 16-byte units). A kernel
// begins with a barrier of the node (every NVLink store reaches a PE in
// this call) and ends with one (`rail_finish`: every store into this PE
// is done when its kernel ends); the pipes' credits make a barrier across
// nodes unnecessary. Every block of every PE's grid must be resident at
// once (receivers wait on other PEs' senders, which wait on credits from
// their receivers): the host keeps the grid within the blocks resident on
// every GPU (`Kernels::rail_channels`).
#include "core/common.cuh"
#include "prims/rail.cuh"

using shmem::k::RailOp;
using shmem::k::TeamSync;

// All-gather: block `rank` of every member's destination (heap `dst`)
// gets this PE's source (heap `src`; in place, block `rank` of its own
// destination), `count` bytes per member.
//   - Sender c: its part of the source into block `rank` of its own and
//     its node peers' destinations, then through the pipes (channel c) to
//     its rail peers, node a+1, a+2, … in turn (straight from the source).
//   - Receiver c: its part of the blocks of rail peers a−1, a−2, … in turn
//     (each the order in which that peer sends to this node, so that no
//     pipe waits on another), from the inbox into its own and its node
//     peers' destinations.
// Bytes out of a node per PE: (N−1)·count. In place is safe: block `rank`
// of a destination is written by no one, and read only by this PE.
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_allgather_nodes(TeamSync t, RailOp op) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    __shared__ uint8_t *dsts[kMaxTeam];
    __shared__ const uint8_t *srcs[1];
    const Rail r(t, op);
    const int C = op.channels;
    const bool sender = static_cast<int>(blockIdx.x) < C;
    const int c = sender ? blockIdx.x : blockIdx.x - C;
    const uint64_t epoch = rail_start(r);
    const uint64_t bytes = op.count;
    const Range part = rail_bytes(bytes, c, C);
    const uint64_t len = part.hi - part.lo;
    if (sender && len > 0) {
        const uint64_t mine = op.dst + t.rank * bytes + part.lo;
        const uint8_t *from = t.mine<uint8_t>(op.src) + part.lo;
        if (threadIdx.x == 0) srcs[0] = from;
        const int nd = node_dsts(r, dsts, mine, op.src == op.dst + t.rank * bytes);
        block_copy_pairs<true>(dsts, srcs, nd, len);
        for (int k = 1; k < r.N; k++) {
            const int to = (r.node + k) % r.N;
            for (uint64_t x = 0; x < len; x += kRailChunk) rail_send(r, c, to, from + x, min(kRailChunk, len - x));
        }
    } else if (!sender && len > 0) {
        for (int k = 1; k < r.N; k++) {
            const int a = (r.node + r.N - k) % r.N;
            const uint64_t block = op.dst + r.on_node(a) * bytes + part.lo;
            for (uint64_t x = 0; x < len; x += kRailChunk) {
                const uint8_t *in = rail_wait<uint8_t>(r, c, a);
                if (threadIdx.x == 0) srcs[0] = in;
                const int nd = node_dsts(r, dsts, block + x, false);
                block_copy_pairs<true>(dsts, srcs, nd, min(kRailChunk, len - x));
                rail_release(r, c, a);
            }
        }
    }
    rail_finish(r, epoch);
}

// Broadcast of `count` bytes from member `root`'s source (heap `src`)
// into every member's destination (heap `dst`; the root's may be its
// source). Share i of the vector (whole 16-byte units split over the L
// rails, as `algo::rail_share`) crosses on rail i; channel c takes its
// c-th part.
//   - On the root's node a_r, sender c: the root stores channel c's part
//     of every share into its node's destinations (its own unless `dst` is
//     `src`) and signals its node peers on the Data array; the others
//     wait for that. Then the PE of rail i sends its part of share i from
//     its destination to every other node's PE of the rail (N ≤ 3), or to
//     node a_r+1 only (N ≥ 4: the ring a_r → a_r+1 → …, each node sending
//     it on from its destination but the last).
//   - On the other nodes, receiver c: takes its part of share i from the
//     pipe into its own and its node peers' destinations (and on the ring
//     sends it on).
// Bytes out of a node per PE: (N−1)·count/L on the root's node (count/L
// on the ring), count/L on the ring's forwarders, none elsewhere.
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_broadcast_nodes(TeamSync t, RailOp op) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    __shared__ uint8_t *dsts[kMaxTeam];
    __shared__ const uint8_t *srcs[1];
    const Rail r(t, op);
    const int C = op.channels;
    const bool sender = static_cast<int>(blockIdx.x) < C;
    const int c = sender ? blockIdx.x : blockIdx.x - C;
    const uint64_t epoch = rail_start(r);
    const int root_node = op.root / r.L;
    const bool ring = r.N > 3;
    const uint64_t units = (op.count + 15) / 16;
    // Channel c's part of share j, in bytes.
    auto part_of = [&](int j) {
        const Range share = split(units, j, r.L);
        const Range in = split(share.hi - share.lo, c, C);
        return Range{min((share.lo + in.lo) * 16, op.count), min((share.lo + in.hi) * 16, op.count)};
    };
    const Range part = part_of(r.rail);
    const uint64_t len = part.hi - part.lo;
    const uint8_t *mine = t.mine<uint8_t>(op.dst) + part.lo;
    if (sender && r.node == root_node) {
        if (t.rank == op.root) {
            for (int j = 0; j < r.L; j++) {
                const Range p = part_of(j);
                __syncthreads();  // the copy before has read srcs[0]
                if (threadIdx.x == 0) srcs[0] = t.mine<uint8_t>(op.src) + p.lo;
                const int nd = node_dsts(r, dsts, op.dst + p.lo, op.dst == op.src);
                block_copy_pairs<true>(dsts, srcs, nd, p.hi - p.lo);
            }
            __syncthreads();
            for (int k = threadIdx.x; k < r.L; k += blockDim.x)
                if (r.local(k) != t.rank) signal(t, Data, r.local(k), epoch);
        } else if (threadIdx.x == 0) {
            wait_geq(t.word(Data, blockIdx.x, op.root), epoch);
        }
        __syncthreads();
        for (int k = 1; k < (ring ? 2 : r.N); k++) {
            const int to = (root_node + k) % r.N;
            for (uint64_t x = 0; x < len; x += kRailChunk) rail_send(r, c, to, mine + x, min(kRailChunk, len - x));
        }
    } else if (!sender && r.node != root_node) {
        const int from = ring ? (r.node + r.N - 1) % r.N : root_node;
        const int next = (r.node + 1) % r.N;
        const bool forwards = ring && next != root_node;
        for (uint64_t x = 0; x < len; x += kRailChunk) {
            const uint64_t n = min(kRailChunk, len - x);
            const uint8_t *in = rail_wait<uint8_t>(r, c, from);
            if (threadIdx.x == 0) srcs[0] = in;
            const int nd = node_dsts(r, dsts, op.dst + part.lo + x, false);
            block_copy_pairs<true>(dsts, srcs, nd, n);
            rail_release(r, c, from);
            if (forwards) rail_send(r, c, next, mine + x, n);
        }
    }
    rail_finish(r, epoch);
}

// Bytes [lo, hi) of a row of L blocks of `block` bytes each (block k for
// node peer k), read at `from` (byte lo of the row), into heap offset
// `at` of each block's node peer, plus the offset within its block (whole
// block of threads): the pieces one after another, as a range may end
// and begin blocks anywhere.
__device__ __forceinline__ void scatter_row(const shmem::k::Rail &r, const uint8_t *from, uint64_t lo, uint64_t hi,
                                            uint64_t block, uint64_t at) {
    if (block == 0) return;
    for (uint64_t k = lo / block; k < static_cast<uint64_t>(r.L) && k * block < hi; k++) {
        const uint64_t plo = max(lo, k * block), phi = min(hi, (k + 1) * block);
        const int pe = r.local(static_cast<int>(k));
        const uint64_t off = at + (plo - k * block);
        uint8_t *to = pe == r.t.rank ? r.t.mine<uint8_t>(off) : r.t.at<uint8_t>(pe, off);
        shmem::k::block_copy(to, from + (plo - lo), phi - plo);
    }
}

// All-to-all: block j of this PE's source (heap `src`, n blocks of `count`
// bytes) goes to block `rank` of member j's destination (heap `dst`,
// apart from `src`). The source's blocks for node b, members b·L ..
// b·L+L−1, are contiguous: node b's row, L·count bytes. Channel c takes
// the c-th part of every row (whole 16-byte units).
//   - Sender c: its part of this node's row into its node peers' (and its
//     own) destinations by NVLink stores, then its part of node b's row,
//     straight from the source, through the pipes to the PE of its rail
//     on node b, for b = a+1, a+2, … in turn.
//   - Receiver c: its part of the row from the PE of its rail on node
//     a−1, a−2, … in turn (the order in which each sends to this node),
//     each block's piece from the inbox into block (sender's rank) of the
//     destination of that block's node peer.
// Bytes out of a node per PE: (N−1)·L·count = (N−1)/N of the source, as
// the host backend's form, in (N−1) rows (each as chunks of the pipe).
// Not in place: a PE's destination may be written before its source is
// read (the host goes through a copy of the source).
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_alltoall_nodes(TeamSync t, RailOp op) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    const Rail r(t, op);
    const int C = op.channels;
    const bool sender = static_cast<int>(blockIdx.x) < C;
    const int c = sender ? blockIdx.x : blockIdx.x - C;
    const uint64_t epoch = rail_start(r);
    const uint64_t block = op.count;
    const uint64_t row = static_cast<uint64_t>(r.L) * block;
    const Range part = rail_bytes(row, c, C);
    const uint64_t len = part.hi - part.lo;
    if (sender && len > 0) {
        const uint8_t *src = t.mine<uint8_t>(op.src);
        const uint64_t slot = op.dst + t.rank * block;
        scatter_row(r, src + r.node * row + part.lo, part.lo, part.hi, block, slot);
        for (int k = 1; k < r.N; k++) {
            const int to = (r.node + k) % r.N;
            const uint8_t *from = src + to * row + part.lo;
            for (uint64_t x = 0; x < len; x += kRailChunk) rail_send(r, c, to, from + x, min(kRailChunk, len - x));
        }
    } else if (!sender && len > 0) {
        for (int k = 1; k < r.N; k++) {
            const int a = (r.node + r.N - k) % r.N;
            const uint64_t slot = op.dst + r.on_node(a) * block;
            for (uint64_t x = 0; x < len; x += kRailChunk) {
                const uint64_t lo = part.lo + x;
                const uint8_t *in = rail_wait<uint8_t>(r, c, a);
                scatter_row(r, in, lo, lo + min(kRailChunk, len - x), block, slot);
                rail_release(r, c, a);
            }
        }
    }
    rail_finish(r, epoch);
}
