// Data-movement kernels: barrier, all-gather, broadcast and all-to-all,
// and the agreement of an eager call alone. Each collective first checks
// that every member made the same call (`agree`, a no-op in a graph).
// Each pushes: after a barrier (every destination is free to be written),
// a block sends its share of the bytes to every peer — stores through the
// peer's NVLink address, or an RMA put — then signals the peer, which
// waits for every sender's signal on its own channel. A PE's output is
// complete when its kernel ends, and no exit barrier is needed: every
// source a PE reads is its own.
#include "core/common.cuh"

namespace shmem {
namespace k {

// Bytes [lo, hi) of `bytes` that block `b` of `blocks` takes, in whole
// 16-byte units except at the end.
__device__ __forceinline__ Range block_bytes(uint64_t bytes, uint64_t b, uint64_t blocks) {
    Range r = split((bytes + 15) / 16, b, blocks);
    return {min(r.lo * 16, bytes), min(r.hi * 16, bytes)};
}

// Signals every peer (but `skip`) on the Data array, then finishes: the
// RMA path waits for its puts to complete before the sources may change.
__device__ __forceinline__ void signal_peers(const TeamSync &t, uint64_t epoch) {
    __syncthreads();
    for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x)
        if (pe != t.rank) signal(t, Data, pe, epoch);
}

// This block's `bytes` to heap offset `to` of every peer, from `from(pe)`,
// and, when `self`, from `from(rank)` to `to` in this PE's own memory:
// RMA peers get a put each (whose completion `signal` awaits), and the
// NVLink peers and the own copy go in one pass of `block_copy_pairs`, so
// the own copy overlaps the sends. `kOneSrc`: every member's source is
// the same.
template <bool kOneSrc, typename From>
__device__ __forceinline__ void send_all(const TeamSync &t, uint64_t to, From from, bool self, uint64_t bytes) {
    __shared__ uint8_t *dsts[kMaxTeam];
    __shared__ const uint8_t *srcs[kMaxTeam];
    __shared__ int nd;
    if (bytes == 0) return;
    if (threadIdx.x == 0) {
        nd = 0;
        if (self) {
            dsts[nd] = t.mine<uint8_t>(to);
            srcs[nd++] = from(t.rank);
        }
        for (int i = 1; i < t.n; i++) {
            int pe = t.after(i);
            if (t.nvlink(pe)) {
                dsts[nd] = t.at<uint8_t>(pe, to);
                srcs[nd++] = from(pe);
            }
        }
    }
    __syncthreads();
    for (int i = 1; i < t.n; i++) {
        int pe = t.after(i);
        if (!t.nvlink(pe)) rma_put(t, pe, t.mine<uint8_t>(to), from(pe), bytes);
    }
    block_copy_pairs<kOneSrc>(dsts, srcs, nd, bytes);
}

__device__ __forceinline__ void finish(const TeamSync &t, uint64_t epoch) {
    __syncthreads();
    if (t.rma && threadIdx.x == 0) nvshmem_quiet();
    end_epoch(t, epoch);
}

}  // namespace k
}  // namespace shmem

using shmem::k::TeamSync;

// A barrier of the team on the stream (one block).
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_barrier(TeamSync t) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    uint64_t epoch = shmem::k::begin_epoch(t);
    shmem::k::exchange(t, shmem::k::Arrive, epoch);
    shmem::k::end_epoch(t, epoch);
}

// The agreement alone (one block): run by a PE whose own arguments failed
// its checks, with its error code in its row, so that every member's
// kernel of the call sees a mismatch and skips it (see core/agree.cuh).
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_agree(TeamSync t) {
    shmem::k::follow_stream();
    shmem::k::agree(t);
}

// All-gather: block `rank` of every member's destination (heap `dst`)
// gets this PE's source (heap `src`, or block `rank` of its own
// destination when `in_place`); `bytes` per member.
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_allgather(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes, int in_place) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    uint64_t epoch = begin_epoch(t);
    exchange(t, Arrive, epoch);
    Range r = block_bytes(bytes, blockIdx.x, gridDim.x);
    uint64_t mine = dst + t.rank * bytes;
    const uint8_t *from = t.mine<uint8_t>(in_place ? mine : src) + r.lo;
    send_all<true>(t, mine + r.lo, [&](int) { return from; }, !in_place, r.hi - r.lo);
    signal_peers(t, epoch);
    wait_all(t, Data, epoch, t.rank);
    finish(t, epoch);
}

