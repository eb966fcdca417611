// The MoE all-to-all-v (1D, 2D dispatch, 2D combine; see shmem/src/moe.rs
// for the semantics), in one of three forms on the caller's stream.
//
// One kernel (`shmem_a2av_fused_*`, moe/a2av_fused.cu; a team whose peers are
// all reached over NVLink, and splits that fit its packets): block 0 of
// every PE stores its splits into every peer's packets (`A2avPackets`),
// each word with the operation's flag, so a split's arrival is its own
// signal and no barrier runs first; every block waits for every PE's
// splits, checks the *whole* exchange in its shared memory (the same data
// everywhere, so every block of every PE reaches the same verdict), plans
// its share of the sends, and pushes it, then signals as the move kernel
// does.
//
// Two kernels (any team, RMA included):
// 1. `shmem_a2av_plan` (moe/a2av_plan.cu; one block): a barrier (every PE's
//    splits and input are ready, and its output is free), then every PE
//    copies every PE's splits into its own staging, checks the whole
//    exchange, and, if it is good, writes its out_splits_offsets and its
//    send plan (where each of its chunks lands); if not, it writes nothing
//    but the verdict and an error record the host reads later.
// 2. `shmem_a2av_move` (moe/a2av_move.cu; many blocks): pushes the planned
//    chunks — stores through NVLink addresses or RMA puts — then signals
//    every peer and waits for every peer's signal, as the all-to-all
//    kernel does.
//
// The line kernel (`shmem_a2av_lines_*`, moe/a2av_lines.cu; the world team
// over NVLink, an input that fits the low-latency buffer): splits and rows
// go out in 128-byte lines as the kernel starts; every block checks and
// plans as the one kernel does, and takes the lines as they arrive.
//
// An eager call is agreed on the device: the first kernel of each form
// begins with `a2av_agreed` (the members' rows, core/agree.cuh), and where it
// fails every PE's kernels skip the call, having written nothing (the
// two-kernel form's plan kernel leaves the verdict for the data kernel).
// Captured calls carry no agreement.
//
// Nothing is read from the host, so every form can be captured in a CUDA
// graph and replayed with new splits. This header holds what the forms
// share: the agreement, the check of the whole exchange, the plan and the
// sends.
#pragma once
#include "core/common.cuh"
#include "core/phases.cuh"

