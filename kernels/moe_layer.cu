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
// gather quantizes bf16 tokens with quant.cuh (bit for bit the host's
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
#include "layer.cuh"

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

// Phase 0 of the gather on the forwarder: each rail row into its node
// rows, a block a slot: the payload as it came, the token field too, the
// slots of the destination PE.
__device__ void gather_forward(const TeamSync &t, const MoeLayer &m, int64_t nt) {
    const ForwardSlots in{t.mine<uint8_t>(m.forward_in), &m};
    const int64_t *slot_rows = t.mine<int64_t>(m.slot_rows);
    const uint64_t slots = static_cast<uint64_t>(nt) * m.top_k;
    for (uint64_t s = blockIdx.x; s < slots; s += gridDim.x) {
        const int64_t r = s / m.top_k;
        const int j = s % m.top_k;
        if (!in.first(r, j)) continue;
        const int64_t d = in.dest(r, j);
        const uint8_t *from = in.rows + r * m.stride;
        uint8_t *row = t.mine<uint8_t>(m.send + slot_rows[s] * m.stride);
        block_copy(row, from, m.meta + 8);
        const WireSlot *got = reinterpret_cast<const WireSlot *>(from + m.meta + 8);
        WireSlot *meta = wire_slots(row, m);
        for (int i = threadIdx.x; i < m.top_k; i += blockDim.x) {
            const int32_t e = got[i].at;
            meta[i] = WireSlot{e >= 0 && e / m.ne == d ? e % m.ne : -1, got[i].weight};
        }
    }
}

// Phase 0 of the gather, for a top-k beyond kLayerSharedSlots: each
// token into its wire rows, a block a piece of a slot's row (the piece of
// a token's first slot for the PE; the first piece writes the metadata).
__device__ void gather_slots(const TeamSync &t, const MoeLayer &m, int64_t nt) {
    const int64_t *ids = t.mine<int64_t>(m.ids);
    const float *w = t.mine<float>(m.weights);
    const int64_t *slot_rows = t.mine<int64_t>(m.slot_rows);
    const uint64_t slots = static_cast<uint64_t>(nt) * m.top_k, chunks = pieces_of(slots, m.data_bytes);
    for (uint64_t unit = blockIdx.x; unit < slots * chunks; unit += gridDim.x) {
        const uint64_t s = unit / chunks, c = unit % chunks;
        const int64_t tok = s / m.top_k;
        const int j = s % m.top_k;
        if (!first_of_dest(m, ids, tok, j)) continue;
        const int d = dest_of(ids[s], m.ne);
        uint8_t *row = t.mine<uint8_t>(m.send + slot_rows[s] * m.stride);
        const Range b = piece_bytes(m.data_bytes, c, chunks);
        if (m.fp8 == 0) {
            block_copy(row + b.lo, t.mine<uint8_t>(m.tokens + tok * m.data_bytes + b.lo), b.hi - b.lo);
        } else {
            __shared__ uint8_t *one_row[1];
            __shared__ float *one_scales[1];
            __syncthreads();  // the piece before is done with them
            if (threadIdx.x == 0) {
                one_row[0] = row;
                one_scales[0] = reinterpret_cast<float *>(row + m.scales_at);
            }
            __syncthreads();
            gather_fp8(t, m, tok, one_row, one_scales, 1, b);  // the FP8 format's data bytes are its codes
        }
        if (c != 0) continue;
        // The node-aware form's rows name their source PE too.
        if (threadIdx.x == 0)
            *wire_token(row, m) = m.origin > 0 ? static_cast<int64_t>(m.origin - 1) << kOriginShift | tok : tok;
        WireSlot *meta = wire_slots(row, m);
        for (int i = threadIdx.x; i < m.top_k; i += blockDim.x) {
            const int g = static_cast<int>(ids[tok * m.top_k + i]);  // checked
            meta[i] = WireSlot{g / m.ne == d ? g % m.ne : -1, w[tok * m.top_k + i]};
        }
    }
}

