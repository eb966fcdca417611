// The MoE layer's row helpers (moe/layer.cu and its decode form,
// moe/decode.cu): the wire row's parts, the pieces a row kernel splits a
// row into, a token's checked destinations, loading a piece once and
// storing it into several rows, the FP8 gather and placement, the
// arrival counts, and the combine's sums.
#pragma once
#include "core/common.cuh"
#include "moe/quant.cuh"

namespace shmem {
namespace k {

// A slot of a wire row's metadata: the local expert (or, after the
// receiver's phase 1, the row in the view), -1 for a slot routed elsewhere.
struct WireSlot {
    int32_t at;
    float weight;
};
static_assert(sizeof(WireSlot) == 8, "WireSlot: size");

__device__ __forceinline__ int64_t *wire_token(uint8_t *row, const MoeLayer &m) {
    return reinterpret_cast<int64_t *>(row + m.meta);
}

__device__ __forceinline__ WireSlot *wire_slots(uint8_t *row, const MoeLayer &m) {
    return reinterpret_cast<WireSlot *>(row + m.meta + 8);
}

// Rows staged by the last dispatch exchange, or -1 when it failed.
__device__ __forceinline__ int64_t staged_rows(const TeamSync &t, const MoeLayer &m) {
    const int64_t *so = t.mine<int64_t>(m.stage_so);
    if (so[0] < 0) return -1;
    int64_t total = 0;
    for (int s = 0; s < t.n; s++) total += so[s];
    return total;
}

// The source PEs of the receiver's view: the world in the node-aware
// form (`view_n`), else the team's.
__device__ __forceinline__ int view_sources(const TeamSync &t, const MoeLayer &m) {
    return m.view_n > 0 ? m.view_n : t.n;
}

// The arrival flags (ne × the view's sources), the epoch word after them,
// then the placement counters (as many u32).
struct ArrivalWords {
    uint64_t *flags;
    uint64_t *epoch;
    uint32_t *placed;
};

__device__ __forceinline__ ArrivalWords arrival_words(const TeamSync &t, const MoeLayer &m) {
    uint64_t *base = t.mine<uint64_t>(m.arrivals);
    const int64_t pairs = static_cast<int64_t>(m.ne) * view_sources(t, m);
    return ArrivalWords{base, base + pairs, reinterpret_cast<uint32_t *>(base + pairs + 1)};
}

// The source PE of staged row `r` in the view: the one its token field
// names in the node-aware form; else by position, rows coming
// source-major.
// `so`: the exchange's out splits and offsets (`m.stage_so`, or a copy).
__device__ __forceinline__ int staged_source(const TeamSync &t, const MoeLayer &m, int64_t r, const int64_t *so) {
    if (m.view_n > 0) {
        const uint8_t *row = t.mine<uint8_t>(m.stage) + r * m.stride;
        return static_cast<int>(static_cast<uint64_t>(*reinterpret_cast<const int64_t *>(row + m.meta)) >>
                                kOriginShift);
    }
    int s = 0;
    while (s + 1 < t.n && r >= so[t.n + s + 1]) s++;
    return s;
}

// The local expert whose block holds view row `at` of source `s`'s rows.
// `view_so`: the view's splits and offsets (`m.view_so`, or a copy).
__device__ __forceinline__ int view_expert(const TeamSync &t, const MoeLayer &m, int s, int64_t at,
                                           const int64_t *view_so) {
    const int n = view_sources(t, m);
    const int64_t mm = static_cast<int64_t>(m.ne) * n;
    for (int e = 0; e < m.ne; e++) {
        const int64_t start = view_so[mm + e * n + s];
        if (at >= start && at < start + view_so[e * n + s]) return e;
    }
    return -1;
}

// Raises an arrival flag (`shmem_device.cuh`'s `moe_wait_arrival`): a
// store with release semantics at the GPU's scope, which the waiters (on
// this PE's GPU) share; a system-scope release would wait for this
// thread's stores to peers as well.
__device__ __forceinline__ void raise_arrival(uint64_t *flag, uint64_t epoch) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(flag), "l"(epoch) : "memory");
}