namespace shmem {
namespace k {

// The kernels' bodies are made once for each kind (`K`), so that none of
// their steps branches on it; `kAnyKind` reads it from the arguments.
constexpr int kAnyKind = -1;

template <int K> __device__ __forceinline__ int kind_of(const A2av &a) { return K == kAnyKind ? a.kind : K; }

// Whether this PE goes on with the call (whole block, every block of the
// first kernel of a form): not where an agreement that covers the call
// failed (`a.skip_if`, written by a kernel before on the stream), and
// only where every member made the same call (`agree`, with the call's
// row; at once without one). The same verdict on every PE, so all skip
// or none does.
__device__ __forceinline__ bool a2av_agreed(const TeamSync &t, const A2av &a) {
    if (a.skip_if != 0 && *t.mine<volatile int64_t>(a.skip_if) != 0) return false;
    return agree(t);
}

// This PE's staging (global memory) for the two-kernel form, in 64-bit
// words: the verdict, the data kernel's active blocks, every PE's splits
// (and offsets) as fetched (`w` words each), the work arrays (below) where
// they do not fit in the plan kernel's shared memory, and the send plan:
// for each destination `d` and each of its `ne` chunks, {source row,
// destination row, rows, first row of the chunk among this PE's rows for
// `d`}. The one-kernel form keeps the same arrays in each block's shared
// memory.
//
// Work arrays, `n` segments of `m + 1` words each: `rp[s]`, the rows of
// PE s's splits in its order, then their exclusive prefix sums (the last
// word: all it sends); `op[d]`, the rows PE d receives in its output order
// (padding added to the last chunk of each 2D expert), then their
// exclusive prefix sums: where each chunk lands, and (the last word) all
// it receives.
struct A2avTable {
    uint64_t *base;
    int n, m, w;
    int64_t *staged;  // every PE's splits: in shared memory, or `fetched`
    uint64_t *work;   // rp then op: in shared memory, or after `fetched`
    uint64_t *plans;  // the send plan: in shared memory, or after the work arrays
    __device__ uint64_t *verdict() const { return base; }
    __device__ uint64_t *active_blocks() const { return base + 1; }
    __device__ int64_t *fetched(int pe) const {
        return reinterpret_cast<int64_t *>(base + 2) + static_cast<uint64_t>(pe) * w;
    }
    __device__ int64_t *splits(int pe) const { return staged + static_cast<uint64_t>(pe) * w; }
    __device__ uint64_t *rp(int s) const { return work + static_cast<uint64_t>(s) * (m + 1); }
    __device__ uint64_t *op(int d) const { return work + static_cast<uint64_t>(n + d) * (m + 1); }
    __device__ uint64_t *plan(int d, int e, int ne) const { return plans + 4 * (static_cast<uint64_t>(d) * ne + e); }
};

template <int K> __device__ __forceinline__ int split_words(const A2av &a, int m) {
    return kind_of<K>(a) == A2av2dOffset ? 2 * m : m;
}

// The two-kernel form's table, in this PE's staging.
__device__ __forceinline__ A2avTable a2av_table(const TeamSync &t, const A2av &a) {
    int m = t.n * a.ne;
    uint64_t *base = t.mine<uint64_t>(a.table);
    int w = split_words<kAnyKind>(a, m);
    int64_t *fetched = reinterpret_cast<int64_t *>(base + 2);
    uint64_t *work = base + 2 + static_cast<uint64_t>(t.n) * w;
    return {base, t.n, m, w, fetched, work, work + 2ull * t.n * (m + 1)};
}

// The one-kernel form's table: every array in the block's dynamic shared
// memory (sized by `Kernels::all_to_all_v` in kernels.rs), nothing in global.
template <int K>
__device__ __forceinline__ A2avTable a2av_shared_table(const TeamSync &t, const A2av &a, uint64_t *shared) {
    int m = t.n * a.ne;
    int w = split_words<K>(a, m);
    uint64_t *work = shared + static_cast<uint64_t>(t.n) * w;
    return {nullptr, t.n, m, w, reinterpret_cast<int64_t *>(shared), work, work + 2ull * t.n * (m + 1)};
}

__device__ __forceinline__ uint64_t sat_add(uint64_t a, uint64_t b) { return a > ~0ull - b ? ~0ull : a + b; }

// Exclusive prefix sums, saturating, of `segments` runs of `len` words,
// word i of run g being `word(g, i)`, into `a`, run g at a + g × (len + 1)
// and its last word the run's whole (saturated) sum: a warp per run, 32
// words at a time, each computing its words as it scans; then `end(g,
// sum)` in each lane of the run's warp.
template <typename Word, typename End>
__device__ __forceinline__ void segmented_exclusive_scan(uint64_t *a, int segments, int len, Word word, End end) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int g = warp; g < segments; g += warps) {
        uint64_t *p = a + static_cast<uint64_t>(g) * (len + 1), carry = 0;
        for (int base = 0; base < len; base += 32) {
            int i = base + lane;
            uint64_t incl = i < len ? word(g, i) : 0;
            for (int off = 1; off < 32; off <<= 1) {
                uint64_t o = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off) incl = sat_add(incl, o);
            }
            uint64_t excl = __shfl_up_sync(0xffffffffu, incl, 1);
            if (i < len) p[i] = lane == 0 ? carry : sat_add(carry, excl);
            carry = sat_add(carry, __shfl_sync(0xffffffffu, incl, 31));
        }
        if (lane == 0) p[len] = carry;
        end(g, carry);
    }
}

// The rows of `rows` rounded up to a multiple of `align`, at least
// `align` (a mask where `align` is a power of 2, as it most often is).
__device__ __forceinline__ uint64_t padded(uint64_t rows, uint64_t align) {
    uint64_t r = (align & (align - 1)) == 0 ? (rows + align - 1) & ~(align - 1) : div64(rows + align - 1, align) * align;
    return r < align ? align : r;
}

