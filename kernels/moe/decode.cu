// The decode form of `MoeAllToAll` (shmem/src/moe/layer.rs): a dispatch
// and a combine of one kernel each, for a team whose members are all
// reached over NVLink, at most kDecodeMaxTokens tokens a PE, a top-k of at
// most kDecodeMaxTopK and at most kDecodeMaxExperts experts a PE. The
// exchange form (moe/layer.cu) runs a one-block route kernel, a gather, a
// 1D all-to-all-v and a second route and gather; here no kernel waits on
// another's splits and nothing is routed by one block alone.
//
// The dispatch (phase 0). Every block routes all of this PE's tokens in
// shared memory (each token's destination PEs, its rank among this PE's
// tokens for each, and each slot's rank among this PE's slots of its
// expert). Block 0 tells every member at once what it will receive
// (`info`: its rows, and its rows of each of the member's experts, or the
// routing fault; then `ready` and its count of itself done, behind one
// fence), so that the members can lay their views out while the rows are
// on the way; it sends no row, so that nothing delays that (but where a
// block quantizes a piece: `decode_sender`). Every other block stores its
// share of the tokens' pieces (a warp a piece; in the FP8 format
// quantized once) straight into each destination's staging at row `this
// PE × max_tokens + rank` (the exchange form packs the sources' rows;
// here each source has its own run), with the wire row's metadata: the
// token field also
// names, above kDecodeRowShift, this PE's wire row for that destination,
// where the combine's partial comes back, and each slot its local expert
// and rank (`e | rank << 8`), and counts itself done at every member
// (`data`, a release add). Each block then lays the view out from the
// members' `info` (rows per expert and source, where each expert's block
// and each source's run in it start: a few hundred words, the same in
// every block, so no block waits on another's layout; each writes the
// view's splits and offsets), waits until every member's blocks are all
// done, and places its share of the staged rows into the
// view, a warp a piece of a row, each slot's view row its run's start plus
// the rank the source sent, counting the arrivals as the exchange form
// does.
//
// The combine (phase 1). Each warp weighs and sums its share of the
// staged rows' experts' outputs and stores each partial straight into its
// source's `send` at the wire row the metadata names; each block counts itself
// done at every member and, once every member's blocks are, sums its
// share of this PE's tokens as the exchange form's source phase does.
//
// Reuse. A PE stores into a member's staging or `send` only once that
// member has begun the same operation: each PE says so at every member as
// its kernel begins (`start`), and by then everything it did with them
// before has ended (stream order). `info` comes in two, by the
// operation's parity: every operation waits for every member's blocks,
// so a member that writes one again has seen this PE done with it (this
// PE reads it before the end of the operation that wrote it). The
// operations of the two phases share one counter; each member's `data`
// grows by the operation's grid (`DecodeOp`): the dispatch's leaves SMs
// to the kernels that wait on its arrivals, the combine may take them
// all (`Kernels::decode_blocks`).
//
// In lines. Where the team is the world over NVLink, no GPU is shared and
// what a PE sends fits the low-latency buffers (`MoeLayer::lines`, chosen
// on the host by size), either phase sends its rows or partials in
// 128-byte lines instead (`decode_dispatch_lines`, the native format
// only; `decode_combine_lines`): each line's flag is its arrival, so no
// start signal, fence or count of blocks is waited for, and the buffers
// are reused as the low-latency collectives reuse them. Neither is an
// operation of the words above.
//
// Failures. Eager calls agree on the device first (core/agree.cuh); where they
// do not, nothing is written and the layer's state says the dispatch
// failed. A bad routing: the source stores no row and sends its fault's
// marker (`kRouteBad - code`) as its `info`'s rows; every member, seeing one,
// writes nothing into the view, poisons `stage_so` so that the combine
// writes nothing either, and records the fault for the host as the
// exchange form's check does (class NegativeSplit, entry 0 of the PE's
// splits), so the next call fails on every PE naming the PE and the fault.
#include "moe/layer_rows.cuh"
#include "prims/lines.cuh"

