// The MoE layer's gathers and placements (the forwarder's, the source's,
// the receiver's): a part of moe/layer.cu, included by it where these
// functions stand in its order, inside its namespaces (it uses that
// file's helpers and moe/layer_rank.cuh above it).
#pragma once

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
