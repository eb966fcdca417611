// The flat MoE layer's route over many blocks (the ranks): a part of
// moe/layer.cu, included by it where these functions stand in its order,
// inside its namespaces (it uses that file's helpers above it).
#pragma once

// ---- The flat form's route over many blocks ----
//
// Where its top-k and experts a PE fit (kRankTopK, kRankKeys; not the
// node-aware form), the flat form routes each side over many blocks
// instead of the one-block route (whose one SM walks every token, or
// every staged row, twice): `shmem_moe_rank` (the count), then
// `shmem_moe_stamp`, in the phase `MoeLayer::phase` names; or both in one
// launch, `shmem_moe_rank_stamp`, where every block of its grid can be
// resident at once (its blocks wait for the last one's layout). A block takes a
// chunk of kRankChunk items, one a thread: in phase 0 tokens, keyed by
// their destination PEs; in phase 1 one source's staged rows (each
// source's rows in chunks of their own), keyed by their local experts.
// Each block ranks its items among its own items of each key, in order
// (`rank_block`).
//  - The count: each block's totals per key into the scratch; the grid's
//    last block to finish lays out. Phase 0: the splits (rank-major, each
//    destination's rows in token order; a bad routing's marker instead).
//    Phase 1: the view's expert blocks (each source's rows in PE order,
//    each block padded to major_align) and the arrivals' new epoch. Both:
//    each chunk's first row of each key.
//  - The stamp: the same ranks again, each plus its chunk's first row of
//    its key: phase 0 each slot's wire row (`slot_rows`), phase 1 each
//    staged slot's row in the view, over its expert (what the one-block
//    route writes).
static_assert(kRankTopK == kRouteFastSlots, "the ranked route checks tokens in registers");
static_assert(kRankChunk == kBlockThreads, "the ranked route takes an item a thread");

// The ranked route's scratch (`MoeLayer::scratch`, zeroed at allocation):
// the blocks done of each phase's count (never reset: a launch's last
// block is the one whose count makes a multiple of the grid), the fault
// word (the complement of the lowest fault code seen, as the one-block
// route keeps the lowest; 0 for none; the last block reads and clears
// it), each phase's last layout (`shmem_moe_rank_stamp`: the launches of
// the phase so far, when its last block has laid out), then per (chunk,
// key) the chunk's total and its first row, for the larger phase's n ×
// chunks chunks of ne keys.
struct RankScratch {
    unsigned long long *done, *fault, *laid;
    uint32_t *total, *first;
};
__device__ __forceinline__ RankScratch rank_scratch(const TeamSync &t, const MoeLayer &m) {
    auto *words = t.mine<unsigned long long>(m.scratch);
    const int64_t table = (m.max_tokens + kRankChunk - 1) / kRankChunk * t.n * m.ne;
    uint32_t *total = reinterpret_cast<uint32_t *>(words + 5);
    return RankScratch{words, words + 2, words + 3, total, total + table};
}

// A block's items ranked among its own items of each of `keys` keys,
// in thread order: a ballot a warp and key, then each key's warps before.
struct RankBlock {
    uint32_t mask[kBlockThreads / 32][kRankKeys];
    uint32_t before[kBlockThreads / 32][kRankKeys];
    uint32_t total[kRankKeys];
};
// The ranked route's shared memory: the ranks, and the last block's
// tables. Declared by its kernels (shared memory declared in the
// functions here would count against other kernels at the link).
struct RankShared {
    RankBlock r;
    int64_t expert_rows[kRankKeys];
    unsigned long long fault;
    uint32_t dest_rows[kMaxTeam];
    unsigned long long launch;  // the phase's launches so far, this one's among them
    bool last;
};