// A warp: `bytes` at `src` into rows `w.row[q] + at` below `w.k`, loaded
// once: 16-byte vectors, four a lane in flight, where the source, the
// rows, the offset and the length allow, else bytes. `held`: the first vectors,
// where the caller loaded them already (`warp_hold` of `src`).
__device__ __forceinline__ void warp_put(const WarpRows &w, uint64_t at, const uint8_t *src, uint64_t bytes,
                                         const WarpHeld &held = WarpHeld{}) {
    const int lane = threadIdx.x % 32;
    // The rows too: the view's lie `data_bytes` apart, which need not be
    // whole vectors (a row of 300 bf16 elements: 600 bytes).
    uint64_t align = reinterpret_cast<uint64_t>(src) | at | bytes;
#pragma unroll
    for (int q = 0; q < kRankTopK; q++)
        if (q < w.k) align |= reinterpret_cast<uint64_t>(w.row[q]);
    if (align % 16 != 0) {
        for (uint64_t i = lane; i < bytes; i += 32) {
            const uint8_t x = src[i];
#pragma unroll
            for (int q = 0; q < kRankTopK; q++)
                if (q < w.k) w.row[q][at + i] = x;
        }
        return;
    }
    const uint4 *s = reinterpret_cast<const uint4 *>(src);
    const uint64_t nv = bytes / 16;
    uint64_t from = lane;
    if (held.ok) {
        // The vectors `warp_hold` loaded (the same four a lane).
#pragma unroll
        for (int q = 0; q < kRankTopK; q++) {
            if (q >= w.k) break;
            uint4 *o = reinterpret_cast<uint4 *>(w.row[q] + at);
#pragma unroll
            for (int u = 0; u < kWarpHeld; u++)
                if (lane + 32 * u < nv) o[lane + 32 * u] = held.x[u];
        }
        from = lane + 32 * kWarpHeld;
    }
    for (uint64_t v = from; v < nv; v += 128) {
        uint4 x[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (v + 32 * u < nv) x[u] = s[v + 32 * u];
#pragma unroll
        for (int q = 0; q < kRankTopK; q++) {
            if (q >= w.k) break;
            uint4 *o = reinterpret_cast<uint4 *>(w.row[q] + at);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v + 32 * u < nv) o[v + 32 * u] = x[u];
        }
    }
}

// The warps the row kernels' warp forms keep busy before they split rows
// into pieces: sixteen an SM (what the gather's registers let an SM hold
// at once), not the grid's many more, which wait for a turn; each piece
// costs its own trip for the row's slots.
__device__ __forceinline__ int64_t resident_warps() {
    uint32_t sms;
    asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
    return static_cast<int64_t>(sms) * 16;
}

// Whether `gather_warps` takes this gather: a top-k up to kRankTopK; in
// the FP8 format quantizing, a hidden size of whole 4-element steps.
__device__ __forceinline__ bool gathers_by_warp(const MoeLayer &m) {
    return m.forward_in == 0 && m.top_k <= kRankTopK && (m.fp8 != kFp8Quantize || m.hidden % 4 == 0);
}

