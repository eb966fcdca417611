// The device side of `MoeAllToAll` (shmem/src/moe/layer.rs), so that a
// whole MoE step can be captured in a CUDA graph. Around the two 1D
// all-to-all-v exchanges of wire rows (one row per (token, destination
// PE): the token, its index, and per slot the destination's local expert
// or -1 and the weight), each kernel has two phases (`MoeLayer::phase`):
//
// - `shmem_moe_route` (one block). Phase 0, the source: checks the routing
//   (token count, expert ids, repeated ids, weights), counts each token
//   once per destination PE, and gives each (token, destination) its wire
//   row — rank-major, each destination's in token order — in `slot_rows`
//   (every slot of the token bound to that PE shares the row). Phase 1,
//   the receiver: counts the staged rows per (local expert, source), lays
//   the view's expert blocks out with `major_align` padding (`view_so`),
//   and writes over each staged slot's expert its row in the view. In the
//   flat form, where the top-k and the experts a PE fit its masks,
//   `shmem_moe_rank` and `shmem_moe_stamp` (or `shmem_moe_rank_stamp`,
//   both in one launch) do the same over many blocks ("The flat form's
//   route over many blocks" below).
// - `shmem_moe_gather` (many blocks). Phase 0: copies each token into its
//   wire rows and writes their metadata. Phase 1: copies each staged row
//   into the view rows of its slots. A warp a row (or a piece of one)
//   where the top-k fits a warp's registers (`gather_warps`,
//   `place_warps`), else a block a piece.
// - `shmem_moe_combine_<dtype>` (many blocks). Phase 0, the expert side:
//   each staged row becomes the weighted sum of its slots' expert outputs,
//   in slot order, in the accumulator's type, rounded once. Phase 1, the
//   source: each token's partials summed in ascending PE order (ascending
//   wire row), rounded once.
//
// The FP8 format (`MoeLayer::fp8`): the wire row carries `hidden` e4m3
// codes and, at `scales_at`, one f32 scale per kQuantGroup elements; the
// gather quantizes bf16 tokens with moe/quant.cuh (bit for bit the host's
// reference) or copies codes and scales the caller gave; the receiver
// places codes and scales in `recv_codes` / `recv_scales` and, with
// `dequantize`, their bf16 values in `recv`. The combine's partials are
// bf16 rows of `back_stride` bytes in `partials` (the staged rows are too
// short to hold them).
//
// The node-aware form (`nodes.rs`) runs the route and gather twice: over
// the rail (`MoeLayer::origin`: destinations are nodes, `ne` a node's
// experts, the token field carries the source PE), then on the forwarder
// over the node with the rail's staged rows as its tokens
// (`MoeLayer::forward_in`: each row's slots name the node's experts or
// -1); the receiver places rows by the source PE each names
// (`MoeLayer::view_n`), staged by forwarder. Its combine's source phase
// also runs twice: on the forwarder, summing the node's partials of each
// rail row into rows of `out_stride` bytes, then on the source.
//
// An eager call of the node-aware form is agreed over the world first
// (`shmem_moe_agree`): its verdict, in `state[1]`, makes the call's
// exchanges skip (`A2av::skip_if`) on every PE where any PE's call
// differed or failed its host checks; the flat form's one exchange agrees
// on the call itself.
//
// Arrivals (`MoeLayer::arrivals`, `MoeAllToAll::arrivals`): one u64 flag
// per (local expert, source PE of the view), then the epoch word, then a
// placement counter per (local expert, source). The receiver's route
// advances the epoch, zeroes the counters and marks at once the pairs that
// receive no row; the receiver's gather counts each placed row of a pair
// and the block that places its last one stores the epoch in the pair's
// flag, with release semantics, after the rows are written. A kernel on
// another stream can wait on a pair's flag (`shmem::moe_wait_arrival` of
// shmem_device.cuh) and start on those rows while the others still land.
//
// A bad routing poisons the dispatch's first split with a marker (see
// `kRouteBad`), so the exchange's check fails on every PE and the host
// names the PE and the fault. A failed exchange leaves its out splits as
// the kernel before it poisoned them (-1), and every later phase then
// writes nothing.
#include "moe/layer_rows.cuh"