// Every thread, with its item's keys (a bit a key).
__device__ void rank_block(RankBlock &r, uint64_t mine, int keys) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int k = 0; k < keys; k++) {
        const uint32_t b = __ballot_sync(0xffffffffu, mine >> k & 1);
        if (lane == 0) r.mask[warp][k] = b;
    }
    __syncthreads();
    for (int k = threadIdx.x; k < keys; k += blockDim.x) {
        uint32_t sum = 0;
        for (int w = 0; w < warps; w++) {
            r.before[w][k] = sum;
            sum += __popc(r.mask[w][k]);
        }
        r.total[k] = sum;
    }
    __syncthreads();
}

// This thread's item's rank among the block's items of key `k`.
__device__ __forceinline__ uint32_t rank_of(const RankBlock &r, int k) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    return r.before[warp][k] + __popc(r.mask[warp][k] & ((1u << lane) - 1));
}

// Phase 0's item: this thread's token, checked (its destinations in `d`),
// or none past the count.
struct RankToken {
    int d[kRouteFastSlots];
    uint64_t keys;
    unsigned long long fault;  // ~0 when none
    bool live;
};
__device__ __forceinline__ RankToken rank_token(const TeamSync &t, const MoeLayer &m, int64_t nt) {
    RankToken x{};
    x.fault = ~0ull;
    const int64_t tok = static_cast<int64_t>(blockIdx.x) * kRankChunk + threadIdx.x;
    x.live = tok < nt;
    if (!x.live) return x;
    x.fault = token_dests(m, t.mine<int64_t>(m.ids), t.mine<float>(m.weights), tok, t.n * m.ne, x.d);
#pragma unroll
    for (int j = 0; j < kRouteFastSlots; j++)
        if (x.fault == ~0ull && x.d[j] >= 0) x.keys |= 1ull << x.d[j];
    return x;
}

// Phase 1's item: this thread's staged row of its block's source and
// chunk (`chunks` a source), its slots' local experts, or none.
struct RankRow {
    WireSlot *slots;
    int32_t e[kRouteFastSlots];
    uint64_t keys;
    int source;
};
__device__ __forceinline__ RankRow rank_row(const TeamSync &t, const MoeLayer &m) {
    const int64_t *so = t.mine<int64_t>(m.stage_so);
    const int chunks = gridDim.x / t.n;
    RankRow x{};
    x.source = blockIdx.x / chunks;
    const int64_t r = static_cast<int64_t>(blockIdx.x % chunks) * kRankChunk + threadIdx.x;
    if (r >= so[x.source]) return x;
    x.slots = wire_slots(t.mine<uint8_t>(m.stage) + (so[t.n + x.source] + r) * m.stride, m);
#pragma unroll
    for (int j = 0; j < kRouteFastSlots; j++) x.e[j] = j < m.top_k ? x.slots[j].at : -1;
#pragma unroll
    for (int j = 0; j < kRouteFastSlots; j++)
        if (x.e[j] >= 0 && x.e[j] < m.ne) x.keys |= 1ull << x.e[j];
    return x;
}

// Phase 0's layout, by the count's last block: the splits (or the
// routing's fault) and each chunk's first wire row of each destination.
__device__ void rank_lay_rows(const TeamSync &t, const MoeLayer &m, const RankScratch &x, RankShared &sh) {
    const int n = t.n, chunks = gridDim.x;
    int64_t *splits = t.mine<int64_t>(m.send_splits);
    int64_t *state = t.mine<int64_t>(m.state);
    unsigned long long &fault = sh.fault;
    uint32_t *dest_rows = sh.dest_rows;
    if (threadIdx.x == 0) fault = atomicExch(x.fault, 0ull);
    for (int d = threadIdx.x; d < n; d += blockDim.x) {
        uint32_t sum = 0;
        for (int c = 0; c < chunks; c++) sum += __ldcg(x.total + c * n + d);
        dest_rows[d] = sum;
    }
    __syncthreads();
    if (fault != 0) {
        // The splits carry the fault to every PE (see kRouteBad); nothing is sent.
        for (int d = threadIdx.x; d < n; d += blockDim.x) splits[d] = d == 0 ? kRouteBad - static_cast<int64_t>(~fault) : 0;
        if (threadIdx.x == 0) {
            state[0] = -1;
            t.mine<int64_t>(m.stage_so)[0] = -1;
        }
        return;
    }
    for (int d = threadIdx.x; d < n; d += blockDim.x) {
        uint32_t at = 0;
        for (int i = 0; i < d; i++) at += dest_rows[i];
        for (int c = 0; c < chunks; c++) {
            x.first[c * n + d] = at;
            at += __ldcg(x.total + c * n + d);
        }
        splits[d] = dest_rows[d];
    }
    if (threadIdx.x == 0) {
        state[0] = *t.mine<int64_t>(m.n_tokens);
        t.mine<int64_t>(m.stage_so)[0] = -1;  // a good exchange overwrites it
    }
}

