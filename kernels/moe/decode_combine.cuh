// The decode form's combine (phase 1), counted and in lines: a part of
// moe/decode.cu, included by it where these functions stand in its
// order, inside its namespaces (it uses that file's helpers above it).
#pragma once

// Phase 1: the combine (see the top of moe/decode.cu), from its beginning:
// the dispatch's token count and rows from each member are loaded beside
// the operation's number.
template <typename T> __device__ void decode_combine(const TeamSync &t, const MoeLayer &m, const DecodeWords &dw) {
    using A = typename Acc<T>::type;
    const int n = t.n;
    __shared__ int64_t rows_from[kMaxTeam], dispatched;
    __shared__ int32_t first[kMaxTeam + 1];
    __shared__ unsigned long long begun;
    const int64_t *so = t.mine<int64_t>(m.stage_so);
    if (threadIdx.x < n) rows_from[threadIdx.x] = so[threadIdx.x];
    if (threadIdx.x == 96) dispatched = *t.mine<int64_t>(m.state);
    if (threadIdx.x == 0) begun = 0;
    const DecodeOp o = decode_begin(dw, m, nullptr, nullptr);
    const uint64_t op = o.op;
    phase_mark("begin");
    const int64_t nt = dispatched;
    // After a failed dispatch every PE's `stage_so` says so: none writes
    // (each still counts its blocks and waits for the members', as every
    // operation does).
    if (rows_from[0] < 0 || nt < 0) {
        decode_done(dw);
        decode_wait(dw, o);
        decode_end(dw, o, nullptr, 0);
        return;
    }
    if (threadIdx.x == 0) {
        int64_t at = 0;
        for (int s = 0; s < n; s++) {
            first[s] = static_cast<int32_t>(at);
            at += rows_from[s];
        }
        first[n] = static_cast<int32_t>(at);
    }
    __syncthreads();
    const int64_t total = first[n];
    const uint8_t *stage = t.mine<uint8_t>(m.stage);
    const T *outputs = t.mine<T>(m.outputs);
    const int32_t *views = t.mine<int32_t>(m.views);
    const int64_t row_bytes = m.hidden * static_cast<int64_t>(sizeof(T));
    const WarpPieces wp = warp_pieces(total, row_bytes);
    const int64_t chunks = wp.pieces;
    const bool vectors = row_bytes % 16 == 0 && m.back_stride % 16 == 0 && aligned16(outputs);
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, warps = blockDim.x / 32;
    __shared__ WireSlot held_by[kBlockThreads / 32][kDecodeMaxTopK];
    // A warp a unit (a piece of a staged row): its slots on this PE, their
    // outputs weighed and summed in slot order, into the source's row.
    const uint32_t per = static_cast<uint32_t>(chunks);
    for (uint32_t w = blockIdx.x * warps + threadIdx.x / 32; w < total * chunks; w += gridDim.x * warps) {
        const uint32_t r = w / per;
        const Range b = wp.of(row_bytes, w - r * per);
        int s = 0;
        while (s + 1 < n && r >= first[s + 1]) s++;
        const int64_t staged = static_cast<int64_t>(s) * m.max_tokens + r - first[s];
        const uint8_t *row = stage + staged * m.stride;
        const WireSlot *slots = reinterpret_cast<const WireSlot *>(row + m.meta + 8);
        // The slots on this PE, a lane a slot, gathered in slot order into
        // the warp's table (in shared memory: not the stack).
        const int32_t at = lane < m.top_k ? views[staged * m.top_k + lane] : -1;
        const float weight = lane < m.top_k ? slots[lane].weight : 0.0f;
        const unsigned has = __ballot_sync(~0u, at >= 0);
        const int k = __popc(has);
        __syncwarp();  // the unit before is done with the table
        if (at >= 0) held_by[wid][__popc(has & ((1u << lane) - 1))] = WireSlot{at, weight};
        __syncwarp();
        const WireSlot *held = held_by[wid];
        const uint64_t wire_row =
            static_cast<uint64_t>(*reinterpret_cast<const int64_t *>(row + m.meta)) >> kDecodeRowShift;
        const uint64_t off = m.send + wire_row * m.back_stride;
        T *partial = s == t.rank ? t.mine<T>(off) : t.at<T>(s, off);
        if (lane == 0) wait_begun(dw, s, op, &begun);
        __syncwarp();
        if (vectors) {
            fold_vectors<2>(
                partial, b.lo / 16, b.hi / 16, k,
                [&](int i) { return outputs + static_cast<int64_t>(held[i].at) * m.hidden; },
                [&](A acc, int i, A x) { return weigh(acc, held[i].weight, x); }, warp_lanes());
            continue;
        }
        for (uint64_t h = b.lo / sizeof(T) + lane; h < b.hi / sizeof(T); h += 32) {
            A acc = 0;
            for (int i = 0; i < k; i++)
                acc = weigh(acc, held[i].weight, to_acc(outputs[static_cast<int64_t>(held[i].at) * m.hidden + h]));
            partial[h] = from_acc<T>(acc);
        }
    }
    phase_mark("experts");
    decode_done(dw);
    phase_mark("done");
    combine_tokens<T>(t, m, nt, [&] {
        decode_wait(dw, o);
        phase_mark("wait");
    });
    phase_mark("sums");
    decode_end(dw, o, nullptr, 0);
}