// Thread: one more row of pair (e, s) placed, by this thread's block (or
// warp), whose writes the __syncthreads (or __syncwarp) before put ahead
// of this thread's. The
// counter's acq_rel add releases them (cumulatively) and acquires the
// earlier counts of the pair, so the block that counts its last row
// releases every row of the pair with the flag, and puts the counter
// back to 0: every dispatch leaves its counters as it found them, 0
// (the decode form's dispatch in lines counts from them as it begins).
__device__ __forceinline__ void count_placed(const ArrivalWords &a, int pair, uint32_t rows, uint64_t epoch) {
    uint32_t before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(a.placed + pair) : "memory");
    if (before + 1 != rows) return;
    raise_arrival(a.flags + pair, epoch);
    a.placed[pair] = 0;
}

// The row kernels' unit of work: a row (a token's elements, or in the
// FP8 format its codes) or, where the rows' pieces of kLayerChunkBytes
// fit the grid at once, a piece, so that a few rows still spread over many
// blocks (the host sizes the grids by pieces: `LAYER_CHUNK_BYTES`). Many
// rows go whole, a block a row: each unit costs its own steps (an arrival
// counted, the slots read). `pieces_of` gives the pieces of each of
// `rows` rows of `bytes` (the same in every block).
// The source's gather quantizing to FP8 takes pieces of `kLayerQuantChunk`
// codes instead (a group a warp: quantizing, not moving, is its work).
__device__ __forceinline__ int64_t pieces_of(int64_t rows, int64_t bytes, int64_t chunk = kLayerChunkBytes) {
    const int64_t c = bytes <= chunk ? 1 : (bytes + chunk - 1) / chunk;
    return rows * c <= static_cast<int64_t>(gridDim.x) ? c : 1;
}

// Piece `c` of `pieces` (of `chunk` bytes) of a row of `bytes`.
__device__ __forceinline__ Range piece_bytes(int64_t bytes, int64_t c, int64_t pieces, int64_t chunk = kLayerChunkBytes) {
    if (pieces == 1) return Range{0, static_cast<uint64_t>(bytes)};
    const uint64_t lo = static_cast<uint64_t>(c) * chunk;
    const uint64_t hi = lo + chunk < static_cast<uint64_t>(bytes) ? lo + chunk : bytes;
    return Range{lo, hi};
}

// A warp's pieces of rows of `bytes`: a multiple of kWarpPieceBytes each
// (whole FP8 scale groups), as small as keeps `warps` warps busy with
// `rows` rows (by default every warp of the grid), at most a piece a warp
// a row (a warp moves 512 bytes a step: a few steps a piece, not many one
// after another).
constexpr int64_t kWarpPieceBytes = 512;
struct WarpPieces {
    int64_t pieces, chunk;
    __device__ Range of(int64_t bytes, int64_t c) const { return piece_bytes(bytes, c, pieces, chunk); }
};
__device__ __forceinline__ WarpPieces warp_pieces(int64_t rows, int64_t bytes,
                                                  int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32)) {
    const int64_t fit = rows > 0 ? warps / rows : 1;
    const int64_t want = fit < 1 ? 1 : fit;
    int64_t chunk = (bytes + want - 1) / want;
    chunk = (chunk + kWarpPieceBytes - 1) / kWarpPieceBytes * kWarpPieceBytes;
    const int64_t pieces = bytes <= chunk ? 1 : (bytes + chunk - 1) / chunk;
    return WarpPieces{pieces, pieces == 1 ? (bytes > 0 ? bytes : 1) : chunk};
}

// Most slots a token's route keeps in registers (`token_dests`); a
// larger top-k takes the loops that read them from memory one by one.
constexpr int kRouteFastSlots = 8;