// d's reciprocal for `div_by`: one approximate instruction, within 1 ulp
// (2^-23 of it) for the d >= 1 here.
__device__ __forceinline__ float reciprocal(int d) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(static_cast<float>(d)));
    return r;
}

// x / d for 0 <= x < 2^21 and d >= 1, by a multiplication with `r`,
// d's `reciprocal`: x = q × d + k puts (x + 1/2) / d between q + 1/(2d)
// and q + 1 − 1/(2d), and the reciprocal's error and the product's
// rounding move it by less than 1.5 × 2^-23 × (x + 1/2) / d < 1/(2d).
// Larger x divide.
__device__ __forceinline__ int div_by(int x, int d, float r) {
    return x < (1 << 21) ? __float2int_rz((static_cast<float>(x) + 0.5f) * r) : x / d;
}

__device__ __forceinline__ unsigned long long err_code(unsigned long long cls, int pe, uint64_t index) {
    return cls << kA2avErrClassShift | static_cast<unsigned long long>(pe) << kA2avErrPeShift |
           (index & kA2avErrIndexMask);
}

// Rows of entry `i` of PE `s` (negative ones count as 0 once reported).
__device__ __forceinline__ uint64_t rows_of(const A2avTable &tb, int s, int i) {
    int64_t r = tb.splits(s)[i];
    return r < 0 ? 0 : static_cast<uint64_t>(r);
}

// The (source, entry of that source's splits) of output entry `j` of PE
// `d`, in output order; `rn` and `rne` are n's and ne's reciprocals
// (`div_by`).
__device__ __forceinline__ void out_entry(int kind, int n, float rn, int ne, float rne, int d, int j, int *s, int *i) {
    if (kind == A2avV) {
        *s = j, *i = d;
    } else if (kind == A2av2d) {
        const int e = div_by(j, n, rn);  // j = e × n + s
        *s = j - e * n, *i = d * ne + e;
    } else {
        const int s0 = div_by(j, ne, rne);  // j = s × ne + e
        *s = s0, *i = (j - s0 * ne) * n + d;
    }
}

// Word j of work run g (see `A2avTable`; a negative split counts as 0
// here, and fails the check): run g < n is `rp[g]`, run n + d `op[d]`
// (2D: the last chunk of each expert's block carries its padding).
template <int K>
__device__ __forceinline__ uint64_t work_rows(const A2av &a, const A2avTable &tb, float rn, float rne, int g, int j) {
    const int n = tb.n;
    if (g < n) return rows_of(tb, g, j);
    int s, i;
    out_entry(kind_of<K>(a), n, rn, a.ne, rne, g - n, j, &s, &i);
    uint64_t rows = rows_of(tb, s, i);
    if (kind_of<K>(a) == A2av2d && s == n - 1) {
        // The block of expert i % ne of PE g - n: n chunks, one per source.
        uint64_t sum = 0;
        for (int y = 0; y < n; y++) sum = sat_add(sum, rows_of(tb, y, i));
        uint64_t len = sum > ~0ull - a.major_align ? ~0ull : padded(sum, a.major_align);
        rows = sat_add(rows, len - sum);
    }
    return rows;
}

// What is wrong with entry i of PE s's splits that the entry shows by
// itself (its sign; the combine's offset, against the entry before and
// the input), or ~0; `*v` is the offending number.
template <int K>
__device__ __forceinline__ unsigned long long split_error(const A2av &a, const A2avTable &tb, int s, int i,
                                                          long long *v) {
    const int64_t *sp = tb.splits(s);
    const int64_t r = sp[i];
    *v = r;
    if (r < 0) return err_code(NegativeSplit, s, i);
    if (kind_of<K>(a) != A2av2dOffset) return ~0ull;
    const int m = tb.m;
    const int64_t off = sp[m + i];
    *v = off;
    if (off < 0) return err_code(NegativeOffset, s, i);
    if (i > 0 && sp[m + i - 1] >= 0 && static_cast<uint64_t>(off) < sat_add(sp[m + i - 1], rows_of(tb, s, i - 1)))
        return err_code(OffsetBackwards, s, i);
    *v = r;
    return sat_add(off, r) > a.in_rows ? err_code(PastInput, s, i) : ~0ull;
}