// The combine in lines (`MoeLayer::lines`: the world team over NVLink, no
// GPU shared, and a member's partials for this PE within one sender's
// low-latency buffer; `Kernels::moe_decode`). The expert side weighs and
// sums each staged row's experts' outputs, as `decode_combine` does, and
// sends the partial in 128-byte lines (`DecodeLines`) into its source's
// low-latency buffer for this PE: at line 1 + the row's rank among the
// source's rows for this PE × a row's lines, which the source knows too
// (its wire row less its rows for the PEs before). The source sums each
// token's partials in ascending PE order as their lines arrive. No start
// signal, fence or count of blocks: a line's flag is its arrival, and the
// buffers are reused as the low-latency collectives reuse them — every
// PE sends every member a head line (line 0) and waits for every
// member's, so that every operation hears from every member. The
// dispatch's words are not touched: the combine is not one of their
// operations.
// Both phases' lines: 8-byte flags, 112 data bytes a line in 8-byte
// words, so that a word holds whole elements of every type.
using DecodeLines = LinesOf<8, true>;

// Passes of 4 lines a warp takes at once in the combine in lines.
constexpr int kDecodeLinesAt = 2;

// Element `e` of the 8-byte word `w` (of 8 / sizeof(T)), and the word of
// `x`'s elements.
template <typename T> __device__ __forceinline__ T word_elem(uint64_t w, int e) {
    T x;
    memcpy(&x, reinterpret_cast<const char *>(&w) + e * sizeof(T), sizeof(T));
    return x;
}
template <typename T> __device__ __forceinline__ uint64_t word_of(const typename Acc<T>::type *x) {
    uint64_t w = 0;
#pragma unroll
    for (int e = 0; e < static_cast<int>(8 / sizeof(T)); e++) {
        const T y = from_acc<T>(x[e]);
        memcpy(reinterpret_cast<char *>(&w) + e * sizeof(T), &y, sizeof(T));
    }
    return w;
}