namespace shmem {
namespace k {

static_assert(kDecodeMaxTopK == kRouteFastSlots, "the decode route keeps a token's slots in registers");
static_assert(kDecodeMaxTokens <= kBlockThreads, "the decode route takes a token a thread");
static_assert(kDecodeMaxExperts <= 32, "a row's local experts are a 32-bit mask");
static_assert(kDecodeMaxTokens <= 256, "a slot's rank in its expert's rows from one source is a byte");

__device__ __forceinline__ void red_release_add64(uint64_t *p, uint64_t v) {
    asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// A fence, then strong relaxed writes: each write after the fence releases
// what the thread (and, through a barrier before, its block) stored before
// it, as a release would, and two such writes wait for one fence, not one
// each.
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void st_relaxed64(uint64_t *p, uint64_t v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void red_relaxed_add64(uint64_t *p, uint64_t v) {
    asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// The block whose share of a grid-wide split of work this block takes:
// block 0 takes the last share, since it also tells the members what
// this PE sends them.
__device__ __forceinline__ uint32_t decode_share() {
    return blockIdx.x == 0 ? gridDim.x - 1 : blockIdx.x - 1;
}

// The senders of wire rows where warps send them (`decode_send_warps`):
// every block but block 0, which tells the members what this PE sends
// them and counts itself done with the same release (`decode_tell`),
// behind no row of its own. (`decode_send`, for a quantized hidden size
// of other than whole 4-element steps, quantizes a block a piece, and a
// block fewer would take another round of rows: there block 0 takes the
// last share, and counts itself done after it.)
__device__ __forceinline__ uint32_t decode_sender() { return blockIdx.x - 1; }
__device__ __forceinline__ uint32_t decode_senders() { return gridDim.x - 1; }

// The decode form's words (`MoeLayer::decode`, `decode_words` in abi.rs),
// after the head (the operation counter, the count of blocks done with
// it, then the blocks of every operation so far): per member `s`,
// `start` (the operation `s` has begun), `data` (blocks of `s` done
// sending this PE their rows or partials, over every operation), `ready`
// (the last dispatch whose `info` `s` has stored here), then two `info`
// records of 1 + ne words a member (the rows `s`
// sends this PE in a dispatch, or its fault's marker; then its rows of
// each of this PE's experts).
struct DecodeWords {
    const TeamSync &t;
    uint64_t base;
    int ne;
    __device__ uint64_t *word(int pe, int i) const {
        const uint64_t off = base + static_cast<uint64_t>(i) * 8;
        return pe == t.rank ? t.mine<uint64_t>(off) : t.at<uint64_t>(pe, off);
    }
    __device__ uint64_t *op() const { return word(t.rank, 0); }
    __device__ unsigned int *done() const { return reinterpret_cast<unsigned int *>(word(t.rank, 1)); }
    __device__ uint64_t *blocks() const { return word(t.rank, 2); }
    // Member `pe`'s word about member `s`.
    __device__ uint64_t *start(int pe, int s) const { return word(pe, kDecodeHeadWords + s); }
    __device__ uint64_t *data(int pe, int s) const { return word(pe, kDecodeHeadWords + t.n + s); }
    __device__ uint64_t *ready(int pe, int s) const { return word(pe, kDecodeHeadWords + 2 * t.n + s); }
    // By the operation's parity: a member writes it again two operations
    // later, after every member's blocks were done with the one between,
    // so after this PE read it. Word 0 the rows, word 1 + e expert e's.
    __device__ uint64_t *info(int pe, int s, uint64_t op, int x) const {
        const int record = static_cast<int>(op & 1) * t.n + s;
        return word(pe, kDecodeHeadWords + 3 * t.n + record * (1 + ne) + x);
    }
};

// An operation: its number, and how many blocks of each member will have
// counted themselves done at this PE once every member's blocks are done
// with it (`data`: the blocks of every operation so far, this one's
// grid's among them). The combine's grid may differ from the dispatch's
// (`Kernels::decode_blocks`), so the count is a sum, not a product; every
// member runs the same operations on the same grids, so the sums agree.
struct DecodeOp {
    uint64_t op, blocks;
};

// This operation (every block reads the counters as it starts; the last
// block done advances them, `decode_end`), after block 0 has told every
// member that this PE began it. A dispatch's token count and arrival
// epoch are loaded beside it, by other warps, into `n_tokens` and `epoch`
// (shared memory; null in the combine).
__device__ DecodeOp decode_begin(const DecodeWords &w, const MoeLayer &m, int64_t *n_tokens, uint64_t *epoch) {
    __shared__ DecodeOp op;
    if (threadIdx.x == 0) op.op = *w.op() + 1;
    if (threadIdx.x == 96) op.blocks = *w.blocks() + gridDim.x;
    if (n_tokens != nullptr && threadIdx.x == 32) *n_tokens = *w.t.mine<int64_t>(m.n_tokens);
    if (epoch != nullptr && threadIdx.x == 64) *epoch = *arrival_words(w.t, m).epoch + 1;
    __syncthreads();
    const DecodeOp o = op;
    // Nothing to release: this PE's kernels before this one have ended,
    // their loads of what the members may now overwrite done.
    if (blockIdx.x == 0)
        for (int pe = threadIdx.x; pe < w.t.n; pe += blockDim.x)
            if (pe != w.t.rank) *reinterpret_cast<volatile uint64_t *>(w.start(pe, w.t.rank)) = o.op;
    return o;
}

// The block is done with operation `o`: the last block of the grid
// advances the counters (and stores `epoch` into `epoch_word`, if any).
__device__ void decode_end(const DecodeWords &w, const DecodeOp &o, uint64_t *epoch_word, uint64_t epoch) {
    __syncthreads();
    if (threadIdx.x != 0) return;
    __threadfence();
    if (atomicAdd(w.done(), 1u) != gridDim.x - 1) return;
    *w.done() = 0;
    if (epoch_word != nullptr) *epoch_word = epoch;
    *w.blocks() = o.blocks;
    *w.op() = o.op;
}

// One thread: waits until member `d` has begun operation `op`, once a
// block (`begun`: the members seen so far, in shared memory).
__device__ __forceinline__ void wait_begun(const DecodeWords &w, int d, uint64_t op, unsigned long long *begun) {
    if (d == w.t.rank || (*reinterpret_cast<volatile unsigned long long *>(begun) >> d & 1)) return;
    wait_geq(w.start(w.t.rank, d), op);
    atomicOr(begun, 1ull << d);
}

// The block has stored everything it sends this operation: one more
// block done at every member (release: the block's stores, before the
// barrier, come first).
__device__ __forceinline__ void decode_done(const DecodeWords &w) {
    __syncthreads();
    for (int pe = threadIdx.x; pe < w.t.n; pe += blockDim.x) red_release_add64(w.data(pe, w.t.rank), 1);
}

// Waits (whole block) until every member's blocks are done with `o`.
__device__ __forceinline__ void decode_wait(const DecodeWords &w, const DecodeOp &o) {
    for (int s = threadIdx.x; s < w.t.n; s += blockDim.x) wait_geq(w.data(w.t.rank, s), o.blocks);
    __syncthreads();
}

// This PE's tokens, routed (in shared memory, the same in every block).
struct DecodeRoute {
    int8_t dest[kDecodeMaxTokens][kDecodeMaxTopK];  // each slot's destination PE, -1 past top_k
    int16_t rank[kDecodeMaxTokens][kDecodeMaxTopK];  // the token's rank among this PE's tokens for it
    uint8_t slot_rank[kDecodeMaxTokens][kDecodeMaxTopK];  // the slot's rank among this PE's slots of its expert
    // Each warp's tokens of each expert of the team (a bit a lane), then
    // the warps' tokens of it before; the PE's tokens of each expert.
    uint32_t expert_warps[kDecodeMaxTokens / 32][kDecodeMaxPairs];
    uint16_t expert_count[kDecodeMaxPairs];
    int32_t count[kMaxTeam];  // rows to each member
    int32_t first[kMaxTeam];  // where each member's rows start among this PE's wire rows
    uint16_t warp_count[kDecodeMaxTokens / 32][kMaxTeam];  // then each warp's tokens' first rank
    unsigned long long fault;  // the first bad slot's code (0: a bad token count), ~0 if none
};

// The route's tables from zero (whole block), before the barrier of
// `decode_begin`.
__device__ __forceinline__ void decode_route_zero(const TeamSync &t, const MoeLayer &m, DecodeRoute &r) {
    const int experts = t.n * m.ne;
    for (int i = threadIdx.x; i < kDecodeMaxTokens / 32 * experts; i += blockDim.x)
        r.expert_warps[i / experts][i % experts] = 0;
}

// The least of the warp's faults (each lane's, ~0 for none).
__device__ __forceinline__ unsigned long long warp_min_fault(unsigned long long fault) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        const unsigned long long other = __shfl_xor_sync(~0u, fault, o);
        fault = other < fault ? other : fault;
    }
    return fault;
}

// Routes at most 32 tokens (`decode_route`'s tables and result) in the
// first warp alone, a lane a token, with one block barrier: the fault a
// warp's minimum, the ranks and counts from ballots and the first warp's
// row of the experts' masks. (The block-wide route takes five barriers,
// on the path of a decode step's every token.)
__device__ int64_t decode_route_warp(const TeamSync &t, const MoeLayer &m, DecodeRoute &r, int64_t nt,
                                     const TokenSlots &slots) {
    const int n = t.n, lane = threadIdx.x % 32;
    const int experts = n * m.ne;
    if (threadIdx.x < 32) {
        int d[kDecodeMaxTopK];
        unsigned long long fault = ~0ull;
        uint64_t mask = 0;
        if (lane < nt) {
            fault = check_token(m, slots, lane, experts, d);
#pragma unroll
            for (int j = 0; j < kDecodeMaxTopK; j++)
                if (d[j] >= 0) {
                    mask |= 1ull << d[j];
                    atomicOr(&r.expert_warps[0][slots.g[j]], 1u << lane);
                }
        } else {
#pragma unroll
            for (int j = 0; j < kDecodeMaxTopK; j++) d[j] = -1;
        }
        fault = warp_min_fault(fault);
        __syncwarp();  // every lane's experts in the masks
        if (fault == ~0ull) {
            const unsigned below_me = (1u << lane) - 1;
            int rank[kDecodeMaxTopK];
            int at = 0;
            for (int pe = 0; pe < n; pe++) {
                const unsigned b = __ballot_sync(~0u, mask >> pe & 1);
                if (lane == 0) {
                    r.count[pe] = __popc(b);
                    r.first[pe] = at;
                }
                at += __popc(b);
#pragma unroll
                for (int j = 0; j < kDecodeMaxTopK; j++)
                    if (d[j] == pe) rank[j] = __popc(b & below_me);
            }
            for (int g = lane; g < experts; g += 32) r.expert_count[g] = static_cast<uint16_t>(__popc(r.expert_warps[0][g]));
            if (lane < nt)
#pragma unroll
                for (int j = 0; j < kDecodeMaxTopK; j++) {
                    r.dest[lane][j] = static_cast<int8_t>(d[j]);
                    r.rank[lane][j] = static_cast<int16_t>(d[j] >= 0 ? rank[j] : 0);
                    r.slot_rank[lane][j] =
                        static_cast<uint8_t>(d[j] >= 0 ? __popc(r.expert_warps[0][slots.g[j]] & below_me) : 0);
                }
        }
        if (lane == 0) r.fault = fault;
    }
    __syncthreads();
    return r.fault != ~0ull ? -1 : nt;
}

// Routes at most 32 slots (`nt × top_k`; `decode_route`'s tables and
// result) in the first warp, a lane a slot, with one block barrier: a
// slot's id and weight from its token's thread, checked as `check_token`
// checks them (a token's first bad slot, the least fault), a repeated id
// and each slot's rank among this PE's slots of its expert from the
// lanes that share its id, each token's rank for a member from the
// ballot of the slots that go there. (A lane a token takes one lane
// through every slot of the token, one after another.)
__device__ int64_t decode_route_slots(const TeamSync &t, const MoeLayer &m, DecodeRoute &r, int64_t nt,
                                      const TokenSlots &slots) {
    const int n = t.n, k = m.top_k, lane = threadIdx.x % 32;
    const int experts = n * m.ne;
    if (threadIdx.x < 32) {
        const int tok = lane / k, j = lane - tok * k;
        const bool live = tok < nt;
        int64_t g = -1;
        float x = 0.0f;
#pragma unroll
        for (int q = 0; q < kDecodeMaxTopK; q++) {
            const int64_t gq = __shfl_sync(~0u, slots.g[q], tok);
            const float xq = __shfl_sync(~0u, slots.x[q], tok);
            if (q == j) {
                g = gq;
                x = xq;
            }
        }
        const unsigned below_me = (1u << lane) - 1, token_lanes = ((1u << k) - 1) << (tok * k);
        // The lanes of this PE's slots with this slot's id (ids that are
        // not slots', one lane each).
        const unsigned same = __match_any_sync(~0u, live ? g : -1ll - lane);
        const bool repeated = (same & token_lanes & below_me) != 0;
        unsigned long long fault =
            live ? slot_fault(g, x, repeated, experts, static_cast<unsigned long long>(lane) + 1) : ~0ull;
        // A token's first bad slot counts (`check_token` stops there).
        if ((__ballot_sync(~0u, fault != ~0ull) & token_lanes & below_me) != 0) fault = ~0ull;
        fault = warp_min_fault(fault);
        if (fault == ~0ull) {
            const int d = live ? dest_of(g, m.ne) : -1;
            int rank = 0, at = 0;
            for (int pe = 0; pe < n; pe++) {
                // The tokens with a slot for `pe`, a bit each.
                const unsigned b = __ballot_sync(~0u, d == pe);
                unsigned toks = 0;
                for (int q = 0; q < nt; q++) toks |= (b >> (q * k) & ((1u << k) - 1)) != 0 ? 1u << q : 0;
                if (lane == 0) {
                    r.count[pe] = __popc(toks);
                    r.first[pe] = at;
                }
                at += __popc(toks);
                if (d == pe) rank = __popc(toks & ((1u << tok) - 1));
            }
            for (int e = lane; e < experts; e += 32) r.expert_count[e] = 0;
            __syncwarp();
            if (live) {
                if ((same & below_me) == 0) r.expert_count[g] = static_cast<uint16_t>(__popc(same));
                r.dest[tok][j] = static_cast<int8_t>(d);
                r.rank[tok][j] = static_cast<int16_t>(rank);
                r.slot_rank[tok][j] = static_cast<uint8_t>(__popc(same & below_me));
            }
        }
        if (lane == 0) r.fault = fault;
    }
    __syncthreads();
    return r.fault != ~0ull ? -1 : nt;
}

// Routes this PE's `n_tokens` tokens (whole block; `slots`: thread
// `tok`'s token's, loaded beside the operation's number, the tables
// zeroed before it): the token count, or -1 where it or a token is bad
// (`r.fault` says which). At most 32 slots: `decode_route_slots`; at
// most 32 tokens: `decode_route_warp`.
__device__ int64_t decode_route(const TeamSync &t, const MoeLayer &m, DecodeRoute &r, int64_t n_tokens,
                                const TokenSlots &slots) {
    const int n = t.n, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int tok = threadIdx.x;
    const int experts = n * m.ne;
    const bool counted = n_tokens >= 0 && n_tokens <= m.max_tokens;
    if (counted && n_tokens * m.top_k <= 32) return decode_route_slots(t, m, r, n_tokens, slots);
    if (counted && n_tokens <= 32) return decode_route_warp(t, m, r, n_tokens, slots);
    if (threadIdx.x == 0) r.fault = counted ? ~0ull : 0;
    __syncthreads();
    phase_mark("route_count");
    const int64_t nt = counted ? n_tokens : 0;
    const int holding = static_cast<int>((nt + 31) / 32);  // the warps that hold tokens
    int d[kDecodeMaxTopK];
    uint64_t mask = 0;
    if (tok < nt) {
        const unsigned long long f = check_token(m, slots, tok, experts, d);
        if (f != ~0ull) atomicMin(&r.fault, f);
#pragma unroll
        for (int j = 0; j < kDecodeMaxTopK; j++)
            if (d[j] >= 0) {
                mask |= 1ull << d[j];
                atomicOr(&r.expert_warps[warp][slots.g[j]], 1u << lane);
            }
    }
    __syncthreads();
    phase_mark("route_check");
    if (r.fault != ~0ull) return -1;
    // A slot's rank among the warp's slots of its expert (the experts of
    // a token differ: checked), then the warps' before (below).
    int below_e[kDecodeMaxTopK];
#pragma unroll
    for (int j = 0; j < kDecodeMaxTopK; j++)
        below_e[j] = tok < nt && d[j] >= 0 ? __popc(r.expert_warps[warp][slots.g[j]] & ((1u << lane) - 1)) : 0;
    // A token's rank for each destination: a ballot a member over each
    // warp's tokens, then the warps before.
    int below[kDecodeMaxTopK];
    for (int pe = 0; pe < n; pe++) {
        const unsigned b = __ballot_sync(~0u, mask >> pe & 1);
        if (warp < kDecodeMaxTokens / 32 && lane == 0) r.warp_count[warp][pe] = static_cast<uint16_t>(__popc(b));
#pragma unroll
        for (int j = 0; j < kDecodeMaxTopK; j++)
            if (tok < nt && d[j] == pe) below[j] = __popc(b & ((1u << lane) - 1));
    }
    __syncthreads();
    if (threadIdx.x < n) {
        int sum = 0;
        for (int w = 0; w < holding; w++) {
            const int c = r.warp_count[w][threadIdx.x];
            r.warp_count[w][threadIdx.x] = static_cast<uint16_t>(sum);
            sum += c;
        }
        r.count[threadIdx.x] = sum;
    }
    for (int g = threadIdx.x; g < experts; g += blockDim.x) {
        uint32_t sum = 0;
        for (int w = 0; w < holding; w++) {
            const uint32_t c = __popc(r.expert_warps[w][g]);
            r.expert_warps[w][g] = sum;
            sum += c;
        }
        r.expert_count[g] = static_cast<uint16_t>(sum);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int at = 0;
        for (int pe = 0; pe < n; pe++) {
            r.first[pe] = at;
            at += r.count[pe];
        }
    }
    if (tok < nt)
#pragma unroll
        for (int j = 0; j < kDecodeMaxTopK; j++) {
            r.dest[tok][j] = static_cast<int8_t>(d[j]);
            r.rank[tok][j] = static_cast<int16_t>(d[j] >= 0 ? r.warp_count[warp][d[j]] + below[j] : 0);
            r.slot_rank[tok][j] =
                static_cast<uint8_t>(d[j] >= 0 ? r.expert_warps[warp][slots.g[j]] + below_e[j] : 0);
        }
    __syncthreads();
    return nt;
}

// This PE's wire rows: what the combine's source phase reads (block 0):
// each slot's wire row, the rows to each member, the token count.
__device__ void decode_source_state(const TeamSync &t, const MoeLayer &m, const DecodeRoute &r, int64_t nt) {
    int64_t *slot_rows = t.mine<int64_t>(m.slot_rows);
    for (int64_t s = threadIdx.x; s < nt * m.top_k; s += blockDim.x) {
        const int tok = static_cast<int>(s) / m.top_k, j = static_cast<int>(s) - tok * m.top_k;
        const int d = r.dest[tok][j];
        slot_rows[s] = r.first[d] + r.rank[tok][j];
    }
    for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x) t.mine<int64_t>(m.send_splits)[pe] = r.count[pe];
    if (threadIdx.x == 0) t.mine<int64_t>(m.state)[0] = nt;
}

// The metadata of token `tok`'s `k` wire rows `rows` (to members
// `dests`; token fields `fields`), by threads `i0, i0 + step, …`: the
// token field, and each slot's local expert and its rank among this PE's
// slots of that expert (`e | rank << 8`) where the slot goes to the row's
// member, -1 where it goes to another, with its weight.
__device__ __forceinline__ void decode_row_meta(const TeamSync &t, const MoeLayer &m, const DecodeRoute &r,
                                                int64_t tok, uint8_t *const *rows, const int64_t *fields,
                                                const int *dests, int k, int i0, int step) {
    const int64_t *ids = t.mine<int64_t>(m.ids);
    const float *w = t.mine<float>(m.weights);
    for (int i = i0; i < k; i += step) *wire_token(rows[i], m) = fields[i];
    for (int i = i0; i < k * m.top_k; i += step) {
        const int q = i / m.top_k, j = i % m.top_k;
        const int e = static_cast<int>(ids[tok * m.top_k + j] % m.ne);  // checked
        const int at = r.dest[tok][j] == dests[q] ? e | r.slot_rank[tok][j] << 8 : -1;
        wire_slots(rows[q], m)[j] = WireSlot{at, w[tok * m.top_k + j]};
    }
}

// Stores this block's share of the tokens' pieces into their destinations'
// staging, with the metadata (as the exchange form's gather does, a block
// a piece of a token, loaded once and stored into each destination's row;
// in the FP8 format quantized once).
__device__ void decode_send(const TeamSync &t, const MoeLayer &m, const DecodeWords &dw, const DecodeRoute &r,
                            int64_t nt, uint64_t op, unsigned long long *begun) {
    const int64_t chunk = m.fp8 == kFp8Quantize ? kLayerQuantChunk : kLayerChunkBytes;
    const int64_t chunks = pieces_of(nt, m.data_bytes, chunk);
    __shared__ uint8_t *rows[kDecodeMaxTopK], *dsts[kDecodeMaxTopK];
    __shared__ float *scales[kDecodeMaxTopK];
    __shared__ int row_dest[kDecodeMaxTopK];
    __shared__ int64_t row_field[kDecodeMaxTopK];
    __shared__ const uint8_t *src[1];
    __shared__ int nrows;
    for (int64_t unit = decode_share(); unit < nt * chunks; unit += gridDim.x) {
        const int64_t tok = unit / chunks, c = unit % chunks;
        const Range b = piece_bytes(m.data_bytes, c, chunks, chunk);
        const uint8_t *token = t.mine<uint8_t>(m.tokens + tok * m.data_bytes + b.lo);
        const HeldPiece held = hold_piece(token, b.hi - b.lo, m.fp8 == 0);
        __syncthreads();  // the piece before is done with the tables
        if (threadIdx.x == 0) {
            uint64_t seen = 0;
            int k = 0;
            for (int j = 0; j < m.top_k; j++) {
                const int d = r.dest[tok][j];
                if (seen >> d & 1) continue;
                seen |= 1ull << d;
                const int rank = r.rank[tok][j];
                const uint64_t off = m.stage + (static_cast<uint64_t>(t.rank) * m.max_tokens + rank) * m.stride;
                rows[k] = d == t.rank ? t.mine<uint8_t>(off) : t.at<uint8_t>(d, off);
                dsts[k] = rows[k] + b.lo;
                scales[k] = reinterpret_cast<float *>(rows[k] + m.scales_at);
                row_field[k] = static_cast<int64_t>(r.first[d] + rank) << kDecodeRowShift | tok;
                row_dest[k++] = d;
            }
            nrows = k;
            src[0] = token;
        }
        __syncthreads();
        const int k = nrows;
        if (threadIdx.x < k) wait_begun(dw, row_dest[threadIdx.x], op, begun);
        __syncthreads();
        if (m.fp8 != 0) {
            gather_fp8(t, m, tok, rows, scales, k, b);  // the FP8 format's data bytes are its codes
        } else {
            put_piece(held, dsts, src, k, b.hi - b.lo, true);  // wire rows: 16-byte aligned
        }
        if (c == 0) decode_row_meta(t, m, r, tok, rows, row_field, row_dest, k, threadIdx.x, blockDim.x);
    }
}

// A warp: `bytes` at `src` into each of the `n` rows `dsts`, loaded once
// (16-byte vectors where every pointer allows: the held ones stored, the
// rest four a lane at once, so that their trips to memory overlap).
__device__ __forceinline__ void warp_copy_to(const WarpHeld &h, uint8_t *const *dsts, int n, const uint8_t *src,
                                             uint64_t bytes) {
    const int lane = threadIdx.x % 32;
    uint64_t align = reinterpret_cast<uint64_t>(src) | bytes;
    for (int k = 0; k < n; k++) align |= reinterpret_cast<uint64_t>(dsts[k]);
    if (align % 16 == 0 && h.ok) {
        const uint4 *s = reinterpret_cast<const uint4 *>(src);
        const uint64_t nv = bytes / 16;
        for (int k = 0; k < n; k++)
#pragma unroll
            for (int u = 0; u < kWarpHeld; u++)
                if (lane + 32 * u < nv) reinterpret_cast<uint4 *>(dsts[k])[lane + 32 * u] = h.x[u];
        uint64_t v = lane + 32 * kWarpHeld;
        for (; v + 96 < nv; v += 128) {
            uint4 x[4];
#pragma unroll
            for (int u = 0; u < 4; u++) x[u] = s[v + 32 * u];
            for (int k = 0; k < n; k++)
#pragma unroll
                for (int u = 0; u < 4; u++) reinterpret_cast<uint4 *>(dsts[k])[v + 32 * u] = x[u];
        }
        for (; v < nv; v += 32) {
            const uint4 x = s[v];
            for (int k = 0; k < n; k++) reinterpret_cast<uint4 *>(dsts[k])[v] = x;
        }
        return;
    }
    for (uint64_t i = lane; i < bytes; i += 32) {
        const uint8_t x = src[i];
        for (int k = 0; k < n; k++) dsts[k][i] = x;
    }
}

// Whether `decode_send_warps` sends this dispatch's rows: the native
// format, and the FP8 one but for quantizing a hidden size of other than
// whole 4-element steps (`warp_quantize`), which `decode_send` takes.
__device__ __forceinline__ bool decode_sends_by_warp(const MoeLayer &m) {
    return m.fp8 != kFp8Quantize || m.hidden % 4 == 0;
}

// Each warp's unit of `decode_send_warps`: its rows, where its piece goes
// in them, their members and token fields (in the entry kernel's shared
// memory, `DecodeShared`).
struct DecodeSendTables {
    uint8_t *rows[kBlockThreads / 32][kDecodeMaxTopK], *dsts[kBlockThreads / 32][kDecodeMaxTopK];
    int row_dest[kBlockThreads / 32][kDecodeMaxTopK];
    int64_t row_field[kBlockThreads / 32][kDecodeMaxTopK];
};

// `decode_send` a warp a piece of a token (`decode_sends_by_warp`), in
// the wire format `kFormat` (`MoeLayer::fp8`; an instance each, so that
// the native one's loads are placed as if the others were not there):
// the token's distinct destinations a lane a slot, gathered in slot
// order into the warp's tables; the piece loaded once and stored into
// each destination's row (in the FP8 format quantized once, or the
// caller's codes, and with the first piece its scales); then the rows'
// metadata. Pieces are whole 512-byte steps (`warp_pieces`), so whole
// scale groups.
template <int kFormat>
__device__ void decode_send_warps(const TeamSync &t, const MoeLayer &m, const DecodeWords &dw, const DecodeRoute &r,
                                  int64_t nt, uint64_t op, unsigned long long *begun, DecodeSendTables &tb) {
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, warps = blockDim.x / 32;
    const int64_t groups = (m.hidden + kQuantGroup - 1) / kQuantGroup;
    const WarpPieces wp = warp_pieces(nt, m.data_bytes, static_cast<int64_t>(decode_senders()) * warps);
    const int64_t chunks = wp.pieces;
    auto &rows = tb.rows;
    auto &dsts = tb.dsts;
    auto &row_dest = tb.row_dest;
    auto &row_field = tb.row_field;
    const uint32_t per = static_cast<uint32_t>(chunks);
    for (uint32_t unit = decode_sender() * warps + wid; unit < nt * chunks; unit += decode_senders() * warps) {
        const uint32_t tok = unit / per, c = unit - tok * per;
        const Range b = wp.of(m.data_bytes, c);
        // The native format's bytes, or the caller's FP8 codes (the
        // quantizing sender reads bf16 elements instead: nothing held).
        const uint8_t *src = t.mine<uint8_t>(m.tokens + tok * m.data_bytes + b.lo);
        WarpHeld held{};
        if constexpr (kFormat != kFp8Quantize) held = warp_hold(src, b.hi - b.lo);
        // Slot `lane`: the first of its destination?
        const int d = lane < m.top_k ? r.dest[tok][lane] : -1;
        bool first = d >= 0;
        for (int i = 0; i < lane && i < m.top_k && first; i++) first = r.dest[tok][i] != d;
        const unsigned firsts = __ballot_sync(~0u, first);
        const int k = __popc(firsts);
        __syncwarp();  // the unit before is done with the tables
        if (first) {
            const int q = __popc(firsts & ((1u << lane) - 1)), rank = r.rank[tok][lane];
            const uint64_t off = m.stage + (static_cast<uint64_t>(t.rank) * m.max_tokens + rank) * m.stride;
            rows[wid][q] = d == t.rank ? t.mine<uint8_t>(off) : t.at<uint8_t>(d, off);
            dsts[wid][q] = rows[wid][q] + b.lo;
            row_field[wid][q] = static_cast<int64_t>(r.first[d] + rank) << kDecodeRowShift | tok;
            row_dest[wid][q] = d;
            wait_begun(dw, d, op, begun);
        }
        __syncwarp();
        if constexpr (kFormat == kFp8Quantize) {
            WarpRows w{};
            w.k = k;
#pragma unroll
            for (int q = 0; q < kDecodeMaxTopK; q++) w.row[q] = q < k ? rows[wid][q] : nullptr;
            warp_quantize(w, m, t.mine<__nv_bfloat16>(m.tokens + tok * m.hidden * 2), b);
        } else {
            warp_copy_to(held, dsts[wid], k, src, b.hi - b.lo);
        }
        if (kFormat == kFp8PreQuantized && c == 0) {
            const float *given = t.mine<float>(m.token_scales + tok * groups * 4);
            for (int64_t i = lane; i < k * groups; i += 32)
                reinterpret_cast<float *>(rows[wid][i / groups] + m.scales_at)[i % groups] = given[i % groups];
        }
        if (c == 0) decode_row_meta(t, m, r, tok, rows[wid], row_field[wid], row_dest[wid], k, lane, 32);
    }
}

// The staged rows, packed source-major, and the view's layout (in shared
// memory, the same in every block), from the members' `info`.
struct DecodeView {
    int32_t first[kMaxTeam + 1];  // where each source's rows start, packed; then the total
    uint32_t pair[kDecodeMaxPairs];  // rows of each (local expert, source), entry e × n + s
    int32_t run[kDecodeMaxPairs];  // where each (local expert, source)'s run starts in the view
    int32_t block_start[kDecodeMaxExperts];  // where each expert's block starts in the view
};

// The source of packed staged row `r`, and its row in the staging.
__device__ __forceinline__ int decode_source(const DecodeView &v, int n, int64_t r) {
    int s = 0;
    while (s + 1 < n && r >= v.first[s + 1]) s++;
    return s;
}
__device__ __forceinline__ int64_t decode_staged(const DecodeView &v, const MoeLayer &m, int s, int64_t r) {
    return static_cast<int64_t>(s) * m.max_tokens + r - v.first[s];
}

// The view's layout (whole block) from the rows of each (expert, source)
// (`v.pair`, as the members' `info` said): the experts' blocks
// (expert-major, each source's rows in PE order, each in token order,
// padded to major_align) and where each (expert, source) run starts.
// Every block writes the view's splits and offsets (the same words).
__device__ void decode_layout(const TeamSync &t, const MoeLayer &m, DecodeView &v) {
    const int n = t.n, ne = m.ne, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (warp == 0) {
        // A lane an expert (at most 32): its block's length, padded, then
        // where each starts (a warp's scan).
        const uint32_t a = static_cast<uint32_t>(m.major_align);
        uint32_t len = 0;
        if (lane < ne)
            for (int s = 0; s < n; s++) len += v.pair[lane * n + s];
        len = (len + a - 1) / a * a;
        len = lane < ne ? (len > a ? len : a) : 0;
        const uint32_t incl = warp_inclusive_sum(len);
        if (lane < ne) v.block_start[lane] = static_cast<int32_t>(incl - len);
    }
    __syncthreads();
    int64_t *view_so = t.mine<int64_t>(m.view_so);
    const int64_t pairs = static_cast<int64_t>(ne) * n;
    for (int i = threadIdx.x; i < ne * n; i += blockDim.x) {
        const int e = i / n, s = i % n;
        int32_t at = v.block_start[e];
        for (int q = 0; q < s; q++) at += static_cast<int32_t>(v.pair[e * n + q]);
        v.run[i] = at;
        view_so[i] = v.pair[i];
        view_so[pairs + i] = at;
    }
    __syncthreads();
}

// Places this block's units (a piece of a staged row each), a warp a
// unit, into the view rows of its slots (the FP8 format's codes as
// one-byte elements, their scales, and where asked their bf16 values),
// and counts them placed for the arrival flags. A slot's view row is its
// (expert, source) run's start plus the rank its source sent; the warp of
// a row's first piece records them for the combine (`m.views`).
__device__ void decode_place(const TeamSync &t, const MoeLayer &m, const DecodeView &v, const WarpPieces &wp,
                             const ArrivalWords &arrivals, uint64_t epoch) {
    const int64_t pieces = wp.pieces;
    const int n = t.n, lane = threadIdx.x % 32, wid = threadIdx.x / 32, warps = blockDim.x / 32;
    const int64_t units = v.first[n] * pieces;
    __shared__ uint8_t *dsts[kBlockThreads / 32][kDecodeMaxTopK];
    __shared__ int32_t dst_rows[kBlockThreads / 32][kDecodeMaxTopK];
    const uint8_t *stage = t.mine<uint8_t>(m.stage);
    int32_t *views = t.mine<int32_t>(m.views);
    const uint64_t view = m.fp8 == 0 ? m.recv : m.recv_codes;
    const int64_t groups = (m.hidden + kQuantGroup - 1) / kQuantGroup;
    const uint32_t per = static_cast<uint32_t>(pieces);
    for (uint32_t w = decode_share() * warps + wid; w < units; w += gridDim.x * warps) {
        const uint32_t r = w / per, c = w - r * per;
        const int s = decode_source(v, n, r);
        const Range b = wp.of(m.data_bytes, c);
        const int64_t staged = decode_staged(v, m, s, r);
        const uint8_t *row = stage + staged * m.stride;
        const WarpHeld held = warp_hold(row + b.lo, b.hi - b.lo);
        // The unit's view rows, a lane a slot, gathered in slot order into
        // the warp's tables (in shared memory: not the stack).
        const int32_t slot = lane < m.top_k ? reinterpret_cast<const WireSlot *>(row + m.meta + 8)[lane].at : -1;
        const int e = slot >= 0 ? slot & 0xff : -1;
        const int32_t a = e >= 0 ? v.run[e * n + s] + (slot >> 8) : -1;
        if (c == 0 && lane < m.top_k) views[staged * m.top_k + lane] = a;
        const unsigned has = __ballot_sync(~0u, a >= 0);
        const int k = __popc(has);
        __syncwarp();  // the unit before is done with the tables
        if (a >= 0) {
            const int q = __popc(has & ((1u << lane) - 1));
            dst_rows[wid][q] = a;
            dsts[wid][q] = t.mine<uint8_t>(view + a * m.data_bytes) + b.lo;
        }
        __syncwarp();
        const int32_t *at = dst_rows[wid];
        warp_copy_to(held, dsts[wid], k, row + b.lo, b.hi - b.lo);
        if (m.fp8 != 0) {
            // The piece's scale groups into every view row, and with
            // `dequantize` the bf16 values of its codes.
            const uint64_t g0 = b.lo / kQuantGroup, ng = (b.hi + kQuantGroup - 1) / kQuantGroup - g0;
            const float *scales = reinterpret_cast<const float *>(row + m.scales_at);
            float *out = t.mine<float>(m.recv_scales);
            for (uint64_t i = lane; i < k * ng; i += 32)
                out[at[i / ng] * groups + g0 + i % ng] = scales[g0 + i % ng];
            if (m.dequantize)
                for (int q = 0; q < k; q++) {
                    __nv_bfloat16 *x = t.mine<__nv_bfloat16>(m.recv + at[q] * m.hidden * 2);
                    for (uint64_t i = b.lo + lane; i < b.hi; i += 32)
                        x[i] = dequantize_one<__nv_bfloat16>(row[i], scales[i / kQuantGroup]);
                }
        }
        // The piece is in every block it goes to (the warp's stores before
        // each count, which releases them): count it for each pair.
        __syncwarp();
        if (e >= 0) count_placed(arrivals, e * n + s, v.pair[e * n + s] * per, epoch);
    }
}

// Records source `s`'s routing fault (its `marker`) for the host, as the
// exchange form's check records a bad split, naming its world PE (one
// thread; `pe`: member `s`'s).
__device__ void decode_report(const MoeLayer &m, int pe, int64_t marker) {
    if (m.error == 0) return;
    volatile A2avError *e = reinterpret_cast<volatile A2avError *>(m.error);
    if (e->count == 0) {
        e->code = static_cast<unsigned long long>(NegativeSplit) << kA2avErrClassShift |
                  static_cast<unsigned long long>(A2avV) << kA2avErrKindShift |
                  static_cast<unsigned long long>(pe) << kA2avErrPeShift;
        e->value = marker;
        e->limit = static_cast<unsigned long long>(m.max_tokens) * (m.top_k < 64 ? m.top_k : 64);
    }
    __threadfence_system();
    e->count = e->count + 1;
}

// The view from what every member sends (whole block, after the members'
// rows `sent`, or their faults' markers, and their rows of each expert,
// `v.pair`, are in shared memory): where each source's rows start, this
// PE's `stage_so` (what the combine reads), the layout, and the empty
// pairs' arrivals. False where a member's routing failed: then nothing is
// laid out, `stage_so` is poisoned and the first such member's fault
// recorded (block 0).
__device__ bool decode_view(const TeamSync &t, const MoeLayer &m, DecodeView &v, const int64_t *sent,
                            const ArrivalWords &arrivals, uint64_t epoch) {
    __shared__ int bad_source;
    const int n = t.n, ne = m.ne;
    __syncthreads();
    if (threadIdx.x == 0) {
        bad_source = -1;
        int32_t at = 0;
        for (int s = 0; s < n; s++) {
            v.first[s] = at;
            if (sent[s] < 0 && bad_source < 0) bad_source = s;
            at += sent[s] < 0 ? 0 : static_cast<int32_t>(sent[s]);
        }
        v.first[n] = at;
    }
    __syncthreads();
    phase_mark("ready");
    int64_t *stage_so = t.mine<int64_t>(m.stage_so);
    if (bad_source >= 0) {
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            stage_so[0] = -1;
            decode_report(m, t.pes[bad_source], sent[bad_source]);
        }
        return false;
    }
    if (blockIdx.x == 0)
        for (int s = threadIdx.x; s < n; s += blockDim.x) {
            stage_so[s] = v.first[s + 1] - v.first[s];
            stage_so[n + s] = v.first[s];
        }
    // Every block writes the view's splits and offsets as it lays them
    // out (the same words), so that its own rows' arrival flags release
    // them: no block waits for another's layout.
    decode_layout(t, m, v);
    // The pairs that receive nothing have arrived.
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < ne * n; i += blockDim.x)
            if (v.pair[i] == 0) raise_arrival(arrivals.flags + i, epoch);
    phase_mark("layout");
    return true;
}