// The destination PE of a checked expert id (`g < experts < 2³¹`): a
// 32-bit division, many times cheaper on the device than a 64-bit one.
__device__ __forceinline__ int dest_of(int64_t g, int ne) { return static_cast<int>(g) / ne; }

// A token's ids and weights (top_k at most kRouteFastSlots), in registers.
struct TokenSlots {
    int64_t g[kRouteFastSlots];
    float x[kRouteFastSlots];
};

// Token `tok`'s ids and weights, loaded all at once (-1 and 0 past top_k).
__device__ __forceinline__ TokenSlots load_token(const MoeLayer &m, const int64_t *ids, const float *w, int64_t tok) {
    const int k = m.top_k;
    TokenSlots t;
#pragma unroll
    for (int j = 0; j < kRouteFastSlots; j++) {
        t.g[j] = j < k ? ids[tok * k + j] : -1;
        t.x[j] = j < k ? w[tok * k + j] : 0.0f;
    }
    return t;
}

// A slot's fault (`at`: its number among the slots, plus one), in the
// order every route checks it (`check_token` inline): its id `g` within
// the `experts`, then not `repeated` (an earlier slot of its token has
// the id), then its weight `x` finite; ~0 when none.
__device__ __forceinline__ unsigned long long slot_fault(int64_t g, float x, bool repeated, int experts,
                                                        unsigned long long at) {
    if (g < 0 || g >= experts) return kRouteExpertOutOfRange << kRouteFaultShift | at;
    if (repeated) return kRouteRepeatedExpert << kRouteFaultShift | at;
    if (!isfinite(x)) return kRouteBadWeight << kRouteFaultShift | at;
    return ~0ull;
}

// Token `tok`'s slots `t`, checked in registers (not a trip to memory a
// slot, nor one for each pair of slots compared): their destination PEs
// into `d` (-1 past top_k), and the first bad slot's fault as
// `token_fault` gives it (~0 when none).
__device__ __forceinline__ unsigned long long check_token(const MoeLayer &m, const TokenSlots &t, int64_t tok,
                                                         int experts, int (&d)[kRouteFastSlots]) {
    const int k = m.top_k;
    unsigned long long fault = ~0ull;
#pragma unroll
    for (int j = 0; j < kRouteFastSlots; j++) {
        d[j] = -1;
        if (j >= k || fault != ~0ull) continue;
        const unsigned long long at = static_cast<unsigned long long>(tok * k + j) + 1;
        if (t.g[j] < 0 || t.g[j] >= experts) {
            fault = kRouteExpertOutOfRange << kRouteFaultShift | at;
            continue;
        }
        bool repeated = false;
#pragma unroll
        for (int i = 0; i < j; i++) repeated |= t.g[i] == t.g[j];
        if (repeated) {
            fault = kRouteRepeatedExpert << kRouteFaultShift | at;
        } else if (!isfinite(t.x[j])) {
            fault = kRouteBadWeight << kRouteFaultShift | at;
        } else {
            d[j] = dest_of(t.g[j], m.ne);
        }
    }
    return fault;
}

// Token `tok`'s slots loaded and checked (`load_token`, `check_token`).
__device__ __forceinline__ unsigned long long token_dests(const MoeLayer &m, const int64_t *ids, const float *w,
                                                         int64_t tok, int experts, int (&d)[kRouteFastSlots]) {
    return check_token(m, load_token(m, ids, w, tok), tok, experts, d);
}

// A piece's first two 16-byte vectors a thread (vectors threadIdx.x and
// threadIdx.x + blockDim.x), loaded before the block knows where the
// piece goes, so that their trip to memory overlaps the loads that tell
// it (`ok`: the source is 16-byte aligned and they were loaded).
struct HeldPiece {
    uint4 x0, x1;
    bool ok;
};