template <typename T> __device__ void decode_combine_lines(const TeamSync &t, const MoeLayer &m) {
    using A = typename Acc<T>::type;
    constexpr int kE = 8 / sizeof(T), kU = kDecodeLinesAt;
    const int n = t.n, lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    __shared__ int64_t rows_from[kMaxTeam], sent_to[kMaxTeam], dispatched;
    __shared__ int32_t first[kMaxTeam + 1], sent_first[kMaxTeam + 1];
    __shared__ WireSlot held_by[kBlockThreads / 32][kDecodeMaxTopK];
    __shared__ int64_t wire_by[kBlockThreads / 32][kDecodeMaxTopK];
    const uint64_t counter = lane_ll_counter(t);
    if (threadIdx.x < n) rows_from[threadIdx.x] = t.mine<int64_t>(m.stage_so)[threadIdx.x];
    if (threadIdx.x >= 32 && threadIdx.x < 32 + n) sent_to[threadIdx.x - 32] = t.mine<int64_t>(m.send_splits)[threadIdx.x - 32];
    if (threadIdx.x == 96) dispatched = *t.mine<int64_t>(m.state);
    const DecodeLines ln(t, warp_ll_epoch(counter));
    // The head line to every member, this PE too (block 0's first warp).
    if (blockIdx.x == 0 && wid == 0)
        for (int pe = 0; pe < n; pe++) ln.send(pe, 0, lane < 8, 0, 0);
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t at = 0, out = 0;
        for (int s = 0; s < n; s++) {
            first[s] = at;
            at += rows_from[s] < 0 ? 0 : static_cast<int32_t>(rows_from[s]);
            sent_first[s] = out;
            out += static_cast<int32_t>(sent_to[s]);
        }
        first[n] = at;
        sent_first[n] = out;
    }
    __syncthreads();
    phase_mark("begin");
    const int64_t nt = dispatched;
    const int64_t row_bytes = m.hidden * static_cast<int64_t>(sizeof(T));
    const uint64_t rl = (row_bytes + DecodeLines::kDataBytes - 1) / DecodeLines::kDataBytes;
    // The grid's warps numbered across the blocks first (as the lines'
    // `base`), so that a few units spread over every block's SM; a unit is
    // kU passes of 4 lines of a row.
    const uint64_t gw = static_cast<uint64_t>(wid) * gridDim.x + blockIdx.x;
    const uint64_t grid_warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
    const uint64_t per = (rl + 4 * kU - 1) / (4 * kU), passes = (rl + 3) / 4;
    // After a failed dispatch every PE's `stage_so` says so: none sends a
    // partial (each still sends and waits for the head lines).
    if (rows_from[0] >= 0 && nt >= 0) {
        const uint8_t *stage = t.mine<uint8_t>(m.stage);
        const int32_t *views = t.mine<int32_t>(m.views);
        const uint8_t *outputs = t.mine<uint8_t>(m.outputs);
        const uint64_t total = static_cast<uint64_t>(first[n]);
        for (uint64_t u = gw; u < total * per; u += grid_warps) {
            const uint64_t r = u / per, c = u - r * per;
            int s = 0;
            while (s + 1 < n && r >= static_cast<uint64_t>(first[s + 1])) s++;
            const int64_t rank = static_cast<int64_t>(r) - first[s];
            const int64_t staged = static_cast<int64_t>(s) * m.max_tokens + rank;
            const WireSlot *slots = reinterpret_cast<const WireSlot *>(stage + staged * m.stride + m.meta + 8);
            // The row's slots on this PE, gathered in slot order (as
            // `decode_combine`).
            const int32_t at = lane < m.top_k ? views[staged * m.top_k + lane] : -1;
            const float weight = lane < m.top_k ? slots[lane].weight : 0.0f;
            const unsigned has = __ballot_sync(~0u, at >= 0);
            const int k = __popc(has);
            __syncwarp();  // the unit before is done with the table
            if (at >= 0) held_by[wid][__popc(has & ((1u << lane) - 1))] = WireSlot{at, weight};
            __syncwarp();
            uint64_t line[kU];
            bool live[kU];
            A acc[kU][2][kE];
#pragma unroll
            for (int p = 0; p < kU; p++) {
                line[p] = (c * kU + p) * 4 + lane / 8;
                live[p] = line[p] < rl;
#pragma unroll
                for (int e = 0; e < kE; e++) acc[p][0][e] = acc[p][1][e] = 0;
            }
            // Two rows' words loaded before either is added, in slot order.
            for (int i = 0; i < k; i += 2) {
                uint64_t a[2][kU], b[2][kU];
#pragma unroll
                for (int v = 0; v < 2; v++) {
                    const uint8_t *src = outputs + static_cast<int64_t>(held_by[wid][i + v < k ? i + v : i].at) * row_bytes;
#pragma unroll
                    for (int p = 0; p < kU; p++) ln.load(src, row_bytes, line[p], live[p] && i + v < k, a[v][p], b[v][p]);
                }
#pragma unroll
                for (int v = 0; v < 2; v++) {
                    if (i + v >= k) break;
                    const float w = held_by[wid][i + v].weight;
#pragma unroll
                    for (int p = 0; p < kU; p++)
#pragma unroll
                        for (int e = 0; e < kE; e++) {
                            acc[p][0][e] = weigh(acc[p][0][e], w, to_acc(word_elem<T>(a[v][p], e)));
                            acc[p][1][e] = weigh(acc[p][1][e], w, to_acc(word_elem<T>(b[v][p], e)));
                        }
                }
            }
#pragma unroll
            for (int p = 0; p < kU; p++)
                ln.send(s, 1 + static_cast<uint64_t>(rank) * rl + line[p], live[p], word_of<T>(acc[p][0]),
                        word_of<T>(acc[p][1]));
        }
        phase_mark("experts");
        // The source side: each token's partials, summed in ascending PE
        // order (its distinct wire rows ascending) and rounded once.
        const int64_t *slot_rows = t.mine<int64_t>(m.slot_rows);
        const int64_t out_stride = m.out_stride > 0 ? m.out_stride : row_bytes;
        uint8_t *out = t.mine<uint8_t>(m.out);
        uint8_t *heap = reinterpret_cast<uint8_t *>(t.heap);
        // The grid's warps from its last (so that where the units are
        // fewer than the warps, the sums' warps are not the partials' and
        // load their tokens' rows and wait for the lines while the
        // partials are on the way).
        for (uint64_t u = grid_warps - 1 - gw; u < static_cast<uint64_t>(nt) * passes; u += grid_warps) {
            const uint64_t tok = u / passes, c = u - tok * passes;
            __syncwarp();  // the unit before is done with the table
            const int k = token_wire_rows(slot_rows + tok * m.top_k, m.top_k, wire_by[wid]);
            __syncwarp();
            const uint64_t line = c * 4 + lane / 8;
            const bool live = line < rl;
            // Every partial's line loaded at once, then waited for.
            uint64_t a[kDecodeMaxTopK], b[kDecodeMaxTopK];
            int from[kDecodeMaxTopK];
            uint32_t first_line[kDecodeMaxTopK];
#pragma unroll
            for (int i = 0; i < kDecodeMaxTopK; i++) {
                if (i >= k) break;
                const int64_t w = wire_by[wid][i];
                int d = 0;
                while (d + 1 < n && w >= sent_first[d + 1]) d++;
                from[i] = d;
                first_line[i] = 1 + static_cast<uint32_t>(w - sent_first[d]) * static_cast<uint32_t>(rl);
                a[i] = b[i] = 0;
                __syncwarp();
                if (live) ld_volatile_v2u64(ln.at(heap, d, first_line[i] + line), a[i], b[i]);
            }
            A acc[2][kE];
#pragma unroll
            for (int e = 0; e < kE; e++) acc[0][e] = acc[1][e] = 0;
#pragma unroll
            for (int i = 0; i < kDecodeMaxTopK; i++) {
                if (i >= k) break;
                ln.wait_line(from[i], ln.at(heap, from[i], first_line[i] + line), live, a[i], b[i]);
#pragma unroll
                for (int e = 0; e < kE; e++) {
                    acc[0][e] = add(acc[0][e], to_acc(word_elem<T>(a[i], e)));
                    acc[1][e] = add(acc[1][e], to_acc(word_elem<T>(b[i], e)));
                }
            }
            ln.store(out + tok * out_stride, row_bytes, line, live, word_of<T>(acc[0]), word_of<T>(acc[1]));
        }
        phase_mark("sums");
    }
    // Every member's head line (block 0's first warp).
    if (blockIdx.x == 0 && wid == 0)
        for (int pe = 0; pe < n; pe++) {
            uint64_t a, b;
            ln.recv(pe, 0, lane < 8, a, b);
        }
    ln.end();
}