// Block 0: tells every member what this PE sends it in operation `op`
// (its rows, or its routing fault's marker; its rows of each of the
// member's experts), then, behind one fence, that it has (`ready`) and,
// where `done` (block 0 sends no wire row), that block 0 is done sending
// (`data`). The fence also puts this PE's placement counters, from zero,
// ahead of its count of itself done: a block places only once every block
// of this PE has counted itself done.
__device__ void decode_tell(const TeamSync &t, const MoeLayer &m, const DecodeWords &dw, const DecodeRoute &r,
                            int64_t nt, uint64_t op, const ArrivalWords &arrivals, bool done) {
    const int n = t.n, ne = m.ne;
    const int64_t marker = kRouteBad - static_cast<int64_t>(r.fault);
    for (int i = threadIdx.x; i < n * (1 + ne); i += blockDim.x) {
        const int pe = i / (1 + ne), x = i % (1 + ne);
        int64_t v = 0;
        if (nt < 0) {
            v = x == 0 ? marker : 0;
        } else {
            v = x == 0 ? r.count[pe] : r.expert_count[pe * ne + x - 1];
        }
        *dw.info(pe, t.rank, op, x) = static_cast<uint64_t>(v);
    }
    for (int i = threadIdx.x; i < ne * n; i += blockDim.x) arrivals.placed[i] = 0;
    __syncthreads();
    for (int pe = threadIdx.x; pe < n; pe += blockDim.x) {
        fence_acq_rel_sys();
        st_relaxed64(dw.ready(pe, t.rank), op);
        if (done) red_relaxed_add64(dw.data(pe, t.rank), 1);
    }
}

