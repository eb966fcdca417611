// The rail pipe: pipelined, credit-controlled transfers between two PEs of
// one rail (the PEs of the same local rank, one on each node), the only
// way the node-aware collectives move bytes between nodes. Everything
// inside a node goes by NVLink loads and stores.
//
// The world team is laid out node by node (`RailOp::per_node` = L members
// a node): member a·L + i is PE (a, i). A pipe is one direction of one
// channel between (a, i) and (b, i). Its state lies in the world's rail
// region (`Layout::rail` on the host; `Rail` below computes the same
// offsets), every PE alike:
//
//   words: step  [channel][from node][slot]  at the receiver, set by the sender
//          credit[channel][to node]          at the sender, added to by the receiver
//          sent  [channel][to node]          the sender's own count
//          taken [channel][from node]        the receiver's own count
//   inbox  [channel][from node ≠ me][slot]   kRailChunk bytes each
//   outbox [channel][to node ≠ me][slot]     kRailChunk bytes each
//
// `sent` and `taken` count the chunks a pipe ever moved (as NCCL's head
// and tail): they live on the device, so graph replays and eager calls
// share them, and no call needs a barrier across nodes to know that the
// peer's inbox is free. Every kernel moves, on every pipe, as many chunks
// out of the sender as into the receiver (both sides compute the chunks
// from the same arguments), so the counts stay equal across calls.
//
// Sending chunk s (counted from 0) on a pipe:
//   1. wait until credit ≥ s + 1 − kRailDepth: the receiver has consumed
//      chunk s − kRailDepth, which used the same inbox slot (and, when the
//      chunk came from the outbox, the same outbox slot: a consumed chunk
//      was delivered, so its put has read its source);
//   2. `nvshmemx_putmem_signal_nbi_block` into inbox slot s % D, setting
//      the receiver's step word of that slot to s + 1 once the data is
//      delivered (NVSHMEM orders the data before the signal; no quiet on
//      the way, which would serialise the pipeline).
// A slot's step word has one writer at a time: the put of chunk s is
// issued only after the receiver consumed chunk s − D of the same slot,
// so two puts never race for one word (SET cannot go backwards).
// Receiving chunk s: wait until step[s % D] ≥ s + 1 (an acquire load,
// bounded by wait_geq), read the slot, then add 1 to the sender's credit
// after a system fence (every thread's reads of the slot are done at the
// block barrier before it). Credits are added, not set, so that two
// credits arriving out of order still count both.
//
// A kernel that puts ends with `nvshmem_quiet`, since the sources of its
// last puts (user memory) may change once it ends.
#pragma once
#include <nvshmem.h>
#include <nvshmemx.h>
#include <cstdint>
#include "abi.cuh"
#include "prims/simple.cuh"
#include "core/team_sync.cuh"

namespace shmem {
namespace k {

// Where this PE is among the rails, and the heap offsets of the pipes'
// state (every PE alike).
struct Rail {
    const TeamSync &t;
    uint64_t base;  // heap offset of the rail region
    int L;          // members a node
    int N;          // nodes
    int node;       // this PE's node (a)
    int rail;       // this PE's local rank (i)

    __device__ Rail(const TeamSync &team, const RailOp &op)
        : t(team),
          base(op.rail),
          L(op.per_node),
          N(team.n / op.per_node),
          node(team.rank / op.per_node),
          rail(team.rank % op.per_node) {}

    // The member on node `a` of this PE's rail, and member `k` of this node.
    __device__ int on_node(int a) const { return a * L + rail; }
    __device__ int local(int k) const { return node * L + k; }