// The dispatch in lines (`MoeLayer::lines` in phase 0: the native format,
// the world team over NVLink, no GPU shared, and this PE's rows for a
// member within one sender's low-latency buffer; `Kernels::moe_decode`).
// Every block routes this PE's tokens as `decode_dispatch` does. Block 0
// sends every member its head (this PE's rows for it, or its routing
// fault's marker, then its rows of each of the member's experts; lines
// from 0, `lines_head`) and every warp of the grid sends its share of the
// tokens, each (token, destination) a record of lines from a fresh one at
// line `head + rank × (1 + data lines)`: first its metadata (the token
// field and the slots, as a staged row's), then its data. Every block reads
// every member's head, lays the view out, and places its share of the
// rows as their lines arrive, a warp 4 lines of a row's data with the
// row's metadata line, writing the metadata into the staging where the
// combine reads it. No start signal, fence or count of blocks: a line's
// flag is its arrival; the buffers are reused as the low-latency
// collectives reuse them (every member hears every PE's head). The
// placement counters are 0 as each dispatch begins: each pair's last
// count puts its counter back (`count_placed`).

// Lines of the head: 1 + ne words.
__device__ __forceinline__ uint64_t lines_head(int ne) {
    return (8 * static_cast<uint64_t>(1 + ne) + DecodeLines::kDataBytes - 1) / DecodeLines::kDataBytes;
}

