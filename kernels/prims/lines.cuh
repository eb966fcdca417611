// The line protocol (LL128; world team, every peer over NVLink, the
// low-latency packets' room and epochs): data travels in 128-byte lines,
// each stored by 8 lanes of a warp with one 16-byte store each, so that
// the line is one 128-byte write on the link, and loaded the same way;
// the receiver retries the warp's load until every flag of its lines is
// this operation's. Each 64-byte half of a line carries its own flag, in
// the upper half of the second word of its last lane (lanes 3 and 7): a
// 4-byte flag, so that a line holds 120 data bytes (against 8 of 16 in the
// 8-byte packets), or that whole word (112 data bytes, `LinesOf<8>`):
// for reductions of 8-byte elements, which a 4-byte word would split
// across two lanes, and for the MoE line kernel (`MoeLines` in
// moe/a2av_lines.cu). NCCL's LL128 trusts one flag a line, counting on an
// aligned 128-byte store of a warp to arrive whole; a receiver here saw a
// line's flag while its first 64 bytes still held the buffer's older
// contents, where an earlier operation's packets had ended inside that
// line (spmd's coll::all_to_all::lines_after_packets), as NVIDIA/nccl#2053
// reports of 64-byte halves on GH200. A half's flag is its half's arrival.
//
// The lines of a sender go where its packets would (`LL::slot`), so the
// two protocols share the buffers, the epochs and the argument about
// reuse (every operation sends every peer at least one line). The flag is
// the packet's flag in the word's upper half (and, 8-byte, in its lower):
// whatever lay there before, a packet's or a line's of either layout,
// carries an older flag in that upper half, a zeroed buffer 0.
#pragma once
#include <cstdint>
#include "core/phases.cuh"
#include "prims/ll.cuh"

namespace shmem {
namespace k {

__device__ __forceinline__ void st_volatile_v2u64(uint64_t *p, uint64_t a, uint64_t b) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

__device__ __forceinline__ void ld_volatile_v2u64(const uint64_t *p, uint64_t &a, uint64_t &b) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}

// Where a lane's words lie in a line's data (bytes), 4-byte flags: lanes
// 0–2 and 4–6 16 bytes each from 0 and from 48; lane 3 8 at 96 and 4 at
// 112, lane 7 8 at 104 and 4 at 116 (each 8-byte word 8-aligned in the
// line). 8-byte flags: 16 from 0, 16, 32 (lanes 0–2), 56, 72, 88 (4–6)
// and 8 at 48 and 104 (3 and 7).
// `kRolled`: the MoE line kernel's form (`MoeLines` in moe/a2av_lines.cu): the
// byte loops of its loads and stores rolled (`load_at`), and every line
// taken through them, whole ones too (no `whole` path). Each makes that
// kernel faster and the collectives slower.
template <int kFlagBytes, bool kRolled = false>
struct LinesOf {
    static_assert(kFlagBytes == 4 || kFlagBytes == 8, "a line's flag is 4 or 8 bytes");
    LL packets;  // the team, the epoch, the flag and the slots the lines share
    // The packets' flag in the upper half (and, 8-byte flags, the lower).
    uint64_t flag;
    // Flags a line (one a 64-byte half), lanes a flag, data bytes a line.
    static constexpr int kFlags = 2;
    static constexpr int kLanesPerFlag = 8 / kFlags;
    static constexpr uint64_t kDataBytes = kLineBytes - kFlags * kFlagBytes;
    static_assert(kDataBytes == (kFlagBytes == 4 ? kLineDataBytes : kLineDataBytesWide), "a line's data bytes");
    // Passes a warp takes at once in `send_all` by default (the
    // all-reduce takes one: `reduce_lines` in coll/reduce.cuh).
    static constexpr int kLinesUnroll = 2;