__device__ __forceinline__ HeldPiece hold_piece(const uint8_t *src, uint64_t bytes, bool want) {
    HeldPiece h;
    h.ok = want && reinterpret_cast<uint64_t>(src) % 16 == 0;
    const uint64_t v = bytes / 16, i0 = threadIdx.x, i1 = threadIdx.x + blockDim.x;
    if (h.ok && i0 < v) h.x0 = reinterpret_cast<const uint4 *>(src)[i0];
    if (h.ok && i1 < v) h.x1 = reinterpret_cast<const uint4 *>(src)[i1];
    return h;
}

// The piece of `bytes` at `src[0]` into each of the `n` rows `dsts`
// (pointers in shared memory; `aligned`: all 16-byte aligned), by the
// whole block: the held vectors stored, the rest copied (all of it where
// nothing is held).
__device__ __forceinline__ void put_piece(const HeldPiece &h, uint8_t *const *dsts, const uint8_t *const *src, int n,
                                          uint64_t bytes, bool aligned) {
    if (!h.ok || !aligned) {
        block_copy_pairs<true>(dsts, src, n, bytes);
        return;
    }
    const uint64_t v = bytes / 16, i0 = threadIdx.x, i1 = threadIdx.x + blockDim.x;
    for (int r = 0; r < n; r++) {
        if (i0 < v) reinterpret_cast<uint4 *>(dsts[r])[i0] = h.x0;
        if (i1 < v) reinterpret_cast<uint4 *>(dsts[r])[i1] = h.x1;
    }
    // The rest of a piece longer than two vectors a thread, and its bytes
    // past the last whole vector.
    const uint64_t held = 2 * static_cast<uint64_t>(blockDim.x) < v ? 2 * static_cast<uint64_t>(blockDim.x) * 16 : v * 16;
    if (held == bytes) return;
    __shared__ uint8_t *rest[kLayerSharedSlots];
    __shared__ const uint8_t *rest_src[1];
    __syncthreads();  // every thread is past the pointers of a rest before
    for (int r = threadIdx.x; r < n; r += blockDim.x) rest[r] = dsts[r] + held;
    if (threadIdx.x == 0) rest_src[0] = src[0] + held;
    __syncthreads();
    block_copy_pairs<true>(rest, rest_src, n, bytes - held);
}

// A warp's token (or staged row) of up to kRankTopK slots, a lane a slot,
// and the rows of its distinct destinations, in slot order, in
// registers: valid below `k`; row q is that of the q-th lane of
// `firsts`. `d` is the lane's slot's destination (-1 for none), `row` its
// row of `stride` bytes from `base`.
struct WarpRows {
    uint8_t *row[kRankTopK];
    unsigned firsts;
    int k;
};
__device__ __forceinline__ WarpRows warp_rows(uint8_t *base, int64_t stride, int d, int64_t row) {
    const int lane = threadIdx.x % 32;
    bool first = d >= 0;
#pragma unroll
    for (int i = 0; i < kRankTopK; i++) {
        const int di = __shfl_sync(0xffffffffu, d, i);
        if (i < lane && di == d) first = false;
    }
    WarpRows w;
    w.firsts = __ballot_sync(0xffffffffu, first);
    w.k = __popc(w.firsts);
    unsigned f = w.firsts;
#pragma unroll
    for (int q = 0; q < kRankTopK; q++) {
        const int from = f != 0 ? __ffs(f) - 1 : 0;
        f &= f - 1;
        w.row[q] = base + __shfl_sync(0xffffffffu, row, from) * stride;
    }
    return w;
}