__device__ void decode_dispatch_lines(const TeamSync &t, const MoeLayer &m, const DecodeWords &dw, DecodeShared &sh) {
    DecodeRoute &route = sh.route;
    DecodeView &view = sh.view;
    __shared__ int64_t sent[kMaxTeam];
    __shared__ uint64_t meta[kBlockThreads / 32][DecodeLines::kDataBytes / 8];
    __shared__ uint8_t *dsts[kBlockThreads / 32][kDecodeMaxTopK];
    const int n = t.n, ne = m.ne, lane = threadIdx.x % 32, wid = threadIdx.x / 32, warps = blockDim.x / 32;
    const uint64_t counter = lane_ll_counter(t);
    TokenSlots slots;
    if (static_cast<int64_t>(threadIdx.x) < m.max_tokens)
        slots = load_token(m, t.mine<int64_t>(m.ids), t.mine<float>(m.weights), threadIdx.x);
    decode_route_zero(t, m, route);
    if (threadIdx.x == 32) sh.n_tokens = *t.mine<int64_t>(m.n_tokens);
    if (threadIdx.x == 64) sh.epoch = *arrival_words(t, m).epoch + 1;
    const DecodeLines ln(t, warp_ll_epoch(counter));
    __syncthreads();
    phase_mark("begin");
    const int64_t nt = decode_route(t, m, route, sh.n_tokens, slots);
    phase_mark("route");
    constexpr uint64_t kData = DecodeLines::kDataBytes;
    const uint64_t head = lines_head(ne), rl = (m.data_bytes + kData - 1) / kData, row_lines = 1 + rl;
    const uint64_t gw = static_cast<uint64_t>(wid) * gridDim.x + blockIdx.x;
    const uint64_t grid_warps = static_cast<uint64_t>(gridDim.x) * warps;
    if (blockIdx.x == 0) {
        // The head, a warp a member: word 0 the rows (or the marker),
        // word 1 + e the rows of the member's expert e. (Before this PE's
        // source state, which no member waits for.)
        const int64_t marker = kRouteBad - static_cast<int64_t>(route.fault);
        for (int pe = wid; pe < n; pe += warps)
            for (uint64_t b0 = 0; b0 < head; b0 += 4) {
                const uint64_t line = b0 + lane / 8;
                auto word = [&](uint32_t off) -> uint64_t {
                    const uint64_t x = (line * kData + off) / 8;
                    if (x == 0) return static_cast<uint64_t>(nt < 0 ? marker : route.count[pe]);
                    return x <= static_cast<uint64_t>(ne) && nt >= 0 ? route.expert_count[pe * ne + x - 1] : 0;
                };
                ln.send(pe, line, line < head, word(ln.lane_a()), word(ln.lane_b()));
            }
        if (nt >= 0) {
            decode_source_state(t, m, route, nt);
        } else if (threadIdx.x == 0) {
            t.mine<int64_t>(m.state)[0] = -1;
        }
    }
    if (nt > 0) {
        // The rows: a unit a pass of 4 lines of a (token, slot)'s record,
        // sent where the slot is its destination's first (a warp a
        // destination: one warp loading a token's lines once and sending
        // them to each destination in turn took 1.18× the time at 1
        // token).
        const int64_t *ids = t.mine<int64_t>(m.ids);
        const float *w = t.mine<float>(m.weights);
        const uint8_t *tokens = t.mine<uint8_t>(m.tokens);
        const uint64_t passes = (row_lines + 3) / 4, per_token = passes * m.top_k;
        for (uint64_t u = gw; u < static_cast<uint64_t>(nt) * per_token; u += grid_warps) {
            const uint64_t tok = u / per_token, rest = u - tok * per_token;
            const int j = static_cast<int>(rest / passes);
            const uint64_t pass = rest - static_cast<uint64_t>(j) * passes;
            const int d = route.dest[tok][j];
            bool first = true;
            for (int i = 0; i < j; i++) first &= route.dest[tok][i] != d;
            if (!first) continue;
            const int rank = route.rank[tok][j];
            const uint64_t line = pass * 4 + lane / 8;
            const bool live = line < row_lines;
            uint64_t a = 0, b = 0;
            if (live && line == 0) {
                // The record's metadata: the token field, each slot's
                // local expert and rank where it goes to `d`, its weight.
                auto word = [&](uint32_t off) -> uint64_t {
                    const int x = static_cast<int>(off / 8);
                    if (x == 0) return static_cast<uint64_t>(route.first[d] + rank) << kDecodeRowShift | tok;
                    if (x > m.top_k) return 0;
                    const int q = x - 1;
                    const int e = static_cast<int>(ids[tok * m.top_k + q] % ne);  // checked
                    const int32_t at = route.dest[tok][q] == d ? e | route.slot_rank[tok][q] << 8 : -1;
                    return static_cast<uint32_t>(at) | static_cast<uint64_t>(__float_as_uint(w[tok * m.top_k + q])) << 32;
                };
                a = word(ln.lane_a());
                b = ln.flag_lane() ? 0 : word(ln.lane_b());
            } else {
                ln.load(tokens + tok * m.data_bytes, m.data_bytes, line - 1, live, a, b);
            }
            ln.send(d, head + static_cast<uint64_t>(rank) * row_lines + line, live, a, b);
        }
    }
    phase_mark("send");
    // Every member's head, a warp a member.
    for (int s = wid; s < n; s += warps)
        for (uint64_t b0 = 0; b0 < head; b0 += 4) {
            const uint64_t line = b0 + lane / 8;
            const bool live = line < head;
            uint64_t a, b;
            ln.recv(s, line, live, a, b);
            auto put = [&](uint32_t off, uint64_t v) {
                const uint64_t x = (line * kData + off) / 8;
                if (!live) return;
                if (x == 0) {
                    sent[s] = static_cast<int64_t>(v);
                } else if (x <= static_cast<uint64_t>(ne)) {
                    view.pair[(x - 1) * n + s] = static_cast<uint32_t>(v);
                }
            };
            put(ln.lane_a(), a);
            if (!ln.flag_lane()) put(ln.lane_b(), b);
        }
    const ArrivalWords arrivals = arrival_words(t, m);
    const uint64_t epoch = sh.epoch;
    if (!decode_view(t, m, view, sent, arrivals, epoch)) {
        ln.end();
        return;
    }
    // The rows, a unit 4 lines of a row's data, with its metadata line
    // (lanes 0-7), both loaded before either is waited for.
    uint8_t *stage = t.mine<uint8_t>(m.stage);
    int32_t *views = t.mine<int32_t>(m.views);
    uint8_t *recv = t.mine<uint8_t>(m.recv);
    uint8_t *heap = reinterpret_cast<uint8_t *>(t.heap);
    const uint64_t per = (rl + 3) / 4;
    const uint64_t units = static_cast<uint64_t>(view.first[n]) * per;
    for (uint64_t u = gw; u < units; u += grid_warps) {
        const uint64_t r = u / per, c = u - r * per;
        const int s = decode_source(view, n, static_cast<int64_t>(r));
        const int64_t rank = static_cast<int64_t>(r) - view.first[s];
        const uint64_t base = head + static_cast<uint64_t>(rank) * row_lines;
        const uint64_t line = c * 4 + lane / 8;
        const bool live = line < rl, meta_lane = lane < 8;
        const uint64_t *pm = ln.at(heap, s, base), *pd = ln.at(heap, s, base + 1 + line);
        uint64_t ma = 0, mb = 0, a = 0, b = 0;
        __syncwarp();
        if (meta_lane) ld_volatile_v2u64(pm, ma, mb);
        __syncwarp();
        if (live) ld_volatile_v2u64(pd, a, b);
        ln.wait_line(s, pm, meta_lane, ma, mb);
        __syncwarp();  // the unit before is done with the tables
        if (meta_lane) {
            meta[wid][ln.lane_a() / 8] = ma;
            if (!ln.flag_lane()) meta[wid][ln.lane_b() / 8] = mb;
        }
        __syncwarp();
        const uint64_t sw = lane < m.top_k ? meta[wid][1 + lane] : ~0ull;
        const int32_t slot = static_cast<int32_t>(sw & 0xffffffffull);
        const int e = lane < m.top_k && slot >= 0 ? slot & 0xff : -1;
        const int32_t vr = e >= 0 ? view.run[e * n + s] + (slot >> 8) : -1;
        const int64_t staged = static_cast<int64_t>(s) * m.max_tokens + rank;
        if (c == 0) {
            // The staged row's metadata, for the combine.
            uint8_t *row = stage + staged * m.stride;
            if (lane == 0) *wire_token(row, m) = static_cast<int64_t>(meta[wid][0]);
            if (lane < m.top_k) {
                reinterpret_cast<uint64_t *>(wire_slots(row, m))[lane] = sw;
                views[staged * m.top_k + lane] = vr;
            }
        }
        const unsigned has = __ballot_sync(~0u, vr >= 0);
        const int k = __popc(has);
        if (vr >= 0) dsts[wid][__popc(has & ((1u << lane) - 1))] = recv + static_cast<int64_t>(vr) * m.data_bytes;
        __syncwarp();
        ln.wait_line(s, pd, live, a, b);
        for (int q = 0; q < k; q++) ln.store(dsts[wid][q], m.data_bytes, line, live, a, b);
        // The piece is in every block it goes to (the warp's stores before
        // each count, which releases them): count it for each pair.
        __syncwarp();
        if (e >= 0) count_placed(arrivals, e * n + s, view.pair[e * n + s] * static_cast<uint32_t>(per), epoch);
    }
    phase_mark("place");
    // The last block stores the arrival epoch (`decode_end`'s count of
    // blocks done, with no operation of the decode words).
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(dw.done(), 1u) == gridDim.x - 1) {
            *dw.done() = 0;
            *arrivals.epoch = epoch;
        }
    }
    ln.end();
}