    __device__ uint64_t words() const { return static_cast<uint64_t>(kRailChannels) * N; }
    __device__ uint64_t step_off(int ch, int from, uint64_t slot) const {
        return base + ((static_cast<uint64_t>(ch) * N + from) * kRailDepth + slot) * 8;
    }
    __device__ uint64_t credit_off(int ch, int to) const {
        return base + (words() * kRailDepth + static_cast<uint64_t>(ch) * N + to) * 8;
    }
    __device__ uint64_t sent_off(int ch, int to) const {
        return base + (words() * (kRailDepth + 1) + static_cast<uint64_t>(ch) * N + to) * 8;
    }
    __device__ uint64_t taken_off(int ch, int from) const {
        return base + (words() * (kRailDepth + 2) + static_cast<uint64_t>(ch) * N + from) * 8;
    }
    // The buffers, after the words (rounded up to kStateAlign). A PE's
    // inbox has a row a node but its own: `other` of node `x` seen from
    // node `self`.
    __device__ uint64_t buffers() const {
        return base + (words() * (kRailDepth + 3) * 8 + kStateAlign - 1) / kStateAlign * kStateAlign;
    }
    __device__ static int other(int x, int self) { return x > self ? x - 1 : x; }
    __device__ uint64_t inbox_off(int ch, int from, int at, uint64_t slot) const {
        return buffers() + ((static_cast<uint64_t>(ch) * (N - 1) + other(from, at)) * kRailDepth + slot) * kRailChunk;
    }
    __device__ uint64_t outbox_off(int ch, int to, uint64_t slot) const {
        const uint64_t inboxes = static_cast<uint64_t>(kRailChannels) * (N - 1) * kRailDepth * kRailChunk;
        return buffers() + inboxes +
               ((static_cast<uint64_t>(ch) * (N - 1) + other(to, node)) * kRailDepth + slot) * kRailChunk;
    }
};

// The put of one chunk to member `m` (whole block) and the credit to it
// (one thread), out of line (one copy a .cu) on plain values as the RMA
// calls of core/team_sync.cuh are; counted in this PE's NetCounters as
// `rma_put_signal` and `rma_signal` count (rail peers are always on
// other nodes).
static __device__ __noinline__ void rail_put_signal_out(NetCounters *c, int pe, void *dst, const void *src,
                                                        uint64_t bytes, uint64_t *word, uint64_t v) {
    count_rma(threadIdx.x == 0 ? c : nullptr, false, bytes, 1);
    nvshmemx_putmem_signal_nbi_block(dst, src, bytes, word, v, NVSHMEM_SIGNAL_SET, pe);
}
static __device__ __noinline__ void rail_credit_out(NetCounters *c, int pe, uint64_t *word) {
    if (c) atomicAdd(&c->signals, 1ull);
    nvshmemx_signal_op(word, 1, NVSHMEM_SIGNAL_ADD, pe);
}
__device__ __forceinline__ void rail_put_signal(const TeamSync &t, int m, void *dst, const void *src, uint64_t bytes,
                                                uint64_t *word, uint64_t v) {
    rail_put_signal_out(remote_counters(t, m), t.pes[m], dst, src, bytes, word, v);
}
__device__ __forceinline__ void rail_credit(const TeamSync &t, int m, uint64_t *word) {
    rail_credit_out(remote_counters(t, m), t.pes[m], word);
}

// The next chunk's sequence number on the pipe to node `to` (whole block;
// thread 0 waits): once the receiver has freed its slot.
__device__ __forceinline__ uint64_t rail_credit_wait(const Rail &r, int ch, int to) {
    __shared__ uint64_t seq;
    __syncthreads();
    if (threadIdx.x == 0) {
        const uint64_t s = *r.t.mine<uint64_t>(r.sent_off(ch, to));
        if (s + 1 > kRailDepth) wait_geq(r.t.mine<uint64_t>(r.credit_off(ch, to)), s + 1 - kRailDepth);
        seq = s;
    }
    __syncthreads();
    return seq;
}

// The outbox slot of the next chunk to node `to`, free to be filled (whole
// block); send it with `rail_send`.
template <typename U> __device__ __forceinline__ U *rail_outbox(const Rail &r, int ch, int to) {
    const uint64_t s = rail_credit_wait(r, ch, to);
    return r.t.mine<U>(r.outbox_off(ch, to, s % kRailDepth));
}

// Sends `bytes` (1 .. kRailChunk) at `src`, this PE's symmetric memory
// (its outbox, or a checked region), as the next chunk to node `to`
// (whole block). Every thread's earlier writes of `src` are fenced at
// system scope first, so that the transfer (a copy engine, a NIC, or
// NVLink stores by this block) reads them.
__device__ __forceinline__ void rail_send(const Rail &r, int ch, int to, const void *src, uint64_t bytes) {
    __threadfence_system();
    const uint64_t s = rail_credit_wait(r, ch, to);
    const uint64_t slot = s % kRailDepth;
    rail_put_signal(r.t, r.on_node(to), r.t.mine<void>(r.inbox_off(ch, r.node, to, slot)), src, bytes,
                    r.t.mine<uint64_t>(r.step_off(ch, r.node, slot)), s + 1);
    __syncthreads();
    if (threadIdx.x == 0) *r.t.mine<uint64_t>(r.sent_off(ch, to)) = s + 1;
}

// The next chunk from node `from` (whole block; thread 0 waits, bounded):
// its inbox slot, to read until `rail_release`.
template <typename U> __device__ __forceinline__ const U *rail_wait(const Rail &r, int ch, int from) {
    __shared__ uint64_t seq;
    __syncthreads();
    if (threadIdx.x == 0) {
        const uint64_t s = *r.t.mine<uint64_t>(r.taken_off(ch, from));
        wait_geq(r.t.mine<uint64_t>(r.step_off(ch, from, s % kRailDepth)), s + 1);
        seq = s;
    }
    __syncthreads();
    return r.t.mine<const U>(r.inbox_off(ch, from, r.node, seq % kRailDepth));
}

// Frees the slot `rail_wait` gave, once every thread of the block is done
// reading it (whole block).
__device__ __forceinline__ void rail_release(const Rail &r, int ch, int from) {
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t *taken = r.t.mine<uint64_t>(r.taken_off(ch, from));
        // The block's reads of the slot (done at the barrier) before the
        // credit that lets the sender overwrite it.
        __threadfence_system();
        rail_credit(r.t, r.on_node(from), r.t.mine<uint64_t>(r.credit_off(ch, r.node)));
        *taken = *taken + 1;
    }
}

// A barrier of this block's channel among this node's members only, on
// signal array `array`: every earlier store and load of this block before
// every node peer's block of the channel goes on. Node peers are reached
// over NVLink (the node-aware forms are not taken under forced RMA).
__device__ __forceinline__ void node_exchange(const Rail &r, int array, uint64_t epoch) {
    __syncthreads();
    for (int k = threadIdx.x; k < r.L; k += blockDim.x) {
        const int pe = r.local(k);
        if (pe == r.t.rank) continue;
        signal(r.t, array, pe, epoch);
        wait_geq(r.t.word(array, blockIdx.x, pe), epoch);
    }
    __syncthreads();
}

// The start of a node-aware kernel's block: its epoch, and a barrier of
// the node on the channel (every node peer has entered the call before
// any NVLink store reaches it). `rail_finish` ends it.
__device__ __forceinline__ uint64_t rail_start(const Rail &r) {
    const uint64_t epoch = begin_epoch(r.t);
    node_exchange(r, Arrive, epoch);
    return epoch;
}

// The end of a node-aware kernel's block: its puts complete (their
// sources may change once the kernel ends), then a barrier of the node
// on the channel, so that every node peer's writes into this PE and
// reads of its source are done when its kernel ends.
__device__ __forceinline__ void rail_finish(const Rail &r, uint64_t epoch) {
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
    node_exchange(r, Depart, epoch);
    end_epoch(r.t, epoch);
}

// The heap offsets of this PE's and its node peers' copies of `off`, as
// destination pointers for `block_copy_pairs` (in shared memory, whole
// block): this PE's own first unless `skip_own`.
__device__ __forceinline__ int node_dsts(const Rail &r, uint8_t **dsts, uint64_t off, bool skip_own) {
    __shared__ int nd;
    __syncthreads();
    if (threadIdx.x == 0) {
        int n = 0;
        if (!skip_own) dsts[n++] = r.t.mine<uint8_t>(off);
        for (int k = 0; k < r.L; k++) {
            const int pe = r.local(k);
            if (pe != r.t.rank) dsts[n++] = r.t.at<uint8_t>(pe, off);
        }
        nd = n;
    }
    __syncthreads();
    return nd;
}

// Bytes [lo, hi) of `bytes` that part `p` of `parts` takes, in whole
// 16-byte units except at the end.
__device__ __forceinline__ Range rail_bytes(uint64_t bytes, uint64_t p, uint64_t parts) {
    Range r = split((bytes + 15) / 16, p, parts);
    return {min(r.lo * 16, bytes), min(r.hi * 16, bytes)};
}

}  // namespace k
}  // namespace shmem