// Phase 1's layout, by the count's last block: the view's splits and
// offsets (expert-major, each source's rows in PE order, each expert's
// block padded to major_align and at least that long), each chunk's first
// view row of each expert, and the arrivals (the new epoch, the placement
// counters from zero, the pairs that receive nothing marked at once).
__device__ void rank_lay_view(const TeamSync &t, const MoeLayer &m, const RankScratch &x, RankShared &sh) {
    const int n = t.n, ne = m.ne, chunks = gridDim.x / n;
    const int64_t mm = static_cast<int64_t>(ne) * n, a = m.major_align;
    int64_t *view_so = t.mine<int64_t>(m.view_so);
    const ArrivalWords arrivals = arrival_words(t, m);
    const uint64_t epoch = *arrivals.epoch + 1;
    int64_t *expert_rows = sh.expert_rows;
    for (int e = threadIdx.x; e < ne; e += blockDim.x) {
        int64_t sum = 0;
        for (int c = 0; c < n * chunks; c++) sum += __ldcg(x.total + c * ne + e);
        expert_rows[e] = sum;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ne; e += blockDim.x) {
        int64_t at = 0;
        for (int i = 0; i < e; i++) {
            const int64_t len = (expert_rows[i] + a - 1) / a * a;
            at += len > a ? len : a;
        }
        for (int s = 0; s < n; s++) {
            const int64_t start = at;
            for (int c = s * chunks; c < (s + 1) * chunks; c++) {
                x.first[c * ne + e] = static_cast<uint32_t>(at);
                at += __ldcg(x.total + c * ne + e);
            }
            view_so[e * n + s] = at - start;
            view_so[mm + e * n + s] = start;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) *arrivals.epoch = epoch;
    for (int i = threadIdx.x; i < ne * n; i += blockDim.x) {
        arrivals.placed[i] = 0;
        if (view_so[i] == 0) raise_arrival(arrivals.flags + i, epoch);
    }
}

// Phase 0's stamp of this thread's token `tok` (ranked in `r`): each
// slot's wire row.
__device__ __forceinline__ void stamp_token(const TeamSync &t, const MoeLayer &m, const RankScratch &x,
                                            const RankBlock &r, const RankToken &tok) {
    if (!tok.live) return;
    const int64_t tk = (static_cast<int64_t>(blockIdx.x) * kRankChunk + threadIdx.x) * m.top_k;
    int64_t *slot_rows = t.mine<int64_t>(m.slot_rows);
#pragma unroll
    for (int j = 0; j < kRouteFastSlots; j++)
        if (j < m.top_k) slot_rows[tk + j] = __ldcg(x.first + blockIdx.x * t.n + tok.d[j]) + rank_of(r, tok.d[j]);
}

// Phase 1's stamp of this thread's staged row `row` (ranked in `r`):
// each slot's row in the view, over its expert.
__device__ __forceinline__ void stamp_row(const MoeLayer &m, const RankScratch &x, const RankBlock &r,
                                          const RankRow &row) {
    if (row.slots == nullptr) return;
#pragma unroll
    for (int j = 0; j < kRouteFastSlots; j++) {
        if (j >= m.top_k) continue;
        const int e = row.e[j];
        row.slots[j].at =
            e >= 0 && e < m.ne ? static_cast<int32_t>(__ldcg(x.first + blockIdx.x * m.ne + e) + rank_of(r, e)) : -1;
    }
}

// The count (see above). With `kStamp` (`shmem_moe_rank_stamp`, whose
// grid the host keeps to what the GPUs hold at once beside the kernels
// that wait on the arrivals), the stamp too, in the same launch: the
// last block says it has laid out (`laid`), and every block, once it
// has, stamps the items it ranked, from the ranks it still holds. The
// stamp's launch, its loads of the items again and its ranks again go.
template <bool kStamp> __device__ void rank_count(const TeamSync &t, const MoeLayer &m, RankShared &sh) {
    const RankScratch x = rank_scratch(t, m);
    RankBlock &r = sh.r;
    uint64_t keys;
    int nkeys;
    RankToken tok{};
    RankRow row{};
    if (m.phase == 0) {
        const int64_t nt = *t.mine<int64_t>(m.n_tokens);
        const bool count_ok = nt >= 0 && nt <= m.max_tokens;
        // A bad count is fault code 0, the lowest (no token is checked).
        if (!count_ok && blockIdx.x == 0 && threadIdx.x == 0) atomicMax(x.fault, ~0ull);
        tok = rank_token(t, m, count_ok ? nt : 0);
        if (tok.fault != ~0ull) atomicMax(x.fault, ~tok.fault);
        keys = tok.keys;
        nkeys = t.n;
    } else {
        if (staged_rows(t, m) < 0) return;  // every block alike: the exchange failed, nothing is laid out
        row = rank_row(t, m);
        keys = row.keys;
        nkeys = m.ne;
    }
    rank_block(r, keys, nkeys);
    for (int k = threadIdx.x; k < nkeys; k += blockDim.x) x.total[blockIdx.x * nkeys + k] = r.total[k];
    bool &last = sh.last;
    unsigned long long &launch = sh.launch;
    __threadfence();  // the totals (and faults) before the count of blocks done
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned long long before = atomicAdd(x.done + m.phase, 1ull);
        last = (before + 1) % gridDim.x == 0;
        launch = before / gridDim.x + 1;
    }
    __syncthreads();
    if (last) {
        __threadfence();
        phase_mark("counted");
        if (m.phase == 0) {
            rank_lay_rows(t, m, x, sh);
        } else {
            rank_lay_view(t, m, x, sh);
        }
    }
    if constexpr (!kStamp) return;
    __syncthreads();
    if (threadIdx.x == 0) {
        if (last) {
            __threadfence();  // the layout before the word that says it is done
            st_release64(reinterpret_cast<uint64_t *>(x.laid + m.phase), launch);
        } else {
            wait_geq(reinterpret_cast<const uint64_t *>(x.laid + m.phase), launch);
        }
    }
    __syncthreads();
    phase_mark("laid");
    if (m.phase == 0) {
        if (__ldcg(t.mine<int64_t>(m.state)) < 0) return;  // the route failed: nothing is sent
        stamp_token(t, m, x, r, tok);
    } else {
        stamp_row(m, x, r, row);
    }
}

// The stamp (see above), in a launch of its own.
__device__ void rank_stamp(const TeamSync &t, const MoeLayer &m, RankShared &sh) {
    const RankScratch x = rank_scratch(t, m);
    RankBlock &r = sh.r;
    if (m.phase == 0) {
        const int64_t nt = *t.mine<int64_t>(m.state);
        if (nt < 0) return;  // the route failed: nothing is sent
        const RankToken tok = rank_token(t, m, nt);
        rank_block(r, tok.keys, t.n);
        stamp_token(t, m, x, r, tok);
        return;
    }
    if (staged_rows(t, m) < 0) return;
    const RankRow row = rank_row(t, m);
    rank_block(r, row.keys, m.ne);
    stamp_row(m, x, r, row);
}