// What is wrong with entry x of the exchange, or ~0: for x < n × m,
// entry x % m of PE x / m's splits (its chunk lies in its input, in
// order); for the n after, PE x - n × m's output (it holds what it
// receives). `*v` is the offending number. After the sums.
template <int K>
__device__ __forceinline__ unsigned long long entry_error(const A2av &a, const A2avTable &tb, int x, long long *v) {
    const int n = tb.n, m = tb.m;
    if (x >= n * m) {
        const int d = x - n * m;
        uint64_t total = tb.op(d)[m];
        *v = total > (~0ull >> 1) ? (~0ull >> 1) : total;
        return total > a.out_rows ? err_code(PastOutput, d, 0) : ~0ull;
    }
    const int s = x / m, i = x % m;
    const unsigned long long c = split_error<K>(a, tb, s, i, v);
    if (c != ~0ull || kind_of<K>(a) == A2av2dOffset) return c;
    return sat_add(tb.rp(s)[i], *v) > a.in_rows ? err_code(PastInput, s, i) : ~0ull;
}

// The work arrays, as their exclusive prefix sums, once every PE's splits
// are staged; and whether anything is wrong with the exchange (whole
// block; the same in every thread; one barrier for both). The scan's
// warps check as they go: the entries by themselves (`split_error`), and
// the runs' sums: a PE's output must hold all it receives (op's sum), and
// (but for the combine, whose chunks are placed by their offsets) its
// input all it sends (rp's sum: no chunk ends past the input if the last
// does not, the rows being non-negative where nothing else failed).
// With `busiest` (in shared memory, zeroed before a barrier before this),
// the most rows a PE sends, for `a2av_active`.
template <int K>
__device__ __forceinline__ bool a2av_sums(const A2av &a, const A2avTable &tb, unsigned long long *busiest = nullptr) {
    const int n = tb.n, m = tb.m;
    const float rn = reciprocal(n), rne = reciprocal(a.ne);
    bool bad = false;
    segmented_exclusive_scan(
        tb.work, 2 * n, m,
        [&](int g, int j) {
            long long v;
            if (g < n) bad |= split_error<K>(a, tb, g, j, &v) != ~0ull;
            return work_rows<K>(a, tb, rn, rne, g, j);
        },
        [&](int g, uint64_t sum) {
            if (g >= n) {
                bad |= sum > a.out_rows;
                return;
            }
            if (kind_of<K>(a) != A2av2dOffset) bad |= sum > a.in_rows;
            if (busiest != nullptr && threadIdx.x % 32 == 0) atomicMax(busiest, sum);
        });
    phase_mark("scan");
    return __syncthreads_or(bad);
}

// The first error of the whole exchange (by class, PE, entry), the same
// in every thread, or ~0 when it is good; `*value` is its offending
// number. Whole block, after `a2av_sums`.
template <int K> __device__ unsigned long long a2av_first_error(const A2av &a, const A2avTable &tb, long long *value) {
    __shared__ unsigned long long first;
    __shared__ long long first_value;
    if (threadIdx.x == 0) first = ~0ull, first_value = 0;
    unsigned long long code = ~0ull;
    long long v = 0;
    for (int x = threadIdx.x; x < tb.n * (tb.m + 1); x += blockDim.x) {
        long long xv;
        unsigned long long c = entry_error<K>(a, tb, x, &xv);
        if (c < code) code = c, v = xv;
    }
    __syncthreads();
    if (code != ~0ull) atomicMin(&first, code);
    __syncthreads();
    if (code != ~0ull && code == first) first_value = v;
    __syncthreads();
    *value = first_value;
    unsigned long long verdict = first;
    __syncthreads();  // `first` is read before any thread may set it again
    return verdict;
}