// Phase 0 of the gather where `gathers_by_warp`: a warp a piece of a
// token (`warp_pieces`: a whole token where tokens are many), its slots a
// lane each and its destinations' rows in registers, with no block
// barrier between pieces (an SM keeps many in flight); the piece loaded
// once and stored (in the FP8 format quantized once, or the caller's
// codes copied) into each row; the first piece's warp also writes the
// rows' metadata (and the caller's scales). `kWhole`: every piece is a
// whole token (a loop with fewer registers live).
template <bool kWhole> __device__ void gather_warps(const TeamSync &t, const MoeLayer &m, int64_t nt, WarpPieces wp) {
    const int lane = threadIdx.x % 32, per_block = blockDim.x / 32;
    const int64_t *ids = t.mine<int64_t>(m.ids);
    const float *w = t.mine<float>(m.weights);
    const int64_t *slot_rows = t.mine<int64_t>(m.slot_rows);
    const int64_t groups = (m.hidden + kQuantGroup - 1) / kQuantGroup;
    // The node-aware form's rows name their source PE too.
    const int64_t origin = m.origin > 0 ? static_cast<int64_t>(m.origin - 1) << kOriginShift : 0;
    const int64_t pieces = kWhole ? 1 : wp.pieces, step = static_cast<int64_t>(gridDim.x) * per_block;
    for (int64_t unit = static_cast<int64_t>(blockIdx.x) * per_block + threadIdx.x / 32; unit < nt * pieces;
         unit += step) {
        const int64_t tok = kWhole ? unit : unit / pieces, c = kWhole ? 0 : unit % pieces;
        const Range b = kWhole ? Range{0, static_cast<uint64_t>(m.data_bytes)} : wp.of(m.data_bytes, c);
        int g = 0;
        float weight = 0.0f;
        int64_t row = 0;
        if (lane < m.top_k) {
            const int64_t s = tok * m.top_k + lane;
            g = static_cast<int>(ids[s]);  // checked
            weight = w[s];
            row = slot_rows[s];
        }
        const int d = lane < m.top_k ? dest_of(g, m.ne) : -1;
        const WarpRows rows = warp_rows(t.mine<uint8_t>(m.send), m.stride, d, row);
        if (m.fp8 == 0) {
            warp_put(rows, b.lo, t.mine<uint8_t>(m.tokens + tok * m.data_bytes + b.lo), b.hi - b.lo);
        } else if (m.fp8 == kFp8Quantize) {
            warp_quantize(rows, m, t.mine<__nv_bfloat16>(m.tokens + tok * m.hidden * 2), b);
        } else {
            warp_put(rows, b.lo, t.mine<uint8_t>(m.tokens + tok * m.hidden + b.lo), b.hi - b.lo);
            if (c == 0)
                warp_put(rows, m.scales_at, t.mine<uint8_t>(m.token_scales + tok * groups * 4), groups * 4);
        }
        if (c != 0) continue;
        unsigned f = rows.firsts;
#pragma unroll
        for (int q = 0; q < kRankTopK; q++) {
            if (q >= rows.k) break;
            const int dq = __shfl_sync(0xffffffffu, d, __ffs(f) - 1);  // row q's destination
            f &= f - 1;
            if (lane == 0) *wire_token(rows.row[q], m) = origin | tok;
            if (lane < m.top_k) wire_slots(rows.row[q], m)[lane] = WireSlot{d == dq ? g % m.ne : -1, weight};
        }
    }
}