// Broadcast: `root`'s source (heap `src`) into every member's destination
// (heap `dst`), `bytes` long; the root's may be its source.
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_broadcast(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes, int root) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    uint64_t epoch = begin_epoch(t);
    exchange(t, Arrive, epoch);
    if (t.rank == root) {
        Range r = block_bytes(bytes, blockIdx.x, gridDim.x);
        const uint8_t *from = t.mine<uint8_t>(src) + r.lo;
        send_all<true>(t, dst + r.lo, [&](int) { return from; }, dst != src, r.hi - r.lo);
        signal_peers(t, epoch);
    } else if (threadIdx.x == 0) {
        wait_geq(t.word(Data, blockIdx.x, root), epoch);
    }
    finish(t, epoch);
}

// Broadcast by pulls, for large broadcasts of a team whose members all
// reach the root over NVLink: after the barrier, each member's blocks
// read their share of the root's source (heap `src`) through NVLink into
// their own destination; the root copies its own when `dst` is not `src`,
// then waits until every member has said on its channel that it is done
// reading, so that the source may change once the root's kernel ends.
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_broadcast_pull(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes, int root) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    uint64_t epoch = begin_epoch(t);
    exchange(t, Arrive, epoch);
    Range r = block_bytes(bytes, blockIdx.x, gridDim.x);
    uint8_t *out = t.mine<uint8_t>(dst) + r.lo;
    if (t.rank == root) {
        if (dst != src) block_copy(out, t.mine<uint8_t>(src) + r.lo, r.hi - r.lo);
        wait_all(t, Depart, epoch, t.rank);
    } else {
        block_copy(out, t.at<uint8_t>(root, src) + r.lo, r.hi - r.lo);
        __syncthreads();
        if (threadIdx.x == 0) signal(t, Depart, root, epoch);
    }
    end_epoch(t, epoch);
}

// Broadcast relayed by the members, for large broadcasts of a team of three
// or more whose members all reach each other over NVLink. A root that
// stores into every peer sends each byte n−1 times through its own links;
// here each byte leaves the root once: the vector is cut into n−1 shares,
// and share j's relay, member (root + 1 + j) % n, reads it from the root's
// source through NVLink and stores it into its own destination and every
// other non-root's in the same pass (`block_copy_pairs`: each load once,
// its stores to all of them). Bytes out of the root: `bytes` (read by the
// relays); out of a relay, (n−2)/(n−1) of them. The root waits until every
// relay has said on its channel that it is done reading (Depart), so that
// the source may change once the root's kernel ends; a relay waits until
// every other relay has said its share landed (Data).
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_broadcast_relay(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes, int root) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    __shared__ uint8_t *dsts[kMaxTeam];
    __shared__ const uint8_t *srcs[1];
    const uint64_t epoch = begin_epoch(t);
    exchange(t, Arrive, epoch);
    if (t.rank == root) {
        if (dst != src) {
            const Range r = block_bytes(bytes, blockIdx.x, gridDim.x);
            block_copy(t.mine<uint8_t>(dst) + r.lo, t.mine<uint8_t>(src) + r.lo, r.hi - r.lo);
        }
        wait_all(t, Depart, epoch, t.rank);
    } else {
        // This member's share, and this block's part of it.
        const int shares = t.n - 1, mine = t.rank > root ? t.rank - root - 1 : t.rank + t.n - root - 1;
        const Range share = split((bytes + 15) / 16, mine, shares);
        const Range part = split(share.hi - share.lo, blockIdx.x, gridDim.x);
        const uint64_t lo = min((share.lo + part.lo) * 16, bytes), hi = min((share.lo + part.hi) * 16, bytes);
        if (threadIdx.x == 0) {
            srcs[0] = t.at<uint8_t>(root, src + lo);
            int nd = 0;
            for (int i = 0; i < t.n; i++) {
                const int pe = t.after(i);
                if (pe != root) dsts[nd++] = t.at<uint8_t>(pe, dst + lo);
            }
        }
        __syncthreads();
        block_copy_pairs<true>(dsts, srcs, t.n - 1, hi - lo);
        __syncthreads();
        for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x) {
            if (pe == root) {
                signal(t, Depart, pe, epoch);
            } else if (pe != t.rank) {
                signal(t, Data, pe, epoch);
            }
        }
        for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x)
            if (pe != root && pe != t.rank) wait_geq(t.word(Data, blockIdx.x, pe), epoch);
        __syncthreads();
    }
    end_epoch(t, epoch);
}

// All-to-all: block j of this PE's source (heap `src`, `bytes` per block)
// becomes block `rank` of member j's destination (heap `dst`). Source and
// destination are apart (in place goes through a copy on the host side).
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_alltoall(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    uint64_t epoch = begin_epoch(t);
    exchange(t, Arrive, epoch);
    Range r = block_bytes(bytes, blockIdx.x, gridDim.x);
    const uint8_t *in = t.mine<uint8_t>(src) + r.lo;
    send_all<false>(t, dst + t.rank * bytes + r.lo, [&](int pe) { return in + pe * bytes; }, true, r.hi - r.lo);
    signal_peers(t, epoch);
    wait_all(t, Data, epoch, t.rank);
    finish(t, epoch);
}