// The dispatch's tables, in the entry kernel's shared memory: declared
// in the functions it calls, nvlink also counted them against other
// kernels of the image (shmem_a2av_move, shmem_moe_gather), past their
// 48 KiB.
struct DecodeShared {
    DecodeRoute route;
    DecodeView view;
    DecodeSendTables send;
    int64_t n_tokens;  // as the dispatch began
    uint64_t epoch;  // the dispatch's arrival epoch
};

// Phase 0: the dispatch (see the top of the file), from its beginning:
// each thread's token's slots are loaded, and the route's tables zeroed,
// beside the operation's number.
__device__ void decode_dispatch(const TeamSync &t, const MoeLayer &m, const DecodeWords &dw, DecodeShared &sh) {
    DecodeRoute &route = sh.route;
    DecodeView &view = sh.view;
    __shared__ unsigned long long begun;
    __shared__ int64_t sent[kMaxTeam];
    const int n = t.n, ne = m.ne;
    TokenSlots slots;
    if (static_cast<int64_t>(threadIdx.x) < m.max_tokens)
        slots = load_token(m, t.mine<int64_t>(m.ids), t.mine<float>(m.weights), threadIdx.x);
    decode_route_zero(t, m, route);
    if (threadIdx.x == 0) begun = 0;
    const DecodeOp o = decode_begin(dw, m, &sh.n_tokens, &sh.epoch);
    const uint64_t op = o.op;
    phase_mark("begin");
    const int64_t nt = decode_route(t, m, route, sh.n_tokens, slots);
    phase_mark("route");
    // Block 0 sends no row where the warps send them (`decode_sender`).
    const bool teller = blockIdx.x == 0, told_done = decode_sends_by_warp(m);
    if (teller) {
        decode_tell(t, m, dw, route, nt, op, arrival_words(t, m), told_done);
        if (nt >= 0) {
            decode_source_state(t, m, route, nt);
        } else if (threadIdx.x == 0) {
            t.mine<int64_t>(m.state)[0] = -1;
        }
        phase_mark("tell");
    }
    if (nt > 0 && !told_done) {
        decode_send(t, m, dw, route, nt, op, &begun);
    } else if (nt > 0 && !teller) {
        if (m.fp8 == 0) {
            decode_send_warps<0>(t, m, dw, route, nt, op, &begun, sh.send);
        } else if (m.fp8 == kFp8Quantize) {
            decode_send_warps<kFp8Quantize>(t, m, dw, route, nt, op, &begun, sh.send);
        } else {
            decode_send_warps<kFp8PreQuantized>(t, m, dw, route, nt, op, &begun, sh.send);
        }
    }
    if (!teller || !told_done) decode_done(dw);
    phase_mark("send");
    // What each member sends: its rows (where they go in the packed
    // order, or the first member's fault) and its rows of each expert.
    for (int i = threadIdx.x; i < n * (1 + ne); i += blockDim.x) {
        const int s = i / (1 + ne), x = i % (1 + ne);
        wait_geq(dw.ready(t.rank, s), op);
        const uint64_t v = *reinterpret_cast<volatile uint64_t *>(dw.info(t.rank, s, op, x));
        if (x == 0) {
            sent[s] = static_cast<int64_t>(v);
        } else {
            view.pair[(x - 1) * n + s] = static_cast<uint32_t>(v);
        }
    }
    const ArrivalWords arrivals = arrival_words(t, m);
    const uint64_t epoch = sh.epoch;
    if (!decode_view(t, m, view, sent, arrivals, epoch)) {
        decode_wait(dw, o);
        decode_end(dw, o, nullptr, 0);
        return;
    }
    decode_wait(dw, o);
    phase_mark("wait");
    decode_place(t, m, view, warp_pieces(view.first[n], m.data_bytes), arrivals, epoch);
    phase_mark("place");
    decode_end(dw, o, arrivals.epoch, epoch);
}