// Phase 0 of the gather: each token into its wire rows, a block a piece
// of a token (of `kLayerChunkBytes`, or quantizing to FP8 of
// `kLayerQuantChunk` elements; the host sizes the grid alike, by
// tokens): the piece loaded once and stored into the row of each of its destination
// PEs (in the FP8 format quantized once, its codes and scales stored into
// each), then, by the first piece's block, the rows' metadata. The
// token's slots (read a thread a slot) and the piece's first vectors
// (two a thread) are loaded together, before the block learns where they
// go: one trip to memory for both.
__device__ void gather_source(const TeamSync &t, const MoeLayer &m) {
    const int64_t nt = *t.mine<int64_t>(m.state);
    if (nt < 0) return;  // the route failed: nothing is sent
    if (m.forward_in != 0) {
        gather_forward(t, m, nt);
        return;
    }
    if (gathers_by_warp(m)) {
        const WarpPieces wp = warp_pieces(nt, m.data_bytes, resident_warps());  // the FP8 format's data bytes are its codes
        if (wp.pieces == 1) {
            gather_warps<true>(t, m, nt, wp);
        } else {
            gather_warps<false>(t, m, nt, wp);
        }
        return;
    }
    if (m.top_k > kLayerSharedSlots) {
        gather_slots(t, m, nt);
        return;
    }
    const int64_t *ids = t.mine<int64_t>(m.ids);
    const float *w = t.mine<float>(m.weights);
    const int64_t *slot_rows = t.mine<int64_t>(m.slot_rows);
    const int64_t chunk = m.fp8 == kFp8Quantize ? kLayerQuantChunk : kLayerChunkBytes;
    const int64_t chunks = pieces_of(nt, m.data_bytes, chunk);
    // The token's slots: each one's destination and local expert there,
    // weight and wire row; then its distinct destinations' rows in slot
    // order (and, in the FP8 format, their scales).
    __shared__ int slot_dest[kLayerSharedSlots], slot_expert[kLayerSharedSlots];
    __shared__ float slot_weight[kLayerSharedSlots];
    __shared__ int64_t slot_row[kLayerSharedSlots];
    __shared__ uint8_t *rows[kLayerSharedSlots], *dsts[kLayerSharedSlots];
    __shared__ float *scales[kLayerSharedSlots];
    __shared__ int row_dest[kLayerSharedSlots];
    __shared__ const uint8_t *src[1];
    __shared__ int nrows;
    for (int64_t unit = blockIdx.x; unit < nt * chunks; unit += gridDim.x) {
        const int64_t tok = unit / chunks;
        const int64_t c = unit % chunks;
        const Range b = piece_bytes(m.data_bytes, c, chunks, chunk);
        const uint8_t *token = t.mine<uint8_t>(m.tokens + tok * m.data_bytes + b.lo);
        const HeldPiece held = hold_piece(token, b.hi - b.lo, m.fp8 == 0);
        __syncthreads();  // the block's piece before is done with the tables
        for (int j = threadIdx.x; j < m.top_k; j += blockDim.x) {
            const int64_t s = tok * m.top_k + j;
            const int g = static_cast<int>(ids[s]);  // checked
            slot_dest[j] = dest_of(g, m.ne);
            slot_expert[j] = g % m.ne;
            slot_weight[j] = w[s];
            slot_row[j] = slot_rows[s];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint64_t seen = 0;  // a bit a PE (kMaxTeam is 64)
            int k = 0;
            for (int j = 0; j < m.top_k; j++) {
                const int d = slot_dest[j];
                if (seen >> d & 1) continue;
                seen |= 1ull << d;
                rows[k] = t.mine<uint8_t>(m.send + slot_row[j] * m.stride);
                dsts[k] = rows[k] + b.lo;
                scales[k] = reinterpret_cast<float *>(rows[k] + m.scales_at);
                row_dest[k++] = d;
            }
            nrows = k;
            src[0] = token;
        }
        __syncthreads();
        const int k = nrows;
        if (m.fp8 != 0) {
            gather_fp8(t, m, tok, rows, scales, k, b);  // the FP8 format's data bytes are its codes
        } else {
            put_piece(held, dsts, src, k, b.hi - b.lo, true);  // wire rows: 16-byte aligned
        }
        if (c != 0) continue;
        // The node-aware form's rows name their source PE too.
        const int64_t token_field = m.origin > 0 ? static_cast<int64_t>(m.origin - 1) << kOriginShift | tok : tok;
        for (int i = threadIdx.x; i < k; i += blockDim.x) *wire_token(rows[i], m) = token_field;
        for (int i = threadIdx.x; i < k * m.top_k; i += blockDim.x) {
            const int r = i / m.top_k, j = i % m.top_k;
            wire_slots(rows[r], m)[j] = WireSlot{slot_dest[j] == row_dest[r] ? slot_expert[j] : -1, slot_weight[j]};
        }
    }
}
// Whether `place_warps` takes the receiver's gather: the flat form, a
// top-k up to kRankTopK, and in the FP8 format the codes and scales alone
// (no bf16 view).
__device__ __forceinline__ bool places_by_warp(const MoeLayer &m) {
    return m.view_n == 0 && m.top_k <= kRankTopK && (m.fp8 == 0 || !m.dequantize);
}