// Records a failed check for the host (one thread). The code names the
// team's member; the record names its world PE (`pes`: the team's), as
// the host names PEs.
inline __device__ void a2av_report(const A2av &a, const int *pes, unsigned long long code, long long value) {
    if (!a.error) return;
    constexpr unsigned long long kPeMask = (1ull << (kA2avErrKindShift - kA2avErrPeShift)) - 1;
    const unsigned long long member = code >> kA2avErrPeShift & kPeMask;
    code = (code & ~(kPeMask << kA2avErrPeShift)) | static_cast<unsigned long long>(pes[member]) << kA2avErrPeShift;
    // Host-mapped: the host reads it without synchronising.
    volatile A2avError *e = reinterpret_cast<volatile A2avError *>(a.error);
    if (e->count == 0) {
        e->code = code | static_cast<unsigned long long>(a.kind) << kA2avErrKindShift;
        e->value = value;
        e->limit = code >> kA2avErrClassShift == PastOutput ? a.out_rows : a.in_rows;
    }
    __threadfence_system();
    e->count = e->count + 1;
}

// A bad exchange's record (whole block, after `a2av_sums`; block 0
// writes it).
template <int K> __device__ void a2av_report_first(const TeamSync &t, const A2av &a, const A2avTable &tb) {
    long long value;
    unsigned long long first = a2av_first_error<K>(a, tb, &value);
    if (blockIdx.x == 0 && threadIdx.x == 0) a2av_report(a, t.pes, first, value);
}

// What this PE receives, into its out_splits_offsets (after a good
// check): output entry j = q × inner + r, a warp a q and a lane an r
// (2D: expert q, source r; the combine: source q, expert r; 1D: source
// r), from the block's warp n on (at most its middle one), so that the
// first warps, which plan the sends, and the last, which plan the line
// kernel's receipts, go on beside.
template <int K> __device__ void a2av_write_so(const TeamSync &t, const A2av &a, const A2avTable &tb) {
    const int n = tb.n, m = tb.m, ne = a.ne, me = t.rank, kind = kind_of<K>(a);
    const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
    const int outer = kind == A2avV ? 1 : kind == A2av2d ? ne : n, inner = kind == A2av2d || kind == A2avV ? n : ne;
    int64_t *so = t.mine<int64_t>(a.out_so);
    // This warp's first q, with no division on the way.
    int q = static_cast<int>(threadIdx.x / 32) - min(n, warps / 2);
    if (q < 0) q += warps;
    for (; q < outer; q += warps)
        for (int r = lane; r < inner; r += 32) {
            const int j = q * inner + r;
            const int s = kind == A2av2dOffset ? q : r, i = kind == A2avV ? me : kind == A2av2d ? me * ne + q : r * n + me;
            // Both loads before either store (a store through a generic
            // address would otherwise hold the second load back).
            const int64_t rows = tb.splits(s)[i], at = static_cast<int64_t>(tb.op(me)[j]);
            so[j] = rows;
            so[m + j] = at;
        }
}

// Where each of this PE's chunks goes, into the send plan (after a good
// check): for chunk e for destination d (entry i of this PE's splits,
// output entry j there), {source row, destination row, rows, first row
// among this PE's rows for d}. 1D: a thread a chunk (one a
// destination); 2D: a warp a destination (the block's first warps), a
// lane a chunk, no division on the way.
template <int K> __device__ void a2av_plan_sends(const TeamSync &t, const A2av &a, const A2avTable &tb) {
    const int n = tb.n, m = tb.m, ne = a.ne, kind = kind_of<K>(a), me = t.rank;
    const int64_t *mine = tb.splits(me);
    if (kind == A2avV) {
        for (int d = threadIdx.x; d < n; d += blockDim.x) {
            // (Every load before the plan's stores, which could otherwise
            // alias them, here and below.)
            const uint64_t src = tb.rp(me)[d], dst = tb.op(d)[me], rows = mine[d];
            uint64_t *p = tb.plan(d, 0, ne);
            p[0] = src, p[1] = dst, p[2] = rows, p[3] = 0;
        }
        return;
    }
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int d = threadIdx.x / 32; d < n; d += warps) {
        uint64_t before = 0;  // the combine: rows of d's chunks before this 32
        for (int e0 = 0; e0 < ne; e0 += 32) {
            const int e = e0 + lane;
            const bool live = e < ne;
            const int i = kind == A2av2d ? d * ne + e : e * n + d;
            // Not negative: the check passed.
            const uint64_t rows = live ? static_cast<uint64_t>(mine[i]) : 0;
            uint64_t *p = tb.plan(d, e, ne);
            if (kind == A2av2d) {
                if (live) {
                    const uint64_t src = tb.rp(me)[i], dst = tb.op(d)[e * n + me], first = tb.rp(me)[d * ne];
                    p[0] = src, p[1] = dst, p[2] = rows, p[3] = src - first;
                }
            } else {
                // The combine's chunks lie where their offsets say: the
                // first rows are summed.
                const uint64_t src = live ? mine[m + i] : 0, dst = live ? tb.op(d)[me * ne + e] : 0;
                const uint64_t incl = warp_inclusive_sum(rows);
                if (live) p[0] = src, p[1] = dst, p[2] = rows, p[3] = before + incl - rows;
                before += __shfl_sync(0xffffffffu, incl, 31);
            }
        }
    }
}

