// The agreement of an eager collective call, on the device. A call made
// outside graph capture is not checked against its peers' on the host
// (that exchange is a host round trip, and a network one between nodes):
// the host passes the call's descriptor row with the agreement's epoch in
// `TeamSync` (see abi.cuh), and every collective kernel, and the first
// kernel of each MoE all-to-all-v form (moe/a2av.cuh) and of the node-aware
// MoE layer (`shmem_moe_agree`), begins, right after `follow_stream()`,
// with `agree`: block 0 sends this PE's row to
// every member, every block waits for every member's row and compares it
// with its own, and on any difference every block of the kernel returns
// at once, having written nothing and touched no epoch counter, signal
// word or low-latency buffer. Every PE reaches the same verdict (where the
// rows are not all equal, every member sees one that differs from its
// own), so all skip the call or none does, whatever grid each PE's
// arguments chose. A PE whose own arguments failed its checks runs the
// agreement alone (`shmem_agree`) with its error code in its row, so
// that its peers fail too instead of waiting for it.
//
// Its own channel: the kernels' epochs are per block channel, and PEs
// whose arguments differ may run different grids, so no kernel's
// handshake could carry the agreement. Its epoch is the team's count of
// eager calls, kept by the host (`TeamState::agreements`), the same on
// every member; captured kernels pass 0 and skip all of this.
//
// Transport, per peer: over NVLink, a low-latency packet a word (see
// prims/ll.cuh: the data and its flag arrive in one store, no fence); to a
// peer reached through RMA, the row by one put-with-signal, whose signal
// word (the epoch) is set once the row is delivered. Two buffers by epoch
// parity, as the low-latency protocol's: a PE writes a buffer again two
// agreements later, after its agreement of the epoch between heard from
// every member, which each member sent only once its kernel of the epoch
// before (which read the buffer) had ended. A PE that skips the call
// still heard from every member, so this holds after a mismatch too.
#pragma once
#include <cstdint>
#include "prims/ll.cuh"
#include "core/team_sync.cuh"

namespace shmem {
namespace k {

// Word `w` of this PE's row: the kernel parameter read at constant
// indices (a run-time index into a parameter would copy it to local
// memory).
__device__ __forceinline__ uint64_t own_word(const TeamSync &t, int w) {
    uint64_t v = 0;
#pragma unroll
    for (int i = 0; i < kAgreeWords; i++)
        if (i == w) v = t.row[i];
    return v;
}

// The packets' flag of agreement epoch `e`: never 0 (the zeroed state),
// and not the flag of the epoch two before.
__device__ __forceinline__ uint32_t agree_flag(uint64_t e) { return 1 + LL::mod_2_32_minus_1(e); }

// Sends this PE's row of agreement `e` to every peer (whole block 0).
__device__ __forceinline__ void agree_send(const TeamSync &t, uint64_t e) {
    const uint32_t flag = agree_flag(e);
    for (int i = threadIdx.x; i < t.n * kAgreeWords; i += blockDim.x) {
        const int pe = i / kAgreeWords, w = i % kAgreeWords;
        if (pe != t.rank && t.nvlink(pe))
            packet_store(t.at<uint4>(pe, t.agree_packet(e & 1, t.rank, w)), own_word(t, w), flag);
    }
    if (!t.rma) return;
    // The put's source: this PE's own copy of its row's place, which no
    // peer writes.
    uint64_t *mine = t.mine<uint64_t>(t.agree_row(e & 1, t.rank));
    for (int w = threadIdx.x; w < kAgreeWords; w += blockDim.x) mine[w] = own_word(t, w);
    __syncthreads();
    for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x)
        if (pe != t.rank && !t.nvlink(pe))
            rma_put_signal(t, pe, mine, mine, kAgreeWords * 8, t.mine<uint64_t>(t.agree_signal(t.rank)), e);
}

// Member `pe`'s word `w` of agreement `e`, waiting until it is in (one
// thread; traps after kWaitCycles).
__device__ __forceinline__ uint64_t agree_word(const TeamSync &t, uint64_t e, int pe, int w) {
    if (pe == t.rank) return own_word(t, w);
    if (t.nvlink(pe))
        return packet_load(t.mine<uint4>(t.agree_packet(e & 1, pe, w)), agree_flag(e),
                           "a peer's agreement to a collective", pe);
    // The acquire load of the signal orders the row's load after it.
    wait_geq(t.mine<uint64_t>(t.agree_signal(pe)), e);
    return t.mine<const uint64_t>(t.agree_row(e & 1, pe))[w];
}

// Records failed agreement `e` in the host-mapped `AgreeFailure` (whole
// block 0; every member's row is in), unless this PE's own row carries
// an error: that PE has failed the call itself. (Inline: out of line, it
// would take the parameter by value, a copy on the stack.)
__device__ __forceinline__ void agree_report(const TeamSync &t, uint64_t e) {
    if (t.report == 0 || (t.row[kAgreeHeadWord] >> kAgreeErrorShift & 0xff) != 0) return;
    volatile AgreeFailure *r = reinterpret_cast<volatile AgreeFailure *>(t.report);
    __shared__ bool first;
    if (threadIdx.x == 0) first = r->count == 0;
    __syncthreads();
    if (first) {
        for (int i = threadIdx.x; i < t.n * kAgreeWords; i += blockDim.x)
            r->rows[i / kAgreeWords][i % kAgreeWords] = agree_word(t, e, i / kAgreeWords, i % kAgreeWords);
        for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x) r->pes[pe] = t.pes[pe];
        __threadfence_system();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (first) {
            r->epoch = e;
            r->slot = t.sync_offset;
            r->n = t.n;
            r->rank = t.rank;
        }
        r->latest_epoch = e;
        r->latest_slot = t.sync_offset;
        // Everything above (this block's threads' through the barrier and
        // their fences) before the count the host reads first.
        __threadfence_system();
        r->count = r->count + 1;
    }
}

// Whether every member's row of agreement `e` equals this PE's, once all
// are in (whole block; a barrier). Compared: every word of the rows but
// the per-PE one, the error code included, so that a PE whose own
// arguments were bad fails its peers.
__device__ __forceinline__ bool rows_agree(const TeamSync &t, uint64_t e) {
    bool differs = false;
    for (int i = threadIdx.x; i < t.n * kAgreeWords; i += blockDim.x) {
        const int pe = i / kAgreeWords, w = i % kAgreeWords;
        differs |= w != kAgreePrivateWord && agree_word(t, e, pe, w) != own_word(t, w);
    }
    return !__syncthreads_or(differs);
}

// Whether every member made this call (whole block, every block of the
// kernel; at once where `t.agree` is 0).
__device__ __forceinline__ bool agree(const TeamSync &t) {
    if (t.agree == 0) return true;
    const uint64_t e = t.agree;
    if (blockIdx.x == 0) agree_send(t, e);
    if (rows_agree(t, e)) return true;
    if (blockIdx.x == 0) agree_report(t, e);
    return false;
}

}  // namespace k
}  // namespace shmem
