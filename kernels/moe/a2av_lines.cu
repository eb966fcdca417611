// The line form of the MoE all-to-all-v (see moe/a2av.cuh, and `a2av_lines`
// below): splits and rows travel in 128-byte lines (prims/lines.cuh), each
// line's flag its arrival. A sender's lines for a peer are its splits
// (`split_lines`), then its chunks for that peer in its own order, each
// from a fresh line. Each warp works out where its lines come from by
// itself (`warp_chunks`), from this PE's splits in global memory, so that
// the first line leaves without a barrier; a receiver's chunks, once
// every PE's splits are in, are in the block's shared memory after the
// send plan (`recvs`, [s][e] for PE s's chunk e: {output row, rows, first
// line}).
#include "moe/a2av.cuh"

namespace shmem {
namespace k {

// Rows (lines for a warp's first peer) from which the line kernel's rows
// wait for its splits to leave first (`A2avLines::send`).
constexpr uint64_t kGateMinLines = 1024;

// The line kernel's lines: 8-byte flags, 112 data bytes a line (its
// operations wait on the latency of each line, not on the link, and are
// slower in lines of 120, with 4-byte flags). Its byte loops rolled
// (`load_at`).
using MoeLines = LinesOf<8, true>;

template <int K> struct A2avLines {
    MoeLines ln;
    const A2av &a;
    const A2avTable &tb;
    uint64_t split_lines;
    uint64_t *recvs;

    __device__ A2avLines(const TeamSync &t, uint64_t epoch, const A2av &args, const A2avTable &table)
        : ln(t, epoch), a(args), tb(table), split_lines(ln.lines(static_cast<uint64_t>(table.w) * 8)),
          recvs(table.plans + 4ull * table.n * args.ne) {}

    // Lines of a chunk of `rows` rows (none for none).
    __device__ uint64_t row_lines(uint64_t rows) const {
        return div64(rows * a.row_bytes + MoeLines::kDataBytes - 1, MoeLines::kDataBytes);
    }
    // Entry of a PE's splits that is its chunk `e` for destination `d`.
    __device__ int entry(int d, int e) const {
        return kind_of<K>(a) == A2avV ? d : kind_of<K>(a) == A2av2d ? d * a.ne + e : e * tb.n + d;
    }

    // This PE's chunk `lane` (of at most 32) for destination `d`, from
    // its splits at `mine` (whole warp): its source row, rows and first
    // line, and the lines for `d` in all. Nothing is checked yet, so a
    // chunk is cut to the input and the lines to the room: whatever the
    // splits, nothing is read past the input nor written past the buffer
    // (the check then fails everywhere, and nobody reads what came).
    __device__ uint64_t warp_chunks(const int64_t *mine, int d, uint64_t &src, uint64_t &rows, uint64_t &first) const {
        const int lane = threadIdx.x % 32, ne = a.ne;
        const bool live = lane < ne;
        int64_t r = live ? mine[entry(d, lane)] : 0;
        rows = r < 0 ? 0 : static_cast<uint64_t>(r);
        if (kind_of<K>(a) == A2av2dOffset) {
            int64_t off = live ? mine[tb.m + entry(d, lane)] : 0;
            src = off < 0 ? a.in_rows : static_cast<uint64_t>(off);
        } else {
            // The rows before d's, then those of d's chunks before this one.
            uint64_t before = 0;
            for (int i = lane; i < d * ne; i += 32) before += mine[i] < 0 ? 0 : static_cast<uint64_t>(mine[i]);
            for (int o = 16; o > 0; o >>= 1) before += __shfl_xor_sync(0xffffffffu, before, o);
            src = before + warp_inclusive_sum(rows) - rows;
        }
        rows = src >= a.in_rows ? 0 : min(rows, a.in_rows - src);
        const uint64_t l = row_lines(rows), incl = warp_inclusive_sum(l);
        first = live ? split_lines + incl - l : ~0ull;
        return min(split_lines + __shfl_sync(0xffffffffu, incl, 31), ln.room());
    }

    // This PE's splits, then its chunks, to every peer. Block 0's first
    // warp (its first few, for many PEs and experts) sends the splits to
    // every peer first, then raises this PE's gate (the second word of
    // its two-kernel staging, which this form does not use otherwise) to
    // the operation's epoch; where this PE has kGateMinLines lines or
    // more for its first peer, every warp's rows wait for the gate. Else
    // the splits, which the peers' whole plan waits for, would share the
    // link with every block's rows from the start and arrive behind much
    // of them. Fewer rows go at once: they hold the splits back little,
    // and the wait would cost more than it saves. The gate orders only
    // what enters the link: the rows' lines are right wherever the splits
    // are. No block barrier, which would hold block 0's rows back (after
    // the splits' sends) or the gate (after the rows' plan). The rows by
    // the grid's warps, 4 lines each a pass.
    __device__ void send(const TeamSync &team) const {
        const uint8_t *in = team.mine<uint8_t>(a.input);
        const int64_t *mine = team.mine<int64_t>(a.splits);
        const uint64_t split_bytes = static_cast<uint64_t>(tb.w) * 8;
        const int lane = threadIdx.x % 32;
        volatile uint64_t *gate = team.mine<uint64_t>(a.table) + 1;
        const uint64_t epoch = ln.packets.epoch;
        const uint64_t senders = min((split_lines + 3) / 4, static_cast<uint64_t>(blockDim.x / 32));
        if (blockIdx.x == 0 && threadIdx.x / 32 < senders) {
            for (int k = 1; k < tb.n; k++) {
                const int d = (team.rank + k) % tb.n;
                for (uint64_t b0 = threadIdx.x / 32 * 4; b0 < split_lines; b0 += blockDim.x / 8) {
                    const uint64_t line = ln.line_of(b0);
                    const bool live = line < split_lines;
                    uint64_t x, y;
                    ln.load(reinterpret_cast<const uint8_t *>(mine), split_bytes, line, live, x, y);
                    ln.send(d, line, live, x, y);
                }
            }
            // Only the senders meet (barrier 1; __syncthreads is 0).
            if (senders > 1) {
                asm volatile("bar.sync 1, %0;" ::"r"(static_cast<unsigned>(senders * 32)) : "memory");
            } else {
                __syncwarp();
            }
            if (threadIdx.x == 0) *gate = epoch;
        }
        for (int k = 1; k < tb.n; k++) {
            const int d = (team.rank + k) % tb.n;
            uint64_t src, n_rows, first;
            const uint64_t total = warp_chunks(mine, d, src, n_rows, first);
            // (The first peer's chunks worked out beside the gate's wait;
            // a gate left at another value by the two-kernel form only
            // lets the rows go early.)
            if (k == 1 && total >= split_lines + kGateMinLines) {
                if (lane == 0) {
                    const long long start = clock64();
                    long long next = start + kPeerDiedPollCycles;
                    while (*gate < epoch) {
                        if (wait_gives_up(start, next)) {
                            printf("shmem: an MoE line kernel's rows stopped waiting for its own splits' sending: a PE died or the wait ran out of time\n");
                            __trap();
                        }
                    }
                }
                __syncwarp();
            }
            for (uint64_t b0 = split_lines + ln.base(); b0 < total; b0 += ln.stride()) {
                const uint64_t line = ln.line_of(b0);
                const bool live = line < total;
                // The chunk of this lane's line: the last that starts at
                // or before it (starts never decrease).
                unsigned held = 0;
                for (int g = 0; g < 4; g++) {
                    unsigned m = __ballot_sync(0xffffffffu, first <= b0 + g);
                    if (g == lane / 8) held = m;
                }
                const int e = held == 0 ? 0 : 31 - __clz(held);
                const uint64_t c_src = __shfl_sync(0xffffffffu, src, e), c_rows = __shfl_sync(0xffffffffu, n_rows, e),
                               c_first = __shfl_sync(0xffffffffu, first, e);
                uint64_t x, y;
                ln.load(in + c_src * a.row_bytes, c_rows * a.row_bytes, line - c_first, live, x, y);
                ln.send(d, line, live, x, y);
            }
        }
    }
    // Every PE's chunks for this PE (after `a2av_sums`): a warp a sender,
    // a lane a chunk, the block's last warps first (the send plan starts
    // on its first threads, so the two run side by side).
    __device__ void plan_recvs(const TeamSync &t) const {
        const int me = t.rank, n = tb.n, ne = a.ne, e = threadIdx.x % 32, warps = blockDim.x / 32;
        for (int s = warps - 1 - static_cast<int>(threadIdx.x / 32); s < n; s += warps) {
            const uint64_t rows = e < ne ? rows_of(tb, s, entry(me, e)) : 0, l = row_lines(rows);
            const uint64_t first = split_lines + warp_inclusive_sum(l) - l;
            if (e < ne) {
                int j = kind_of<K>(a) == A2avV ? s : kind_of<K>(a) == A2av2d ? e * n + s : s * ne + e;
                uint64_t *c = recvs + 3 * (static_cast<uint64_t>(s) * ne + e);
                c[0] = tb.op(me)[j];
                c[1] = rows;
                c[2] = first;
            }
        }
    }
    // Every peer's splits, into the block's table (the block's warps).
    __device__ void recv_splits(const TeamSync &t) const {
        const uint64_t per = split_lines, all = (tb.n - 1) * per, split_bytes = static_cast<uint64_t>(tb.w) * 8;
        for (uint64_t b0 = threadIdx.x / 32 * 4; b0 < all; b0 += blockDim.x / 8) {
            const uint64_t x = ln.line_of(b0);
            const bool live = x < all;
            const uint64_t k = div64(x, per), line = x - k * per;
            const int s = (t.rank + 1 + static_cast<int>(live ? k : 0)) % tb.n;
            uint64_t v, w;
            ln.recv(s, line, live, v, w);
            ln.store(reinterpret_cast<uint8_t *>(tb.splits(s)), split_bytes, line, live, v, w);
        }
    }
    // Every peer's chunks for this PE, as their lines arrive, into the
    // output: by `group` warps of the grid, this one `gw` of them, each
    // taking its lines of two passes at once (their loads in flight
    // together).
    __device__ void recv_rows(const TeamSync &t, uint64_t gw, uint64_t group) const {
        uint8_t *out = t.mine<uint8_t>(a.output);
        const uint64_t stride = 4 * group;
        for (int k = 1; k < tb.n; k++) {
            const int s = (t.rank + k) % tb.n;
            const uint64_t *c = recvs + 3ull * s * a.ne;
            const uint64_t total = lines_from(s);
            for (uint64_t b0 = split_lines + 4 * gw; b0 < total; b0 += 2 * stride) {
                uint64_t line[2], x[2], y[2];
                bool live[2];
                const uint64_t *h[2];
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    line[u] = ln.line_of(b0 + u * stride);
                    live[u] = line[u] < total;
                    h[u] = c + 3 * last_at_or_before(a.ne, [&](int e) { return c[3 * e + 2]; }, line[u]);
                }
                ln.recv_lines<2>(s, line, live, x, y);
#pragma unroll
                for (int u = 0; u < 2; u++)
                    ln.store(out + h[u][0] * a.row_bytes, h[u][1] * a.row_bytes, line[u] - h[u][2], live[u], x[u], y[u]);
            }
        }
    }
    // Lines PE `s` sends this PE, its splits' included: to the end of
    // its last chunk for this PE (after the plan).
    __device__ uint64_t lines_from(int s) const {
        const uint64_t *last = recvs + 3 * (static_cast<uint64_t>(s) * a.ne + a.ne - 1);
        return last[2] + row_lines(last[1]);
    }
    // The peers' lines for this PE, past their splits (after the plan).
    __device__ uint64_t rows_in(const TeamSync &t) const {
        uint64_t all = 0;
        for (int s = 0; s < tb.n; s++)
            if (s != t.rank) all += lines_from(s) - split_lines;
        return all;
    }
};

// The line form: the world team, every peer over NVLink, at most 32
// experts per PE, an input whose rows fit the low-latency buffer in lines
// (`moe_lines_fit` in algo.rs). Each PE sends, as it starts, its splits
// and then its rows for each peer in 128-byte lines (`MoeLines`) into
// that peer's low-latency buffer for it: it needs
// nothing from the peers to know where they go there (its chunks for the
// peer in its own order, each from a fresh line), and each warp works out
// its own lines' sources, so the first line leaves without a barrier and
// the rows are on the link while the peers check and plan. Every block
// reads every PE's splits from their lines, checks the whole exchange and
// plans as the one-kernel form does, then copies this PE's own chunks
// and, as their lines arrive, the peers' into the output. No fence,
// signal or barrier: each line's flag is its arrival. A bad exchange
// writes nothing but the record. The buffer is reused as the low-latency
// collectives reuse it (every operation sends every peer its splits). A
// kernel for each kind (`shmem_a2av_lines_*` below).
template <int K> __device__ __forceinline__ void a2av_lines(const TeamSync &team, const A2av &a) {
    if (!a2av_agreed(team, a)) return;
    phase_begin("lines");
    extern __shared__ uint64_t shared_table[];
    A2avTable tb = a2av_shared_table<K>(team, a, shared_table);
    const int w = tb.w, me = team.rank;
    // The block's epoch and this PE's splits (for the check), their loads
    // in flight together.
    const uint64_t counter = lane_ll_counter(team);
    const int64_t *mine = team.mine<int64_t>(a.splits);
    for (int i = threadIdx.x; i < w; i += blockDim.x) tb.splits(me)[i] = mine[i];
    phase_mark("splits");
    A2avLines<K> x(team, warp_ll_epoch(counter), a, tb);
    phase_mark("epoch");
    x.send(team);
    phase_mark("send");
    x.recv_splits(team);
    phase_mark("recv_splits");
    __syncthreads();
    phase_mark("sync");
    if (a2av_sums<K>(a, tb)) {
        a2av_report_first<K>(team, a, tb);
    } else {
        // The own copy's plan and the receipts' side by side.
        a2av_plan<K>(team, a, tb, [&] { x.plan_recvs(team); });
        // This PE's own rows and the peers' lines side by side: the
        // block's first warps copy its part of the own rows while the
        // others take their share of the grid's lines, in proportion to
        // the bytes of each (the same split in every block), so that
        // neither's loads wait for the other's stores.
        const int warps = blockDim.x / 32, w = threadIdx.x / 32;
        const uint64_t *tail = tb.plan(me, a.ne - 1, a.ne);
        const uint64_t in_lines = x.rows_in(team);
        const uint64_t own = (tail[3] + tail[2]) * a.row_bytes, in = in_lines * MoeLines::kDataBytes;
        // (In single precision, rounded: the same in every block, and no
        // 64-bit division, a long subroutine on the way.)
        int copiers = in == 0    ? warps
                      : own == 0 ? 0
                                 : __float2int_rn(__fdividef(static_cast<float>(own) * warps, static_cast<float>(own + in)));
        if (in != 0 && own != 0) {
            // Receivers enough, where the block has them, for every line
            // to be in the first two passes (`recv_rows` takes two at
            // once; a third is another round of waits): at 128 tokens of
            // 7168 bf16 at 2 PEs, about 8200 lines in, the 8 receivers a
            // block the bytes gave would take three passes of 4096.
            const int need = __float2int_ru(__fdividef(static_cast<float>(in_lines), 8.0f * gridDim.x));
            copiers = min(max(copiers, 1), warps - min(max(need, 1), warps - 1));
        }
        if (w < copiers) {
            a2av_send_part(team, a, [&](int d, int e) { return tb.plan(d, e, a.ne); }, me, blockIdx.x, gridDim.x,
                           32 * copiers);
        } else {
            x.recv_rows(team, static_cast<uint64_t>(blockIdx.x) * (warps - copiers) + (w - copiers),
                        static_cast<uint64_t>(gridDim.x) * (warps - copiers));
        }
        phase_mark("rows");
    }
    x.ln.end();
    phase_mark("end");
    phase_end();
}

}  // namespace k
}  // namespace shmem

SHMEM_A2AV_KERNELS(lines, shmem::k::a2av_lines)