// A warp's first vectors of a piece, four a lane (vectors lane + 32 u),
// loaded before the warp knows where the piece goes, so that their trip
// to memory overlaps the loads that tell it (`ok`: the piece is whole
// 16-byte vectors).
constexpr int kWarpHeld = 4;
struct WarpHeld {
    uint4 x[kWarpHeld];
    bool ok;
};
__device__ __forceinline__ WarpHeld warp_hold(const uint8_t *src, uint64_t bytes) {
    const int lane = threadIdx.x % 32;
    WarpHeld h;
    h.ok = (reinterpret_cast<uint64_t>(src) | bytes) % 16 == 0;
    const uint64_t nv = bytes / 16;
#pragma unroll
    for (int u = 0; u < kWarpHeld; u++)
        if (h.ok && lane + 32 * u < nv) h.x[u] = reinterpret_cast<const uint4 *>(src)[lane + 32 * u];
    return h;
}

// A lane's four consecutive elements of each of the four groups from
// `g0` (of `groups`, of the `hidden` bf16 elements at `x`), as raw bits;
// zero past the end.
__device__ __forceinline__ void quant_batch(uint2 (&raw)[4], const __nv_bfloat16 *x, int64_t hidden, int64_t g0,
                                            int64_t groups) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int b = 0; b < 4; b++) {
        const int64_t i = (g0 + b) * kQuantGroup + lane * 4;
        raw[b] = g0 + b < groups && i < hidden ? *reinterpret_cast<const uint2 *>(x + i) : make_uint2(0, 0);
    }
}

// A warp: elements `e` (whole scale groups but the last) of the `hidden`
// bf16 elements at `x` quantized (moe/quant.cuh's rule) into every row below
// `w.k`: codes at the row's start, scales at `scales_at`. A lane takes
// four consecutive elements of a group, so that a group is one 8-byte
// load and one 4-byte store a lane (hidden a multiple of 4). Groups go
// four at a time, and the next four's loads are in flight while these
// are quantized and stored: the warp's work is the arithmetic of each
// group, so that its loads wait on nothing but their own trip.
__device__ __forceinline__ void warp_quantize(const WarpRows &w, const MoeLayer &m, const __nv_bfloat16 *x, Range e) {
    const int lane = threadIdx.x % 32;
    const int64_t groups = (e.hi + kQuantGroup - 1) / kQuantGroup;
    int64_t g0 = e.lo / kQuantGroup;
    uint2 raw[4];
    quant_batch(raw, x, m.hidden, g0, groups);
    for (; g0 < groups; g0 += 4) {
        uint2 next[4];
        quant_batch(next, x, m.hidden, g0 + 4, groups);
#pragma unroll
        for (int b = 0; b < 4; b++) {
            if (g0 + b >= groups) break;  // the same on every lane
            const __nv_bfloat16 *h = reinterpret_cast<const __nv_bfloat16 *>(&raw[b]);
            float v[4], amax = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                v[j] = quant_in(h[j]);
                amax = fmaxf(amax, fabsf(v[j]));
            }
            const float scale = warp_group_scale(amax);
            uint32_t codes = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) codes |= static_cast<uint32_t>(quantize_one(v[j], scale)) << (8 * j);
            const int64_t i = (g0 + b) * kQuantGroup + lane * 4;
#pragma unroll
            for (int q = 0; q < kRankTopK; q++) {
                if (q >= w.k) break;
                if (i < m.hidden) *reinterpret_cast<uint32_t *>(w.row[q] + i) = codes;
                if (lane == 0) reinterpret_cast<float *>(w.row[q] + m.scales_at)[g0 + b] = scale;
            }
        }
#pragma unroll
        for (int b = 0; b < 4; b++) raw[b] = next[b];
    }
}