// The one-kernel forms' plan, after `a2av_sums` found the exchange good
// (whole block; block 0 also writes this PE's out_splits_offsets):
// the send plan on the first threads, `also` (the line kernel's receipts)
// beside it, then a barrier.
template <int K, typename Also>
__device__ __forceinline__ void a2av_plan(const TeamSync &t, const A2av &a, const A2avTable &tb, Also also) {
    phase_mark("verdict");
    a2av_plan_sends<K>(t, a, tb);
    also();
    if (blockIdx.x == 0) a2av_write_so<K>(t, a, tb);
    phase_mark("plans");
    __syncthreads();
    phase_mark("plans_sync");
}

// The data blocks that work: by what the busiest PE sends (`busiest`
// rows, from `a2av_sums`, after a good check), the same number on every
// PE (the same splits everywhere), so that the idle ones skip their
// channel everywhere.
__device__ __forceinline__ int a2av_active(const A2av &a, uint64_t busiest) {
    uint64_t want = div64(busiest * a.row_bytes + a.block_bytes - 1, a.block_bytes);
    return want < 1 ? 1 : (want > static_cast<uint64_t>(a.blocks) ? a.blocks : static_cast<int>(want));
}

// The local-copy blocks when the host leaves the choice to the kernel:
// half of a small grid, an eighth of a large one, the fastest of 0, 4, 8,
// 12, 16 and 24 over 1 to 4096 tokens of 7168 bf16.
__device__ __forceinline__ int a2av_local_blocks(int active) { return active >= 64 ? active / 8 : active / 2; }

// The last of `n` items whose starts (`start(i)`) never decrease that
// starts at or before `x` (0 when none does).
template <typename Start>
__device__ __forceinline__ int last_at_or_before(int n, Start start, uint64_t x) {
    int i = 0;
    for (int step = n > 1 ? 1 << (31 - __clz(n - 1)) : 0; step > 0; step >>= 1)
        if (i + step < n && start(i + step) <= x) i += step;
    return i;
}

// Part `part` of `parts` of this PE's chunks for destination `d`
// (planned at `plan(d, e)`, 4 words a chunk), split evenly by bytes:
// copied into this PE's output (d is this PE; by the block's first
// `threads` threads, whole warps, or all of them where 0) or sent to d's
// (whole block).
template <typename Plan>
__device__ __forceinline__ void a2av_send_part(const TeamSync &t, const A2av &a, Plan plan, int d, int part,
                                               int parts, unsigned threads = 0) {
    const int ne = a.ne;
    const uint8_t *in = t.mine<uint8_t>(a.input);
    const uint64_t *tail = plan(d, ne - 1);
    uint64_t total = (tail[3] + tail[2]) * a.row_bytes;
    Range r = split((total + 15) / 16, part, parts);
    uint64_t lo = min(r.lo * 16, total), hi = min(r.hi * 16, total);
    if (lo >= hi) return;
    // The first chunk in the part: by one vote of the warp where it can be
    // (a chunk's start never decreases; the first starts at 0).
    int e0 = 0;
    if (ne > 32) {
        e0 = last_at_or_before(ne, [&](int e) { return plan(d, e)[3] * a.row_bytes; }, lo);
    } else if (ne > 1) {
        const int lane = threadIdx.x % 32;
        const unsigned at = __ballot_sync(0xffffffffu, lane < ne && plan(d, lane)[3] * a.row_bytes <= lo);
        e0 = 31 - __clz(at | 1u);
    }
    phase_mark("part");
    for (int e = e0; e < ne; e++) {
        const uint64_t *p = plan(d, e);
        uint64_t at = p[3] * a.row_bytes;
        if (at >= hi) break;
        uint64_t a0 = max(lo, at), a1 = min(hi, at + p[2] * a.row_bytes);
        if (a0 < a1) {
            uint64_t skip = a0 - at;
            const uint8_t *from = in + p[0] * a.row_bytes + skip;
            uint64_t to = a.output + p[1] * a.row_bytes + skip;
            if (d == t.rank) {
                group_copy(t.mine<uint8_t>(to), from, a1 - a0, threadIdx.x, threads == 0 ? blockDim.x : threads);
            } else {
                block_send(t, d, to, from, a1 - a0);
            }
        }
    }
}