// Phase 1 of the gather where `places_by_warp`: a warp a piece of a
// staged row (`warp_pieces`), its slots' view rows a lane each, in
// registers (each slot's expert differs, so does its row); the piece
// loaded once and stored into each (in the FP8 format its codes; the
// first piece's warp also the scales), then each slot's pair counted
// (`count_placed`). `so` and `view_so` as `gather_receiver` holds them.
__device__ void place_warps(const TeamSync &t, const MoeLayer &m, int64_t total, const int64_t *so,
                            const int64_t *view_so) {
    const int lane = threadIdx.x % 32, per_block = blockDim.x / 32;
    uint8_t *stage = t.mine<uint8_t>(m.stage);
    const ArrivalWords arrivals = arrival_words(t, m);
    const uint64_t epoch = *arrivals.epoch;
    uint8_t *view = t.mine<uint8_t>(m.fp8 == 0 ? m.recv : m.recv_codes);
    float *recv_scales = t.mine<float>(m.recv_scales);
    const int64_t groups = (m.hidden + kQuantGroup - 1) / kQuantGroup;
    const WarpPieces wp = warp_pieces(total, m.data_bytes, resident_warps());  // the FP8 format's data bytes are its codes
    const int64_t step = static_cast<int64_t>(gridDim.x) * per_block;
    for (int64_t unit = static_cast<int64_t>(blockIdx.x) * per_block + threadIdx.x / 32; unit < total * wp.pieces;
         unit += step) {
        const int64_t r = unit / wp.pieces, c = unit % wp.pieces;
        const Range b = wp.of(m.data_bytes, c);
        const uint8_t *row = stage + r * m.stride;
        // The piece's first vectors and (FP8, first piece) a lane's first
        // scale are loaded beside the slots, before the warp knows where
        // they go: one trip to memory for all three, not three in a row.
        const WarpHeld held = warp_hold(row + b.lo, b.hi - b.lo);
        const float *scales = reinterpret_cast<const float *>(row + m.scales_at);
        const bool scaled = m.fp8 != 0 && c == 0;
        const float scale0 = scaled && lane < groups ? scales[lane] : 0.0f;
        const int32_t at = lane < m.top_k ? wire_slots(const_cast<uint8_t *>(row), m)[lane].at : -1;
        const WarpRows rows = warp_rows(view, m.data_bytes, at, at);
        warp_put(rows, b.lo, row + b.lo, b.hi - b.lo, held);
        if (scaled) {
            unsigned f = rows.firsts;
#pragma unroll
            for (int q = 0; q < kRankTopK; q++) {
                if (q >= rows.k) break;
                const int64_t aq = __shfl_sync(0xffffffffu, at, __ffs(f) - 1);  // row q's place in the view
                f &= f - 1;
                if (lane < groups) recv_scales[aq * groups + lane] = scale0;
                for (int64_t g = lane + 32; g < groups; g += 32) recv_scales[aq * groups + g] = scales[g];
            }
        }
        __syncwarp();  // the warp's stores before its counts
        if (at < 0) continue;
        const int s = staged_source(t, m, r, so);
        const int e = view_expert(t, m, s, at, view_so);
        if (e < 0) continue;
        const int pair = e * t.n + s;
        count_placed(arrivals, pair, static_cast<uint32_t>(view_so[pair] * wp.pieces), epoch);
    }
}