// Push forms (see `Push` in prims/push.cuh) of all-gather, broadcast and
// all-to-all, for the world team over NVLink up to kPushMaxBytes a peer:
// what goes to a peer lands in its staging, and each PE copies what it
// received into its destination once the senders' flags are up.
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_allgather_push(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes, int in_place) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    Push push(t);
    Range r = block_bytes(bytes, blockIdx.x, gridDim.x);
    uint8_t *out = t.mine<uint8_t>(dst);
    const uint8_t *from = t.mine<uint8_t>(in_place ? dst + t.rank * bytes : src) + r.lo;
    for (int i = 1; i < t.n; i++) push.send(t.after(i), r.lo, from, r.hi - r.lo);
    if (!in_place) block_copy(out + t.rank * bytes + r.lo, from, r.hi - r.lo);
    push.flag_and_wait();
    for (int pe = 0; pe < t.n; pe++)
        if (pe != t.rank) block_copy(out + pe * bytes + r.lo, push.received<uint8_t>(pe, r.lo), r.hi - r.lo);
    push.end();
}

extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_broadcast_push(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes, int root) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    Push push(t);
    Range r = block_bytes(bytes, blockIdx.x, gridDim.x);
    uint8_t *out = t.mine<uint8_t>(dst) + r.lo;
    if (t.rank == root) {
        const uint8_t *from = t.mine<uint8_t>(src) + r.lo;
        for (int i = 1; i < t.n; i++) push.send(t.after(i), r.lo, from, r.hi - r.lo);
        if (dst != src) block_copy(out, from, r.hi - r.lo);
    }
    // Every member flags every member, so that all hear from all.
    push.flag_and_wait();
    if (t.rank != root) block_copy(out, push.received<uint8_t>(root, r.lo), r.hi - r.lo);
    push.end();
}

// In place is safe: a block sends its share of every block of the source
// before it writes the same share of any block of the destination.
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_alltoall_push(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    Push push(t);
    Range r = block_bytes(bytes, blockIdx.x, gridDim.x);
    const uint8_t *in = t.mine<uint8_t>(src);
    uint8_t *out = t.mine<uint8_t>(dst);
    for (int i = 1; i < t.n; i++) {
        int pe = t.after(i);
        push.send(pe, r.lo, in + pe * bytes + r.lo, r.hi - r.lo);
    }
    if (dst != src) block_copy(out + t.rank * bytes + r.lo, in + t.rank * bytes + r.lo, r.hi - r.lo);
    push.flag_and_wait();
    for (int pe = 0; pe < t.n; pe++)
        if (pe != t.rank) block_copy(out + pe * bytes + r.lo, push.received<uint8_t>(pe, r.lo), r.hi - r.lo);
    push.end();
}

// Low-latency forms (see `LL` in prims/ll.cuh) of all-gather, broadcast and
// all-to-all, for small payloads of the world team over NVLink.
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_allgather_ll(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes, int in_place) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    LL ll(t);
    uint8_t *out = t.mine<uint8_t>(dst);
    const uint8_t *in = in_place ? out + t.rank * bytes : t.mine<uint8_t>(src);
    for (uint64_t c = ll.first(); c < ll.chunks(bytes); c += ll.stride()) {
        uint64_t mine = load8(in, c, bytes);
        for (int i = 1; i < t.n; i++) ll.send(t.after(i), c, mine);
        if (!in_place) store8(out + t.rank * bytes, c, bytes, mine);
    }
    for (uint64_t c = ll.first(); c < ll.chunks(bytes); c += ll.stride())
        for (int pe = 0; pe < t.n; pe++)
            if (pe != t.rank) store8(out + pe * bytes, c, bytes, ll.recv(pe, c));
    ll.end();
}

// Every PE other than `root` sends one token to every PE, so that every
// PE hears from every peer (see `LL`).
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_broadcast_ll(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes, int root) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    LL ll(t);
    uint8_t *out = t.mine<uint8_t>(dst);
    if (ll.first() == 0 && t.rank != root)
        for (int i = 1; i < t.n; i++) ll.send(t.after(i), 0, 0);
    for (uint64_t c = ll.first(); c < ll.chunks(bytes); c += ll.stride()) {
        if (t.rank == root) {
            uint64_t v = load8(t.mine<uint8_t>(src), c, bytes);
            for (int i = 1; i < t.n; i++) ll.send(t.after(i), c, v);
            if (dst != src) store8(out, c, bytes, v);
        } else {
            // Receivers have nothing to send first but the token above.
            store8(out, c, bytes, ll.recv(root, c));
        }
    }
    if (ll.first() == 0)
        for (int pe = 0; pe < t.n; pe++)
            if (pe != root && pe != t.rank) ll.recv(pe, 0);
    ll.end();
}

extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_alltoall_ll(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    LL ll(t);
    uint8_t *out = t.mine<uint8_t>(dst);
    const uint8_t *in = t.mine<uint8_t>(src);
    for (uint64_t c = ll.first(); c < ll.chunks(bytes); c += ll.stride()) {
        for (int i = 1; i < t.n; i++) {
            int pe = t.after(i);
            ll.send(pe, c, load8(in + pe * bytes, c, bytes));
        }
    }
    for (uint64_t c = ll.first(); c < ll.chunks(bytes); c += ll.stride())
        for (int pe = 0; pe < t.n; pe++)
            store8(out + pe * bytes, c, bytes, pe == t.rank ? load8(in + t.rank * bytes, c, bytes) : ll.recv(pe, c));
    ll.end();
}

// The same three in 128-byte lines (see `Lines` in prims/lines.cuh), for the
// larger of the low-latency kernels' messages.
extern "C" __global__ void __launch_bounds__(shmem::k::kLinesMaxThreads, 1)
    shmem_allgather_ll128(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes, int in_place) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    const uint64_t counter = lane_ll_counter(t);
    Lines ll(t, Lines::Later{});
    const uint64_t lines = ll.lines(bytes);
    uint8_t *out = t.mine<uint8_t>(dst);
    const uint8_t *in = in_place ? out + t.rank * bytes : t.mine<uint8_t>(src);
    ll.send_all<true>(in, bytes, in_place ? nullptr : out + t.rank * bytes, counter);
    for (uint64_t base = ll.base(); base < lines; base += ll.stride()) {
        uint64_t line = ll.line_of(base);
        bool live = line < lines;
        for (int pe = 0; pe < t.n; pe++) {
            if (pe == t.rank) continue;
            uint64_t a, b;
            ll.recv(pe, line, live, a, b);
            ll.store(out + pe * bytes, bytes, line, live, a, b);
        }
    }
    ll.end();
}

// Every PE other than `root` sends one line to every PE, so that every PE
// hears from every peer (see `LL`); the first warp of block 0 sends and
// receives those.
extern "C" __global__ void __launch_bounds__(shmem::k::kLinesMaxThreads, 1)
    shmem_broadcast_ll128(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes, int root) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    Lines ll(t);
    const uint64_t lines = ll.lines(bytes);
    const bool token = blockIdx.x == 0 && threadIdx.x < 32;
    uint8_t *out = t.mine<uint8_t>(dst);
    if (token && t.rank != root)
        for (int i = 1; i < t.n; i++) ll.send(t.after(i), 0, threadIdx.x < 8, 0, 0);
    for (uint64_t base = ll.base(); base < lines; base += ll.stride()) {
        uint64_t line = ll.line_of(base);
        bool live = line < lines;
        uint64_t a, b;
        if (t.rank == root) {
            ll.load(t.mine<uint8_t>(src), bytes, line, live, a, b);
            for (int i = 1; i < t.n; i++) ll.send(t.after(i), line, live, a, b);
            if (dst != src) ll.store(out, bytes, line, live, a, b);
        } else {
            // Receivers have nothing to send first but the line above.
            ll.recv(root, line, live, a, b);
            ll.store(out, bytes, line, live, a, b);
        }
    }
    if (token)
        for (int pe = 0; pe < t.n; pe++)
            if (pe != root && pe != t.rank) {
                uint64_t a, b;
                ll.recv(pe, 0, threadIdx.x < 8, a, b);
            }
    ll.end();
}

extern "C" __global__ void __launch_bounds__(shmem::k::kLinesMaxThreads, 1)
    shmem_alltoall_ll128(TeamSync t, uint64_t dst, uint64_t src, uint64_t bytes) {
    shmem::k::follow_stream();
    if (!shmem::k::agree(t)) return;
    using namespace shmem::k;
    Lines ll(t);
    const uint64_t lines = ll.lines(bytes);
    uint8_t *out = t.mine<uint8_t>(dst);
    const uint8_t *in = t.mine<uint8_t>(src);
    ll.send_blocks(in, bytes);
    // In place, only this lane reads and writes these words of each chunk.
    for (uint64_t base = ll.base(); base < lines; base += ll.stride()) {
        uint64_t line = ll.line_of(base);
        bool live = line < lines;
        for (int pe = 0; pe < t.n; pe++) {
            uint64_t a, b;
            if (pe == t.rank) {
                ll.load(in + pe * bytes, bytes, line, live, a, b);
            } else {
                ll.recv(pe, line, live, a, b);
            }
            ll.store(out + pe * bytes, bytes, line, live, a, b);
        }
    }
    ll.end();
}