// The FP8 payload of token `tok`, elements `e` (a piece: whole scale
// groups but the last), into the `n` wire rows at `rows` (codes at the
// row's start, scales at `scales_at`; pointers in shared memory), by the
// whole block: quantized once from bf16 (a warp a group, several groups'
// loads in flight) or copied from the caller's codes and scales.
inline __device__ void gather_fp8(const TeamSync &t, const MoeLayer &m, int64_t tok, uint8_t *const *rows,
                           float *const *scales, int n, Range e) {
    const int64_t groups = (m.hidden + kQuantGroup - 1) / kQuantGroup;
    const int64_t g0 = e.lo / kQuantGroup, g1 = (e.hi + kQuantGroup - 1) / kQuantGroup;
    if (m.fp8 == kFp8PreQuantized) {
        const uint8_t *codes = t.mine<uint8_t>(m.tokens + tok * m.hidden + e.lo);
        for (int k = 0; k < n; k++) block_copy(rows[k] + e.lo, codes, e.hi - e.lo);
        const float *given = t.mine<float>(m.token_scales + tok * groups * 4);
        for (int64_t i = threadIdx.x; i < n * (g1 - g0); i += blockDim.x)
            scales[i / (g1 - g0)][g0 + i % (g1 - g0)] = given[g0 + i % (g1 - g0)];
        return;
    }
    const __nv_bfloat16 *x = t.mine<__nv_bfloat16>(m.tokens + tok * m.hidden * 2);
    const int warps = blockDim.x / 32;
    quantize_groups(x, m.hidden, g0 + threadIdx.x / 32, g1, warps, rows, scales, n);
}


// The FP8 format: elements `e` (a chunk: whole scale groups but the
// last) of staged row `row`, codes and scales, into view row `at`, and
// with `dequantize` their bf16 values, by the whole block.
inline __device__ void place_fp8(const TeamSync &t, const MoeLayer &m, const uint8_t *row, int64_t at, Range e) {
    const int64_t groups = (m.hidden + kQuantGroup - 1) / kQuantGroup;
    const uint64_t g0 = e.lo / kQuantGroup, g1 = (e.hi + kQuantGroup - 1) / kQuantGroup;
    const float *scales = reinterpret_cast<const float *>(row + m.scales_at);
    block_copy(t.mine<uint8_t>(m.recv_codes + at * m.hidden + e.lo), row + e.lo, e.hi - e.lo);
    block_copy(t.mine<uint8_t>(m.recv_scales + (at * groups + g0) * 4), reinterpret_cast<const uint8_t *>(scales + g0),
               (g1 - g0) * 4);
    if (!m.dequantize) return;
    __nv_bfloat16 *x = t.mine<__nv_bfloat16>(m.recv + at * m.hidden * 2);
    for (uint64_t i = e.lo + threadIdx.x; i < e.hi; i += blockDim.x)
        x[i] = dequantize_one<__nv_bfloat16>(row[i], scales[i / kQuantGroup]);
}


// acc + w × x and acc + x, rounded after each step as the host does (no FMA).
__device__ __forceinline__ float weigh(float acc, float w, float x) { return __fadd_rn(acc, __fmul_rn(w, x)); }
__device__ __forceinline__ double weigh(double acc, float w, double x) {
    return __dadd_rn(acc, __dmul_rn(static_cast<double>(w), x));
}
__device__ __forceinline__ float add(float acc, float x) { return __fadd_rn(acc, x); }
__device__ __forceinline__ double add(double acc, double x) { return __dadd_rn(acc, x); }

// Whether `p` is 16-byte aligned.
__device__ __forceinline__ bool aligned16(const void *p) { return reinterpret_cast<uint64_t>(p) % 16 == 0; }

// Rows whose vectors `fold_vectors` loads before it adds the first.
constexpr int kFoldAhead = 2;

// The threads that share a loop: this one's first step and their count
// (the block's, or a warp's).
struct Lanes {
    uint32_t first, stride;
};
__device__ __forceinline__ Lanes block_lanes() { return Lanes{threadIdx.x, blockDim.x}; }
__device__ __forceinline__ Lanes warp_lanes() { return Lanes{threadIdx.x % 32, 32}; }