// Working block `blockIdx.x` of `active` pushes its share of every
// peer's chunks (planned at `plans`, 4 words a chunk), then copies its
// share of this PE's own, then signals the peers on its channel and waits
// for theirs. With `a.local_blocks` (fewer than `active`), the last that
// many blocks copy this PE's own chunks while the others push, so the
// local copy runs beside the link's transfers instead of after them.
inline __device__ void a2av_push(const TeamSync &t, const A2av &a, const uint64_t *plans, int active, uint64_t epoch) {
    const int ne = a.ne;
    auto plan = [&](int d, int e) { return plans + 4 * (d * ne + e); };
    const int chosen = a.local_blocks < 0 ? a2av_local_blocks(active) : a.local_blocks;
    // (A PE alone has only its own chunks: every block copies.)
    const int local = t.n > 1 && chosen > 0 && chosen < active ? chosen : 0;
    const int remote = active - local;
    const int b = static_cast<int>(blockIdx.x);
    for (int k = 1; k <= t.n; k++) {
        int d = t.rank + k;  // this PE's own chunks last
        if (d >= t.n) d -= t.n;
        // This block's part of destination d's chunks, of how many.
        int part = b, parts = active;
        if (local > 0) {
            bool own = d == t.rank;
            if (own != (b >= remote)) continue;
            part = own ? b - remote : b, parts = own ? local : remote;
        }
        a2av_send_part(t, a, plan, d, part, parts);
    }
    // The move kernels' ending: every peer hears from every working block.
    __syncthreads();
    for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x)
        if (pe != t.rank) signal(t, Data, pe, epoch);
    // Only the threads that wait wait: nothing after this reads what they
    // wait for, and the kernel is over when they are.
    for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x)
        if (pe != t.rank) wait_geq(t.word(Data, blockIdx.x, pe), epoch);
    if (t.rma) {
        __syncthreads();
        if (threadIdx.x == 0) nvshmem_quiet();
    }
}

}  // namespace k
}  // namespace shmem

// A kernel for each kind, shmem_a2av_FORM_v, _2d and _2d_offset, each
// BODY made for its kind (`A2AV_FUSED` and `A2AV_LINES` in kernels.rs),
// after the wait for the kernel before it (launched as a dependent
// launch). Each BODY begins with the call's agreement (`a2av_agreed`).
#define SHMEM_A2AV_KERNELS(FORM, BODY)                                          \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)       \
        shmem_a2av_##FORM##_v(shmem::k::TeamSync t, shmem::k::A2av a) {         \
        shmem::k::follow_stream();                                              \
        BODY<shmem::k::A2avV>(t, a);                                            \
    }                                                                           \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)       \
        shmem_a2av_##FORM##_2d(shmem::k::TeamSync t, shmem::k::A2av a) {        \
        shmem::k::follow_stream();                                              \
        BODY<shmem::k::A2av2d>(t, a);                                           \
    }                                                                           \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)       \
        shmem_a2av_##FORM##_2d_offset(shmem::k::TeamSync t, shmem::k::A2av a) { \
        shmem::k::follow_stream();                                              \
        BODY<shmem::k::A2av2dOffset>(t, a);                                     \
    }