    __device__ LinesOf(const TeamSync &team) : LinesOf(team, block_ll_epoch(team)) {}
    // With this kernel's epoch `e`, read already.
    __device__ LinesOf(const TeamSync &team, uint64_t e) : packets(team, 0) { set_epoch(e); }
    // Without the epoch yet: `send_all` given the counter that
    // `lane_ll_counter` loaded sets it once its first loads are in flight
    // beside the counter's, so that the kernel's start waits for one load
    // instead of two in a row (and for no block barrier).
    struct Later {};
    __device__ LinesOf(const TeamSync &team, Later) : packets(team, 0), flag(0) {}
    // This kernel's epoch from what `lane_ll_counter` loaded (whole warp).
    __device__ void start(uint64_t counter) { set_epoch(warp_ll_epoch(counter)); }
    // The epoch `e`: the packets' and the lines' flags.
    __device__ void set_epoch(uint64_t e) {
        packets.set_epoch(e);
        flag = static_cast<uint64_t>(packets.flag) << 32 | (kFlagBytes == 8 ? packets.flag : 0);
    }
    // Whether a flag lane's second word `b` carries this operation's flag.
    __device__ bool flagged(uint64_t b) const { return kFlagBytes == 8 ? b == flag : b >> 32 == flag >> 32; }
    // A flag lane's second word: its data `b` (4-byte flags) and the flag.
    __device__ uint64_t with_flag(uint64_t b) const { return kFlagBytes == 8 ? flag : (b & 0xffffffffull) | flag; }
    // Lines a sender has in a receiver's buffer.
    __device__ uint64_t room() const { return ll_buffer_bytes(packets.t.n) / kLineBytes; }
    // Lines for `bytes` (at least one, so that every peer hears from every peer).
    __device__ uint64_t lines(uint64_t bytes) const { return bytes == 0 ? 1 : (bytes + kDataBytes - 1) / kDataBytes; }
    // A pass covers 4 lines a warp; `base()` is this warp's first, the
    // lane's line is base + lane / 8 (the loop bound stays warp-uniform).
    // The grid's warps are numbered across the blocks first (warp w of
    // block b is the grid's w * blocks + b), so that a pass's lines, where
    // they are fewer than the grid's warps take, and the lines past a
    // whole pass spread over every block's SM instead of filling the
    // first blocks' warps.
    __device__ uint64_t base() const { return (static_cast<uint64_t>(threadIdx.x / 32) * gridDim.x + blockIdx.x) * 4; }
    __device__ uint64_t stride() const { return static_cast<uint64_t>(gridDim.x) * blockDim.x / 8; }
    __device__ int lane8() const { return threadIdx.x % 8; }
    // Whether this lane's second word holds its half's flag (else data).
    __device__ bool flag_lane() const { return lane8() % kLanesPerFlag == kLanesPerFlag - 1; }
    __device__ uint64_t line_of(uint64_t base) const { return base + (threadIdx.x % 32) / 8; }
    // Byte of this lane's first word (8 bytes) in a line's data.
    __device__ uint32_t lane_a() const {
        const uint32_t l = lane8();
        if (kFlagBytes == 8) return 8 * (2 * l - l / kLanesPerFlag);
        return flag_lane() ? 96 + 8 * (l / kLanesPerFlag) : 16 * (l - l / kLanesPerFlag);
    }
    // Byte of its second: 8 bytes after the first, or for a flag lane
    // (4-byte flags; none with 8-byte) the 4 of its lower half.
    __device__ uint32_t lane_b() const {
        return flag_lane() ? 112 + 4 * (static_cast<uint32_t>(lane8()) / kLanesPerFlag) : lane_a() + 8;
    }
    // The same in `line` of the data.
    __device__ uint64_t offset_a(uint64_t line) const { return line * kDataBytes + lane_a(); }
    __device__ uint64_t offset_b(uint64_t line) const { return line * kDataBytes + lane_b(); }
    // Whether `line` of the `len` bytes at `p` is whole and `p` 8-aligned:
    // then this lane's words are plain loads and stores, without the
    // checks of `load_at` and `store_at` for each, which makes the
    // collectives by lines faster. Not for the MoE line kernel
    // (`kRolled`), which is faster without them.
    static __device__ bool whole(const uint8_t *p, uint64_t len, uint64_t line) {
        return (line + 1) * kDataBytes <= len && reinterpret_cast<uint64_t>(p) % 8 == 0;
    }
    // This lane's 16 bytes of `line` in `sender`'s slots of the heap at `heap`.
    __device__ uint64_t *at(uint8_t *heap, int sender, uint64_t line) const {
        return reinterpret_cast<uint64_t *>(heap + packets.slot(sender, 0) + line * kLineBytes + lane8() * 16);
    }
    // This lane's words of `line` of the `len` bytes at `p` (zero past the
    // end; nothing loaded when not `live`).
    __device__ void load(const uint8_t *p, uint64_t len, uint64_t line, bool live, uint64_t &a, uint64_t &b) const {
        if (!kRolled && live && whole(p, len, line)) {
            const uint8_t *q = p + line * kDataBytes;
            a = *reinterpret_cast<const uint64_t *>(q + lane_a());
            if (!flag_lane())
                b = *reinterpret_cast<const uint64_t *>(q + lane_b());
            else
                b = kFlagBytes == 4 ? *reinterpret_cast<const uint32_t *>(q + lane_b()) : 0;
            return;
        }
        a = live ? load_at<8, kRolled>(p, offset_a(line), len) : 0;
        b = !live                 ? 0
            : !flag_lane()        ? load_at<8, kRolled>(p, offset_b(line), len)
            : kFlagBytes == 4     ? load_at<4, kRolled>(p, offset_b(line), len)
                                  : 0;
    }
    // Stores this lane's words of `line` into the `len` bytes at `p`.
    __device__ void store(uint8_t *p, uint64_t len, uint64_t line, bool live, uint64_t a, uint64_t b) const {
        if (!live) return;
        if (!kRolled && whole(p, len, line)) {
            uint8_t *q = p + line * kDataBytes;
            *reinterpret_cast<uint64_t *>(q + lane_a()) = a;
            if (!flag_lane())
                *reinterpret_cast<uint64_t *>(q + lane_b()) = b;
            else if (kFlagBytes == 4)
                *reinterpret_cast<uint32_t *>(q + lane_b()) = static_cast<uint32_t>(b);
            return;
        }
        store_at<8, kRolled>(p, offset_a(line), len, a);
        if (!flag_lane())
            store_at<8, kRolled>(p, offset_b(line), len, b);
        else if (kFlagBytes == 4)
            store_at<4, kRolled>(p, offset_b(line), len, b);
    }
    // This lane's 16 bytes of `line` into member `pe`'s buffer for this PE:
    // data words `a` and `b`, the flag in `b` for a `flag_lane`.
    // Whole warp: it converges first, so that a line leaves in one store
    // instruction of its 8 lanes, never in parts.
    __device__ void send(int pe, uint64_t line, bool live, uint64_t a, uint64_t b) const {
        const TeamSync &t = packets.t;
        __syncwarp();
        if (live)
            st_volatile_v2u64(at(reinterpret_cast<uint8_t *>(packets.heap_of(pe)), t.rank, line), a,
                              flag_lane() ? with_flag(b) : b);
    }
    // This lane's data words of `line` from member `pe` (whole warp; `live`
    // false for lanes past the last line, which load nothing). The warp
    // converges first, so that each line is read by one load instruction.
    __device__ void recv(int pe, uint64_t line, bool live, uint64_t &a, uint64_t &b) const {
        recv_lines<1>(pe, &line, &live, &a, &b);
    }
    // Reloads this lane's words of the line at `p` (from member `pe`)
    // until the warp's lines all carry the flag (whole warp; each reload
    // one load instruction of the converged warp).
    __device__ void wait_line(int pe, const uint64_t *p, bool live, uint64_t &a, uint64_t &b) const {
        long long start = 0, next = 0;
        while (__any_sync(0xffffffffu, live && flag_lane() && !flagged(b))) {
            if (start == 0) {
                start = clock64();
                next = start + kPeerDiedPollCycles;
            }
            if (wait_gives_up(start, next)) {
                if (live && flag_lane() && !flagged(b))
                    printf("shmem: stopped waiting for a line of a low-latency collective from PE %d: a PE died or the wait ran out of time\n", pe);
                __trap();
            }
            if (live) ld_volatile_v2u64(p, a, b);
        }
    }
    // `recv` of kU lines `line[u]` from member `pe`, their first loads in
    // flight together (whole warp): each load after the warp converges,
    // as in `recv`.
    template <int kU>
    __device__ void recv_lines(int pe, const uint64_t *line, const bool *live, uint64_t *a, uint64_t *b) const {
        const uint64_t *p[kU];
#pragma unroll
        for (int u = 0; u < kU; u++) {
            p[u] = at(reinterpret_cast<uint8_t *>(packets.t.heap), pe, line[u]);
            a[u] = b[u] = 0;
        }
#pragma unroll
        for (int u = 0; u < kU; u++) {
            __syncwarp();
            if (live[u]) ld_volatile_v2u64(p[u], a[u], b[u]);
        }
#pragma unroll
        for (int u = 0; u < kU; u++) wait_line(pe, p[u], live[u], a[u], b[u]);
    }
    // Every line of `in` (`bytes`) to every peer, and into `keep` as well
    // unless it is null (the all-gather's own block, out of place). A warp
    // takes its lines of kUnroll passes at once (by default kLinesUnroll),
    // loading them all before it sends any: past one pass (4 lines a warp of the
    // grid: by default, up to 10240 lines, 1200 KiB, on 128 blocks of 640)
    // the second pass's loads no longer wait for the first pass's sends.
    // With kStart (a `Later` object), every warp first `start`s from
    // `counter`, after its first loads.
    template <bool kStart = false, int kUnroll = kLinesUnroll>
    __device__ void send_all(const uint8_t *in, uint64_t bytes, uint8_t *keep, uint64_t counter = 0) {
        const TeamSync &t = packets.t;
        const uint64_t n_lines = lines(bytes);
        const uint64_t s = stride();
        // The first pass runs in every warp (one past the lines loads
        // nothing and sends nothing), so that every warp starts.
        for (uint64_t b0 = base(), first = 1; first || b0 < n_lines; b0 += kUnroll * s, first = 0) {
            uint64_t line[kUnroll], a[kUnroll], b[kUnroll];
            bool live[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                line[u] = line_of(b0 + u * s);
                live[u] = line[u] < n_lines;
                load(in, bytes, line[u], live[u], a[u], b[u]);
            }
            if (kStart && first) start(counter);
            if (first) {
                phase_mark("load");
                phase_wait(a[0] ^ b[0] ^ a[kUnroll - 1] ^ b[kUnroll - 1]);
                phase_mark("data");
            }
            if (b0 >= n_lines) break;
#pragma unroll 1
            for (int i = 1; i < t.n; i++) {
#pragma unroll
                for (int u = 0; u < kUnroll; u++) send(t.after(i), line[u], live[u], a[u], b[u]);
            }
            if (keep != nullptr) {
#pragma unroll
                for (int u = 0; u < kUnroll; u++) store(keep, bytes, line[u], live[u], a[u], b[u]);
            }
        }
    }
    // Block `pe` of `in` (`bytes` each) to every peer `pe`, every line of
    // it (the first half of the all-to-all and the reduce-scatter).
    __device__ void send_blocks(const uint8_t *in, uint64_t bytes) const {
        const TeamSync &t = packets.t;
        const uint64_t n_lines = lines(bytes);
        for (uint64_t b0 = base(); b0 < n_lines; b0 += stride()) {
            uint64_t line = line_of(b0);
            bool live = line < n_lines;
            for (int i = 1; i < t.n; i++) {
                int pe = t.after(i);
                uint64_t a, b;
                load(in + pe * bytes, bytes, line, live, a, b);
                send(pe, line, live, a, b);
            }
        }
    }
    __device__ void end() const { packets.end(); }
};

// The lines of the collectives but the reductions of 8-byte elements.
using Lines = LinesOf<4>;

}  // namespace k
}  // namespace shmem