namespace shmem {
namespace k {

// Most (expert, source) pairs whose splits and offsets the receiver's
// gather copies into shared memory (16 KiB).
constexpr int kLayerSharedPairs = 1024;

// The first bad slot of token `tok` (a code for `kRouteBad`), or ~0.
__device__ unsigned long long token_fault(const MoeLayer &m, const int64_t *ids, const float *w, int64_t tok,
                                          int experts) {
    unsigned long long fault = ~0ull;
    for (int j = 0; j < m.top_k && fault == ~0ull; j++) {
        const int64_t s = tok * m.top_k + j, g = ids[s];
        bool repeated = false;
        for (int i = 0; i < j && !repeated; i++) repeated = ids[tok * m.top_k + i] == g;
        fault = slot_fault(g, w[s], repeated, experts, static_cast<unsigned long long>(s) + 1);
    }
    return fault;
}

// Whether slot j of token `tok` (checked) is the first of its destination PE.
__device__ __forceinline__ bool first_of_dest(const MoeLayer &m, const int64_t *ids, int64_t tok, int j) {
    const int d = dest_of(ids[tok * m.top_k + j], m.ne);
    for (int i = 0; i < j; i++)
        if (dest_of(ids[tok * m.top_k + i], m.ne) == d) return false;
    return true;
}

// The forwarder's tokens: the rail stage's rows, whose slots name an
// expert of the node (or -1).
struct ForwardSlots {
    const uint8_t *rows;
    const MoeLayer *m;
    // Slot j of row `tok`'s destination PE in the node, or -1.
    __device__ __forceinline__ int dest(int64_t tok, int j) const {
        const int32_t e = reinterpret_cast<const WireSlot *>(rows + tok * m->stride + m->meta + 8)[j].at;
        return e < 0 ? -1 : e / m->ne;
    }
    __device__ __forceinline__ bool first(int64_t tok, int j) const {
        const int d = dest(tok, j);
        if (d < 0) return false;
        for (int i = 0; i < j; i++)
            if (dest(tok, i) == d) return false;
        return true;
    }
};

// The caller's tokens: their expert ids.
struct IdSlots {
    const int64_t *ids;
    const MoeLayer *m;
    __device__ __forceinline__ int dest(int64_t tok, int j) const { return dest_of(ids[tok * m->top_k + j], m->ne); }
};

// The route kernels' counters in shared memory where they fit, else in
// the layer's scratch in global memory: each owner's counts a key
// (kRouteSharedCounts), the receiver's rows per (expert, source)
// (kRouteSharedPairs).
constexpr int kRouteSharedCounts = 4096, kRouteSharedPairs = 2048;
// The receiver's expert blocks' starts kept in shared memory, at most.
constexpr int kRouteSharedStarts = 256;
__device__ __forceinline__ uint32_t *route_shared() {
    __shared__ uint32_t words[kRouteSharedCounts + kRouteSharedPairs];
    return words;
}

// Owners of `units` pieces of work in a one-block scan: one a thread, as
// many as there are pieces (at least one), so that the serial passes over
// the owners below cost what the work needs (a decode step's one token,
// one owner), not the block's width.
__device__ __forceinline__ int owners_of(int64_t units) {
    return static_cast<int>(units < 1 ? 1 : units < blockDim.x ? units : blockDim.x);
}

// The part of `units` that owner `o` of `owners` takes (nothing past them).
__device__ __forceinline__ Range owned(uint64_t units, int o, int owners) {
    return o < owners ? split(units, o, owners) : Range{0, 0};
}

// Exclusive scan, in place, of `count[key × owners + owner]` over the
// owners of each key, key after key, each starting at `base(key, before)`
// (`before`: the keys before its totals); `total(key, sum)` is told each
// key's total by thread 0 (whole block, owners at most one a thread: a
// scan of the block a key, so that no thread walks the owners one by
// one through global memory).
// Most keys `scan_owners` takes a warp a key (with a warp's worth of
// owners or fewer), and their totals and starts: one array whatever the
// scan's callbacks (a static array in the template would be one for each
// of them).
constexpr int kScanWarpKeys = 256;
struct ScanKeys {
    uint32_t sum[kScanWarpKeys];
    uint64_t before[kScanWarpKeys];
};
__device__ __forceinline__ ScanKeys &scan_keys() {
    __shared__ ScanKeys keys;
    return keys;
}

// `scan_owners` for at most 32 owners and kScanWarpKeys keys: a warp a
// key, the keys' totals first, then their starts (one warp's scan over
// the keys), then each key's owners: three block barriers in all, not
// three a key (what a decode step's few tokens take).
template <typename Base, typename Total>
__device__ void scan_few_owners(uint32_t *count, int keys, int owners, Base base, Total total) {
    uint32_t *key_sum = scan_keys().sum;
    uint64_t *key_before = scan_keys().before;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int key = warp; key < keys; key += warps) {
        const uint32_t x = lane < owners ? count[static_cast<uint64_t>(key) * owners + lane] : 0;
        const uint32_t sum = __reduce_add_sync(0xffffffffu, x);
        if (lane == 0) key_sum[key] = sum;
    }
    __syncthreads();
    if (warp == 0) {
        uint64_t carry = 0;
        for (int k0 = 0; k0 < keys; k0 += 32) {
            const uint64_t x = k0 + lane < keys ? key_sum[k0 + lane] : 0;
            const uint64_t incl = warp_inclusive_sum(x);
            if (k0 + lane < keys) key_before[k0 + lane] = carry + incl - x;
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    __syncthreads();
    for (int key = warp; key < keys; key += warps) {
        uint32_t *c = &count[static_cast<uint64_t>(key) * owners];
        const uint32_t x = lane < owners ? c[lane] : 0;
        const uint32_t incl = warp_inclusive_sum(x);
        const uint64_t start = base(key, key_before[key]);
        if (lane < owners) c[lane] = static_cast<uint32_t>(start + incl - x);
        if (lane == 0) total(key, key_sum[key]);
    }
    __syncthreads();
}

template <typename Base, typename Total>
__device__ void scan_owners(uint32_t *count, int keys, int owners, Base base, Total total) {
    if (owners <= 32 && keys <= kScanWarpKeys) {
        scan_few_owners(count, keys, owners, base, total);
        return;
    }
    __shared__ uint32_t warp_sums[kBlockThreads / 32], key_sum;
    const int o = threadIdx.x, lane = o % 32, warp = o / 32, warps = (owners + 31) / 32;
    uint64_t before = 0;
    for (int key = 0; key < keys; key++) {
        uint32_t *c = &count[static_cast<uint64_t>(key) * owners];
        const uint32_t x = o < owners ? c[o] : 0;
        const uint32_t incl = warp_inclusive_sum(x);
        if (lane == 31) warp_sums[warp] = incl;
        __syncthreads();
        if (warp == 0) {
            const uint32_t own = lane < warps ? warp_sums[lane] : 0;
            const uint32_t w = warp_inclusive_sum(own);
            if (lane < warps) warp_sums[lane] = w - own;  // the warps before's
            if (lane == 31) key_sum = w;
        }
        __syncthreads();
        const uint64_t sum = key_sum;
        const uint64_t start = base(key, before);
        if (o < owners) c[o] = static_cast<uint32_t>(start + warp_sums[warp] + incl - x);
        if (o == 0) total(key, sum);
        before += sum;
        __syncthreads();
    }
}

// Phase 0 of the route: the source's wire rows, from the caller's tokens
// (checked: `ids` and `w`) or, on the forwarder of the node-aware form,
// from the rail's staged rows (`ids` null).
template <typename Slots>
__device__ void route_tokens(const TeamSync &t, const MoeLayer &m, int64_t nt, bool count_ok, Slots slots,
                             const int64_t *ids, const float *w) {
    const int o = threadIdx.x, n = t.n, experts = n * m.ne;
    int64_t *splits = t.mine<int64_t>(m.send_splits);
    int64_t *slot_rows = t.mine<int64_t>(m.slot_rows);
    int64_t *state = t.mine<int64_t>(m.state);
    const int owners = owners_of(count_ok ? nt : 0);
    uint32_t *count = static_cast<int64_t>(n) * owners <= kRouteSharedCounts
                          ? route_shared()
                          : t.mine<uint32_t>(m.scratch);  // [destination][owner]
    const Range mine = owned(count_ok ? static_cast<uint64_t>(nt) : 0, o, owners);
    __shared__ unsigned long long bad;
    if (o == 0) bad = count_ok ? ~0ull : 0;
    if (o < owners)
        for (int d = 0; d < n; d++) count[static_cast<uint64_t>(d) * owners + o] = 0;
    __syncthreads();
    const bool fast = ids != nullptr && m.top_k <= kRouteFastSlots;
    for (uint64_t tok = mine.lo; fast && tok < mine.hi; tok++) {
        int d[kRouteFastSlots];
        const unsigned long long fault = token_dests(m, ids, w, tok, experts, d);
        if (fault != ~0ull) {
            atomicMin(&bad, fault);
            continue;
        }
        uint64_t seen = 0;  // the destinations seen (a bit a PE: kMaxTeam is 64)
#pragma unroll
        for (int j = 0; j < kRouteFastSlots; j++) {
            if (d[j] < 0 || (seen >> d[j] & 1)) continue;
            seen |= 1ull << d[j];
            count[static_cast<uint64_t>(d[j]) * owners + o]++;
        }
    }
    for (uint64_t tok = mine.lo; !fast && tok < mine.hi; tok++) {
        if (ids != nullptr) {
            const unsigned long long fault = token_fault(m, ids, w, tok, experts);
            if (fault != ~0ull) {
                atomicMin(&bad, fault);
                continue;
            }
        }
        // The destinations seen (a bit a PE: kMaxTeam is 64).
        uint64_t seen = 0;
        for (int j = 0; j < m.top_k; j++) {
            const int d = slots.dest(tok, j);
            if (d < 0 || (seen >> d & 1)) continue;
            seen |= 1ull << d;
            count[static_cast<uint64_t>(d) * owners + o]++;
        }
    }
    __syncthreads();
    phase_mark("count");
    if (bad != ~0ull) {
        // A forwarder's failure (its rail's exchange failed) is a plain
        // negative split: the PEs of its node fail with it.
        const int64_t marker = ids != nullptr ? kRouteBad - static_cast<int64_t>(bad) : -1;
        for (int d = o; d < n; d += blockDim.x) splits[d] = d == 0 ? marker : 0;
        if (o == 0) {
            state[0] = -1;
            t.mine<int64_t>(m.stage_so)[0] = -1;
        }
        return;
    }
    // Where each owner's rows for each destination start (the
    // destinations before's rows first), and each destination's total.
    scan_owners(
        count, n, owners, [](int, uint64_t before) { return before; },
        [&](int d, uint64_t sum) { splits[d] = static_cast<int64_t>(sum); });
    phase_mark("scan");
    for (uint64_t tok = mine.lo; fast && tok < mine.hi; tok++) {
        int d[kRouteFastSlots];
        token_dests(m, ids, w, tok, experts, d);  // checked above
        uint64_t seen = 0;
#pragma unroll
        for (int j = 0; j < kRouteFastSlots; j++) {
            if (j >= m.top_k) continue;
            uint32_t *c = &count[static_cast<uint64_t>(d[j]) * owners + o];
            const int64_t s = tok * m.top_k + j;
            if (seen >> d[j] & 1) {
                slot_rows[s] = *c - 1;  // the token's row for d, counted at its first slot for d
            } else {
                seen |= 1ull << d[j];
                slot_rows[s] = *c;
                *c = *c + 1;
            }
        }
    }
    for (uint64_t tok = mine.lo; !fast && tok < mine.hi; tok++) {
        uint64_t seen = 0;
        for (int j = 0; j < m.top_k; j++) {
            const int64_t s = tok * m.top_k + j;
            const int d = slots.dest(tok, j);
            if (d < 0) {
                slot_rows[s] = -1;  // a slot of another node: no row here
                continue;
            }
            uint32_t *c = &count[static_cast<uint64_t>(d) * owners + o];
            if (seen >> d & 1) {
                slot_rows[s] = *c - 1;  // the token's row for d, counted at its first slot for d
            } else {
                seen |= 1ull << d;
                slot_rows[s] = *c;
                *c = *c + 1;
            }
        }
    }
    if (o == 0) {
        state[0] = nt;
        // A good exchange overwrites it.
        t.mine<int64_t>(m.stage_so)[0] = -1;
    }
}

__device__ void route_source(const TeamSync &t, const MoeLayer &m) {
    if (m.forward_in != 0) {
        // The forwarder: the rows its rail staged (from every node, `view_n
        // / n` of them), none where the rail's exchange failed.
        const int64_t *so = t.mine<int64_t>(m.forward_so);
        int64_t rows = 0;
        for (int a = 0; a < m.view_n / t.n; a++) rows += so[a];
        route_tokens(t, m, rows, so[0] >= 0, ForwardSlots{t.mine<uint8_t>(m.forward_in), &m}, nullptr, nullptr);
        return;
    }
    const int64_t *ids = t.mine<int64_t>(m.ids);
    const int64_t nt = *t.mine<int64_t>(m.n_tokens);
    route_tokens(t, m, nt, nt >= 0 && nt <= m.max_tokens, IdSlots{ids, &m}, ids, t.mine<float>(m.weights));
}

// The source PE a staged row names (the node-aware form's token field).
__device__ __forceinline__ int row_origin(const uint8_t *stage, uint64_t r, const MoeLayer &m) {
    return static_cast<int>(static_cast<uint64_t>(*wire_token(const_cast<uint8_t *>(stage) + r * m.stride, m)) >>
                            kOriginShift);
}

// Phase 1 of the route: the receiver's expert blocks. The rows are taken
// in source-major order: the staging order in the flat form; in the
// node-aware form (staged by forwarder, each forwarder's by source) each
// source's run of rows moved to its place (`run_at`, `run_shift`).
__device__ void route_receiver(const TeamSync &t, const MoeLayer &m) {
    const int o = threadIdx.x, ne = m.ne;
    const bool by_origin = m.view_n > 0;
    const int n = by_origin ? m.view_n : t.n;  // the view's sources
    const int64_t total = staged_rows(t, m);
    if (total < 0) return;
    const ArrivalWords arrivals = arrival_words(t, m);
    const uint64_t epoch = *arrivals.epoch + 1;
    const int owners = owners_of(total);
    const int64_t *so = t.mine<int64_t>(m.stage_so);
    int64_t *view_so = t.mine<int64_t>(m.view_so);
    uint32_t *scratch = t.mine<uint32_t>(m.scratch);
    uint32_t *count = static_cast<int64_t>(ne) * owners <= kRouteSharedCounts ? route_shared() : scratch;  // [expert][owner]
    uint32_t *per_source_global = scratch + static_cast<uint64_t>(owners) * (n + ne);
    uint32_t *per_source = static_cast<int64_t>(ne) * n <= kRouteSharedPairs ? route_shared() + kRouteSharedCounts
                                                                             : per_source_global;  // [expert][source]
    // The node-aware form: each source's first row in source-major order,
    // and where its run was staged (both 0 for a source with no rows).
    uint32_t *run_at = per_source_global + static_cast<uint64_t>(ne) * n;
    uint32_t *run_start = run_at + n;
    uint8_t *stage = t.mine<uint8_t>(m.stage);
    const Range mine = owned(static_cast<uint64_t>(total), o, owners);
    if (o < owners)
        for (int e = 0; e < ne; e++) count[static_cast<uint64_t>(e) * owners + o] = 0;
    for (int i = o; i < ne * n; i += blockDim.x) per_source[i] = 0;
    if (by_origin) {
        for (int s = o; s < n; s += blockDim.x) run_at[s] = run_start[s] = 0;
        __syncthreads();
        // Runs: a row whose source differs from the row before starts one;
        // its length goes into run_at for now.
        for (uint64_t r = o; r < static_cast<uint64_t>(total); r += blockDim.x) {
            const int s = row_origin(stage, r, m);
            if (r == 0 || row_origin(stage, r - 1, m) != s) run_start[s] = static_cast<uint32_t>(r);
            if (r + 1 == static_cast<uint64_t>(total) || row_origin(stage, r + 1, m) != s)
                run_at[s] = static_cast<uint32_t>(r + 1);  // the run's end
        }
        __syncthreads();
        if (o == 0) {
            uint32_t at = 0;
            for (int s = 0; s < n; s++) {
                const uint32_t len = run_at[s] > 0 ? run_at[s] - run_start[s] : 0;
                run_at[s] = at;
                at += len;
            }
        }
    }
    __syncthreads();
    // The source of source-major row `v` (from `from` on), and its staged row.
    auto source_of = [&](uint64_t v, int from) {
        int s = from;
        if (by_origin) {
            while (s + 1 < n && v >= run_at[s + 1]) s++;
        } else {
            while (s + 1 < n && v >= static_cast<uint64_t>(so[n + s + 1])) s++;
        }
        return s;
    };
    auto staged_row = [&](uint64_t v, int s) { return by_origin ? v - run_at[s] + run_start[s] : v; };
    // `visit(slots, j, e, s)` for slot j of each owned row, in order
    // (`slots` the row's, `e` its local expert, `s` the row's source):
    // a batch of rows' slots loaded at once, every load in flight
    // together (the rows lie `stride` apart, each its own trip to
    // memory), before the batch is visited.
    auto each_slot = [&](auto visit) {
        constexpr int kRows = 4, kSlots = 8;
        int s = source_of(mine.lo, 0);
        for (uint64_t v0 = mine.lo; v0 < mine.hi; v0 += kRows) {
            WireSlot *rows[kRows];
            int from[kRows];
#pragma unroll
            for (int r = 0; r < kRows; r++) {
                const uint64_t v = v0 + r < mine.hi ? v0 + r : v0;
                s = source_of(v, s);
                from[r] = s;
                rows[r] = wire_slots(stage + staged_row(v, s) * m.stride, m);
            }
            for (int j0 = 0; j0 < m.top_k; j0 += kSlots) {
                int32_t at[kRows][kSlots];
#pragma unroll
                for (int r = 0; r < kRows; r++)
#pragma unroll
                    for (int b = 0; b < kSlots; b++)
                        at[r][b] = v0 + r < mine.hi && j0 + b < m.top_k ? rows[r][j0 + b].at : -1;
#pragma unroll
                for (int r = 0; r < kRows; r++)
#pragma unroll
                    for (int b = 0; b < kSlots; b++)
                        if (v0 + r < mine.hi && j0 + b < m.top_k) visit(rows[r], j0 + b, at[r][b], from[r]);
            }
        }
    };
    each_slot([&](WireSlot *, int, int e, int s) {
        if (e < 0 || e >= ne) return;
        count[static_cast<uint64_t>(e) * owners + o]++;
        atomicAdd(&per_source[e * n + s], 1u);
    });
    __syncthreads();
    phase_mark("count");
    // The blocks: expert-major, each source's chunk in PE order, each
    // block padded to major_align (at least major_align long). Each
    // block's start also in shared memory where they fit, for the scan
    // below (which reads one a key, every thread, one after another).
    __shared__ uint64_t block_start[kRouteSharedStarts];
    const bool starts_shared = ne <= kRouteSharedStarts;
    if (o == 0) {
        const int64_t mm = static_cast<int64_t>(ne) * n, a = m.major_align;
        int64_t at = 0;
        for (int e = 0; e < ne; e++) {
            const int64_t start = at;
            if (starts_shared) block_start[e] = static_cast<uint64_t>(start);
            for (int src = 0; src < n; src++) {
                view_so[e * n + src] = per_source[e * n + src];
                view_so[mm + e * n + src] = at;
                at += per_source[e * n + src];
            }
            const int64_t len = (at - start + a - 1) / a * a;
            at = start + (len > a ? len : a);
        }
    }
    __syncthreads();
    phase_mark("blocks");
    const int64_t mm = static_cast<int64_t>(ne) * n;
    scan_owners(
        count, ne, owners,
        [&](int e, uint64_t) { return starts_shared ? block_start[e] : static_cast<uint64_t>(view_so[mm + e * n]); },
        [](int, uint64_t) {});
    // This dispatch's epoch (every thread read the old one before the
    // barriers above); the placement counters from zero; the pairs that
    // receive nothing have arrived.
    if (o == 0) *arrivals.epoch = epoch;
    for (int i = o; i < ne * n; i += blockDim.x) {
        arrivals.placed[i] = 0;
        if (per_source[i] == 0) raise_arrival(arrivals.flags + i, epoch);
    }
    phase_mark("scan");
    each_slot([&](WireSlot *slots, int j, int e, int) {
        if (e < 0 || e >= ne) {
            slots[j].at = -1;
            return;
        }
        uint32_t *c = &count[static_cast<uint64_t>(e) * owners + o];
        slots[j].at = static_cast<int32_t>(*c);
        *c = *c + 1;
    });
}

#include "moe/layer_rank.cuh"

#include "moe/layer_gather.cuh"
// Phase 0 of the combine: each staged row's partial, a block a chunk of a
// row: its slots' outputs weighed and summed in slot order, in 16-byte
// vectors where the rows allow, the slots in shared memory.
template <typename T> __device__ void combine_experts(const TeamSync &t, const MoeLayer &m) {
    using A = typename Acc<T>::type;
    if (blockIdx.x == 0 && threadIdx.x == 0) t.mine<int64_t>(m.back_so)[0] = -1;  // a good exchange overwrites it
    const int64_t total = staged_rows(t, m);
    if (total < 0) return;
    uint8_t *stage = t.mine<uint8_t>(m.stage);
    const T *outputs = t.mine<T>(m.outputs);
    const int64_t row_bytes = m.hidden * static_cast<int64_t>(sizeof(T)), chunks = pieces_of(total, row_bytes);
    const bool vectors = m.top_k <= kLayerSharedSlots && row_bytes % 16 == 0 && m.back_stride % 16 == 0 &&
                         aligned16(outputs) && aligned16(t.mine<uint8_t>(m.partials));
    __shared__ WireSlot held[kLayerSharedSlots];
    __shared__ int nheld;
    for (int64_t w = blockIdx.x; w < total * chunks; w += gridDim.x) {
        const int64_t r = w / chunks;
        const Range b = piece_bytes(row_bytes, w % chunks, chunks);
        const WireSlot *slots = wire_slots(stage + r * m.stride, m);
        T *partial = t.mine<T>(m.partials + r * m.back_stride);
        if (vectors) {
            __syncthreads();  // the chunk before is done with held
            if (threadIdx.x == 0) {
                int k = 0;
                for (int j = 0; j < m.top_k; j++)
                    if (slots[j].at >= 0) held[k++] = slots[j];
                nheld = k;
            }
            __syncthreads();
            fold_vectors(
                partial, b.lo / 16, b.hi / 16, nheld,
                [&](int i) { return outputs + static_cast<int64_t>(held[i].at) * m.hidden; },
                [&](A acc, int i, A x) { return weigh(acc, held[i].weight, x); });
            continue;
        }
        for (uint64_t h = b.lo / sizeof(T) + threadIdx.x; h < b.hi / sizeof(T); h += blockDim.x) {
            A acc = 0;
            for (int j = 0; j < m.top_k; j++) {
                const WireSlot s = slots[j];
                if (s.at >= 0) acc = weigh(acc, s.weight, to_acc(outputs[static_cast<int64_t>(s.at) * m.hidden + h]));
            }
            partial[h] = from_acc<T>(acc);
        }
    }
}

// Phase 1 of the combine: each token's partials in ascending PE order, a
// block a chunk of a token (on the node-aware form's forwarder, each rail
// row's node partials, into rows of `out_stride` bytes for the rail's
// exchange, which fails where this one did).
template <typename T> __device__ void combine_source(const TeamSync &t, const MoeLayer &m) {
    const bool first = blockIdx.x == 0 && threadIdx.x == 0;
    if (first && m.next_so != 0) t.mine<int64_t>(m.next_so)[0] = -1;  // a good exchange overwrites it
    const int64_t nt = *t.mine<int64_t>(m.state);
    if (nt < 0 || t.mine<int64_t>(m.back_so)[0] < 0) {
        if (first && m.fail_splits != 0) t.mine<int64_t>(m.fail_splits)[0] = -1;
        return;
    }
    combine_tokens<T>(t, m, nt);
}

}  // namespace k
}  // namespace shmem

using shmem::k::MoeLayer;
using shmem::k::TeamSync;

// The node-aware form's agreement over the world (one block; `t` the
// world's, agreeing): every member's row of the call (core/agree.cuh), and the
// verdict into `state[1]` (1: failed), which the call's exchanges read.
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) shmem_moe_agree(TeamSync t, MoeLayer m) {
    shmem::k::follow_stream();
    const bool agreed = shmem::k::agree(t);
    if (threadIdx.x == 0) t.mine<int64_t>(m.state)[1] = agreed ? 0 : 1;
}

extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) shmem_moe_route(TeamSync t, MoeLayer m) {
    shmem::k::follow_stream();
    shmem::k::phase_begin(m.phase == 0 ? "route_source" : "route_receiver");
    if (m.phase == 0) {
        shmem::k::route_source(t, m);
    } else {
        shmem::k::route_receiver(t, m);
    }
    shmem::k::phase_mark("kernel");
    shmem::k::phase_end();
}

extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) shmem_moe_rank(TeamSync t, MoeLayer m) {
    shmem::k::follow_stream();
    __shared__ shmem::k::RankShared sh;
    shmem::k::phase_begin(m.phase == 0 ? "rank_source" : "rank_receiver");
    shmem::k::rank_count<false>(t, m, sh);
    shmem::k::phase_mark("kernel");
    shmem::k::phase_end();
}

extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) shmem_moe_rank_stamp(TeamSync t, MoeLayer m) {
    shmem::k::follow_stream();
    __shared__ shmem::k::RankShared sh;
    shmem::k::phase_begin(m.phase == 0 ? "rank_stamp_source" : "rank_stamp_receiver");
    shmem::k::rank_count<true>(t, m, sh);
    shmem::k::phase_mark("kernel");
    shmem::k::phase_end();
}

extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) shmem_moe_stamp(TeamSync t, MoeLayer m) {
    shmem::k::follow_stream();
    __shared__ shmem::k::RankShared sh;
    shmem::k::phase_begin(m.phase == 0 ? "stamp_source" : "stamp_receiver");
    shmem::k::rank_stamp(t, m, sh);
    shmem::k::phase_mark("kernel");
    shmem::k::phase_end();
}

extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) shmem_moe_gather(TeamSync t, MoeLayer m) {
    shmem::k::follow_stream();
    shmem::k::phase_begin(m.phase == 0 ? "gather_source" : "gather_receiver");
    if (m.phase == 0) {
        shmem::k::gather_source(t, m);
    } else {
        shmem::k::gather_receiver(t, m);
    }
    shmem::k::phase_mark("kernel");
    shmem::k::phase_end();
}

#define SHMEM_MOE_COMBINE(name, T)                                        \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) \
        shmem_moe_combine_##name(TeamSync t, MoeLayer m) {                \
        shmem::k::follow_stream();                                        \
        shmem::k::phase_begin(m.phase == 0 ? "combine_experts" : "combine_source"); \
        if (m.phase == 0) {                                               \
            shmem::k::combine_experts<T>(t, m);                           \
        } else {                                                          \
            shmem::k::combine_source<T>(t, m);                            \
        }                                                                 \
        shmem::k::phase_mark("kernel");                                   \
        shmem::k::phase_end();                                            \
    }
SHMEM_MOE_COMBINE(f32, float)
SHMEM_MOE_COMBINE(f64, double)
SHMEM_MOE_COMBINE(f16, __half)
SHMEM_MOE_COMBINE(bf16, __nv_bfloat16)