// The 16-byte vectors `lo` to `hi` of `out`: each the fold of `rows`
// rows' vectors in row order, `step(acc, i, x)` adding row i's element x
// to the accumulator (which starts at 0), rounded once (the whole block,
// or the `l` that share it; `row(i)` is row i's first element, 16-byte
// aligned). `kAt` vectors a lane at a time: 2 where a lane has several
// (a warp's share of a row), 1 where the lanes cover the range in a step.
template <int kAt = 1, typename T, typename Row, typename Step>
__device__ __forceinline__ void fold_vectors(T *out, uint64_t lo, uint64_t hi, int rows, Row row, Step step,
                                             Lanes l = block_lanes()) {
    using A = typename Acc<T>::type;
    using V = Vec<T>;
    constexpr int kN = V::kN;
    // kAt vectors a lane at once (`v`, `v + stride`, …), each with up to
    // kFoldAhead rows loaded before the first is added, so that their
    // trips to memory overlap; each folded in row order.
    for (uint64_t v = lo + l.first; v < hi; v += kAt * l.stride) {
        bool has[kAt];
        A acc[kAt][kN];
#pragma unroll
        for (int a = 0; a < kAt; a++) {
            has[a] = v + a * l.stride < hi;
#pragma unroll
            for (int e = 0; e < kN; e++) acc[a][e] = 0;
        }
        int i = 0;
        for (; i + kFoldAhead <= rows; i += kFoldAhead) {
            V x[kAt][kFoldAhead];
#pragma unroll
            for (int u = 0; u < kFoldAhead; u++)
#pragma unroll
                for (int a = 0; a < kAt; a++)
                    if (has[a]) x[a][u] = reinterpret_cast<const V *>(row(i + u))[v + a * l.stride];
#pragma unroll
            for (int u = 0; u < kFoldAhead; u++)
#pragma unroll
                for (int a = 0; a < kAt; a++)
#pragma unroll
                    for (int e = 0; e < kN; e++)
                        if (has[a]) acc[a][e] = step(acc[a][e], i + u, to_acc(x[a][u].v[e]));
        }
        for (; i < rows; i++) {
            V x[kAt];
#pragma unroll
            for (int a = 0; a < kAt; a++)
                if (has[a]) x[a] = reinterpret_cast<const V *>(row(i))[v + a * l.stride];
#pragma unroll
            for (int a = 0; a < kAt; a++)
#pragma unroll
                for (int e = 0; e < kN; e++)
                    if (has[a]) acc[a][e] = step(acc[a][e], i, to_acc(x[a].v[e]));
        }
#pragma unroll
        for (int a = 0; a < kAt; a++) {
            if (!has[a]) continue;
            V y;
#pragma unroll
            for (int e = 0; e < kN; e++) y.v[e] = from_acc<T>(acc[a][e]);
            reinterpret_cast<V *>(out)[v + a * l.stride] = y;
        }
    }
}


// The smallest of a token's `top_k` wire rows `rows` above `last`, or -1
// past the largest: in turn, its distinct rows ascending (ascending PE).
__device__ __forceinline__ int64_t next_wire_row(const int64_t *rows, int top_k, int64_t last) {
    int64_t next = -1;
    for (int j = 0; j < top_k; j++)
        if (rows[j] > last && (next < 0 || rows[j] < next)) next = rows[j];
    return next;
}

// A token's distinct wire rows (its `top_k` slots' `rows`, top_k at most
// 64), ascending (ascending PE), into `held`; their count (a warp, two
// slots a lane: the slots are loaded at once, where `next_wire_row`'s
// search goes through them one by one for each row).
__device__ __forceinline__ int token_wire_rows(const int64_t *rows, int top_k, int64_t *held) {
    const int lane = threadIdx.x % 32;
    const int64_t r0 = lane < top_k ? rows[lane] : -1, r1 = lane + 32 < top_k ? rows[lane + 32] : -1;
    // A slot's row counts if no slot before has it; its place is the
    // count of the distinct rows below it.
    bool first0 = r0 >= 0, first1 = r1 >= 0;
    for (int i = 0; i < top_k; i++) {
        const int64_t x = __shfl_sync(~0u, i < 32 ? r0 : r1, i % 32);
        first0 &= !(i < lane && x == r0);
        first1 &= !(i < lane + 32 && x == r1);
    }
    int below0 = 0, below1 = 0;
    for (int i = 0; i < top_k; i++) {
        const int64_t x = __shfl_sync(~0u, i < 32 ? (first0 ? r0 : -1) : (first1 ? r1 : -1), i % 32);
        below0 += x >= 0 && x < r0;
        below1 += x >= 0 && x < r1;
    }
    if (first0) held[below0] = r0;
    if (first1) held[below1] = r1;
    return __popc(__ballot_sync(~0u, first0)) + __popc(__ballot_sync(~0u, first1));
}