// Phase 1 of the gather: each staged row into its view rows, a block a
// chunk of a row. In the native format each thread loads its vectors of
// the chunk once and stores them into every view row of the row's slots.
__device__ void gather_receiver(const TeamSync &t, const MoeLayer &m) {
    const int64_t total = staged_rows(t, m);
    if (total < 0) return;
    uint8_t *stage = t.mine<uint8_t>(m.stage);
    const ArrivalWords arrivals = arrival_words(t, m);
    const uint64_t epoch = *arrivals.epoch;
    const int64_t chunks = pieces_of(total, m.data_bytes);
    // The exchange's and the view's splits and offsets, which each
    // placement's count looks up (one source, one expert at a time), in
    // shared memory where they fit: not one dependent load through L2 a
    // step.
    __shared__ int64_t tables[2 * kMaxTeam + 2 * kLayerSharedPairs];
    const int64_t pairs = static_cast<int64_t>(m.ne) * view_sources(t, m);
    const int64_t *so = t.mine<int64_t>(m.stage_so), *view_so = t.mine<int64_t>(m.view_so);
    if (pairs <= kLayerSharedPairs) {
        for (int i = threadIdx.x; i < 2 * t.n; i += blockDim.x) tables[i] = so[i];
        for (int64_t i = threadIdx.x; i < 2 * pairs; i += blockDim.x) tables[2 * kMaxTeam + i] = view_so[i];
        __syncthreads();
        so = tables;
        view_so = tables + 2 * kMaxTeam;
    }
    if (places_by_warp(m)) {
        place_warps(t, m, total, so, view_so);
        return;
    }
    __shared__ uint8_t *dsts[kLayerSharedSlots];
    __shared__ int32_t dst_rows[kLayerSharedSlots], slot_at[kLayerSharedSlots];
    __shared__ const uint8_t *src[1];
    __shared__ int ndst;
    __shared__ bool dsts_aligned;
    // The FP8 format's codes go as the native format's elements do (one
    // byte an element, in `recv_codes`), unless they are dequantized too.
    const bool one_load = m.top_k <= kLayerSharedSlots && (m.fp8 == 0 || !m.dequantize);
    const uint64_t view = m.fp8 == 0 ? m.recv : m.recv_codes;
    const int64_t groups = (m.hidden + kQuantGroup - 1) / kQuantGroup;
    for (int64_t w = blockIdx.x; w < total * chunks; w += gridDim.x) {
        const int64_t r = w / chunks;
        const Range b = piece_bytes(m.data_bytes, w % chunks, chunks);
        uint8_t *row = stage + r * m.stride;
        const WireSlot *slots = wire_slots(row, m);
        if (one_load) {
            // The piece's first vectors and the slots' view rows (a thread a
            // slot), their loads in flight together.
            const HeldPiece held = hold_piece(row + b.lo, b.hi - b.lo, true);
            __syncthreads();  // the block's copy of the chunk before is done with dsts
            for (int j = threadIdx.x; j < m.top_k; j += blockDim.x) slot_at[j] = slots[j].at;
            __syncthreads();
            if (threadIdx.x == 0) {
                int k = 0;
                uint64_t align = 0;
                for (int j = 0; j < m.top_k; j++) {
                    const int32_t at = slot_at[j];
                    if (at < 0) continue;
                    dsts[k] = t.mine<uint8_t>(view + at * m.data_bytes) + b.lo;
                    align |= reinterpret_cast<uint64_t>(dsts[k]);
                    dst_rows[k++] = at;
                }
                src[0] = row + b.lo;
                ndst = k;
                dsts_aligned = align % 16 == 0;
            }
            __syncthreads();
            put_piece(held, dsts, src, ndst, b.hi - b.lo, dsts_aligned);
            if (m.fp8 != 0) {
                // The chunk's scale groups into every view row.
                const uint64_t g0 = b.lo / kQuantGroup, ng = (b.hi + kQuantGroup - 1) / kQuantGroup - g0;
                const float *scales = reinterpret_cast<const float *>(row + m.scales_at);
                float *out = t.mine<float>(m.recv_scales);
                for (uint64_t i = threadIdx.x; i < ndst * ng; i += blockDim.x)
                    out[dst_rows[i / ng] * groups + g0 + i % ng] = scales[g0 + i % ng];
            }
        } else {
            for (int j = 0; j < m.top_k; j++) {
                const int32_t at = slots[j].at;
                if (at < 0) continue;
                if (m.fp8 == 0) {
                    block_copy(t.mine<uint8_t>(m.recv + at * m.data_bytes) + b.lo, row + b.lo, b.hi - b.lo);
                } else {
                    place_fp8(t, m, row, at, b);  // the FP8 format's data bytes are its codes: one an element
                }
            }
        }
        // The chunk is in every block it goes to: count it for each, a
        // thread a slot (each slot's expert differs, so does its pair); a
        // pair's flag rises with its rows' last chunk.
        __syncthreads();
        for (int j = threadIdx.x; j < m.top_k; j += blockDim.x) {
            const int32_t at = one_load ? slot_at[j] : slots[j].at;
            if (at < 0) continue;
            const int s = staged_source(t, m, r, so);
            const int e = view_expert(t, m, s, at, view_so);
            if (e < 0) continue;
            const int pair = e * view_sources(t, m) + s;
            count_placed(arrivals, pair, static_cast<uint32_t>(view_so[pair] * chunks), epoch);
        }
    }
}
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
// world's, agreeing): every member's row of the call (agree.cuh), and the
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