#include "moe/decode_combine.cuh"

// Both phases (after `follow_stream`): the agreement of an eager call,
// then the operation.
template <typename T> __device__ __forceinline__ void moe_decode(const TeamSync &t, const MoeLayer &m, DecodeShared &sh) {
    phase_begin(m.phase == 0 ? "decode_dispatch" : "decode_combine");
    if (!agree(t)) {
        // Every PE skips the call; a dispatch's state says it failed.
        if (m.phase == 0 && blockIdx.x == 0 && threadIdx.x == 0) {
            t.mine<int64_t>(m.state)[0] = -1;
            t.mine<int64_t>(m.stage_so)[0] = -1;
        }
        phase_end();
        return;
    }
    const DecodeWords dw{t, m.decode, m.ne};
    if (m.phase == 0 && m.lines != 0) {
        decode_dispatch_lines(t, m, dw, sh);
    } else if (m.phase == 0) {
        decode_dispatch(t, m, dw, sh);
    } else if (m.lines != 0) {
        decode_combine_lines<T>(t, m);
    } else {
        decode_combine<T>(t, m, dw);
    }
    phase_mark("kernel");
    phase_end();
}

}  // namespace k
}  // namespace shmem

using shmem::k::MoeLayer;
using shmem::k::TeamSync;

#define SHMEM_MOE_DECODE(name, T)                                         \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) \
        shmem_moe_decode_##name(TeamSync t, MoeLayer m) {                 \
        shmem::k::follow_stream();                                        \
        __shared__ shmem::k::DecodeShared sh;                             \
        shmem::k::moe_decode<T>(t, m, sh);                                \
    }
SHMEM_MOE_DECODE(f32, float)
SHMEM_MOE_DECODE(f64, double)
SHMEM_MOE_DECODE(f16, __half)
SHMEM_MOE_DECODE(bf16, __nv_bfloat16)