// Each of the `nt` tokens' partials, which came back into `m.send` at
// the token's wire rows (`m.slot_rows`), summed in ascending PE order
// (ascending wire row) and rounded once into `m.out`, a block a chunk of
// a token (whole block, every block). `arrived()` (whole block, ending in
// a barrier) waits until the partials are in: the block's first token's
// rows are read before it.
template <typename T, typename Arrived>
__device__ void combine_tokens(const TeamSync &t, const MoeLayer &m, int64_t nt, Arrived arrived) {
    using A = typename Acc<T>::type;
    const int64_t *slot_rows = t.mine<int64_t>(m.slot_rows);
    const uint8_t *back = t.mine<uint8_t>(m.send);
    const int64_t row_bytes = m.hidden * static_cast<int64_t>(sizeof(T)), chunks = pieces_of(nt, row_bytes);
    const int64_t out_stride = m.out_stride > 0 ? m.out_stride : row_bytes;
    const bool vectors = m.top_k <= kLayerSharedSlots && row_bytes % 16 == 0 && m.back_stride % 16 == 0 &&
                         out_stride % 16 == 0 && aligned16(back) && aligned16(t.mine<uint8_t>(m.out));
    // The token's distinct wire rows, ascending (ascending PE).
    __shared__ int64_t held[kLayerSharedSlots];
    __shared__ int nheld;
    bool in = false;
    for (int64_t w = blockIdx.x; w < nt * chunks; w += gridDim.x) {
        const int64_t tok = w / chunks;
        const Range b = piece_bytes(row_bytes, w % chunks, chunks);
        T *out = t.mine<T>(m.out + tok * out_stride);
        const int64_t *rows = slot_rows + tok * m.top_k;
        if (vectors) {
            __syncthreads();  // the chunk before is done with held
            if (threadIdx.x < 32) {
                const int k = token_wire_rows(rows, m.top_k, held);
                if (threadIdx.x == 0) nheld = k;
            }
            if (in) {
                __syncthreads();
            } else {
                arrived();
                in = true;
            }
            fold_vectors(
                out, b.lo / 16, b.hi / 16, nheld,
                [&](int i) { return reinterpret_cast<const T *>(back + held[i] * m.back_stride); },
                [](A acc, int, A x) { return add(acc, x); });
            continue;
        }
        if (!in) {
            arrived();
            in = true;
        }
        for (uint64_t h = b.lo / sizeof(T) + threadIdx.x; h < b.hi / sizeof(T); h += blockDim.x) {
            A acc = 0;
            // The token's distinct wire rows, ascending: ascending PE.
            for (int64_t r = next_wire_row(rows, m.top_k, -1); r >= 0; r = next_wire_row(rows, m.top_k, r))
                acc = add(acc, to_acc(reinterpret_cast<const T *>(back + r * m.back_stride)[h]));
            out[h] = from_acc<T>(acc);
        }
    }
    if (!in) arrived();
}
template <typename T> __device__ void combine_tokens(const TeamSync &t, const MoeLayer &m, int64_t nt) {
    combine_tokens<T>(t, m, nt, [] { __syncthreads(); });
}
}  // namespace k
}  // namespace shmem
