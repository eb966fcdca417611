// The MoE all-to-all-v (1D, 2D dispatch, 2D combine; see shmem/src/moe.rs
// for the semantics), in one of two forms on the caller's stream.
//
// One kernel (`shmem_a2av_fused`; a team whose peers are all reached over
// NVLink, and splits that fit its packets): block 0 of every PE stores its
// splits into every peer's packets (`A2avPackets`), each word with the
// operation's flag, so a split's arrival is its own signal and no barrier
// runs first; every block waits for every PE's splits, checks the *whole*
// exchange in its shared memory (the same data everywhere, so every block
// of every PE reaches the same verdict), plans its share of the sends, and
// pushes it, then signals as the move kernel below does.
//
// Two kernels (any team, RMA included):
// 1. `shmem_a2av_plan` (one block): a barrier (every PE's splits and input
//    are ready, and its output is free), then every PE copies every PE's
//    splits into its own staging, checks the whole exchange, and, if it is
//    good, writes its out_splits_offsets and its send plan (where each of
//    its chunks lands); if not, it writes nothing but the verdict and an
//    error record the host reads later.
// 2. `shmem_a2av_move` (many blocks): pushes the planned chunks — stores
//    through NVLink addresses or RMA puts — then signals every peer and
//    waits for every peer's signal, as the all-to-all kernel does.
//
// Nothing is read from the host, so either form can be captured in a CUDA
// graph and replayed with new splits.
#include "common.cuh"
#include "phases.cuh"

namespace shmem {
namespace k {

// The kernels' bodies are made once for each kind (`K`), so that none of
// their steps branches on it; `kAnyKind` reads it from the arguments.
constexpr int kAnyKind = -1;

template <int K> __device__ __forceinline__ int kind_of(const A2av &a) { return K == kAnyKind ? a.kind : K; }

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

// Records a failed check for the host (one thread).
__device__ void a2av_report(const A2av &a, unsigned long long code, long long value) {
    if (!a.error) return;
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
template <int K> __device__ void a2av_report_first(const A2av &a, const A2avTable &tb) {
    long long value;
    unsigned long long first = a2av_first_error<K>(a, tb, &value);
    if (blockIdx.x == 0 && threadIdx.x == 0) a2av_report(a, first, value);
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

// Inclusive sum of `v` over the warp's lanes (whole warp).
__device__ __forceinline__ uint64_t warp_inclusive_sum(uint64_t v) {
    const int lane = threadIdx.x % 32;
    for (int o = 1; o < 32; o <<= 1) {
        uint64_t u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
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
// measured on 2×H200 (docs/perf.md, session 6) over 1 to 4096 tokens of
// 7168 bf16, with 0, 4, 8, 12, 16 and 24 of them: half of a small grid,
// an eighth of a large one (16 of 128 took 4096 tokens from 106 to 93 µs).
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
__device__ void a2av_push(const TeamSync &t, const A2av &a, const uint64_t *plans, int active, uint64_t epoch) {
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

// The one-kernel form's state, in the team's synchronisation slot after
// its epoch counters (`Layout::slot_bytes` in kernels.rs), zeroed with
// the slot: the operation counter (its own, advanced only by this kernel,
// so that operations alternate between the two packet buffers), a count
// of the blocks done with the current operation, then two buffers, by
// the operation's parity, of kA2avPacketWords 16-byte packets {low half,
// flag, high half, flag}: [sender][word] holds word `word` of `sender`'s
// splits.
//
// A PE writes a buffer again two operations later, after it has received
// every peer's splits of the operation between, which each peer sent when
// that operation's kernel began, after its kernel before (every block of
// which read the buffer) had ended: the low-latency argument of
// prims_ll.cuh. A flag is never 0 (the zeroed buffer) nor that of two
// operations before. The counter is read by every block as it starts and
// advanced by the last block to have read it (the next operation's kernel
// starts after this one ends), so every block sees the same.
struct A2avPackets {
    const TeamSync &t;
    uint64_t base;  // heap offset
    uint64_t op;
    uint32_t flag;
    uint64_t parity;

    uint64_t epoch;  // this block's epoch on its channel (as `begin_epoch`)
    bool last;       // the last block to read the counter (the thread that counted)

    // Reads the counter and this block's epoch, both loads in flight at
    // once and beside whatever the block loaded before (whole block).
    __device__ A2avPackets(const TeamSync &team) : t(team), last(false) {
        uint64_t words = static_cast<uint64_t>(kSignalArrays) * kMaxBlocks * t.n + kEpochCounterSets * kMaxBlocks;
        base = t.sync_offset + (words * 8 + kStateAlign - 1) / kStateAlign * kStateAlign;
        __shared__ uint64_t shared_op, shared_epoch;
        if (threadIdx.x == blockDim.x - 1) {
            uint64_t o = *t.mine<uint64_t>(base), e = *t.epoch_counter(blockIdx.x);
            shared_op = o + 1, shared_epoch = e + 1;
        }
        __syncthreads();
        op = shared_op, epoch = shared_epoch;
        flag = 1 + static_cast<uint32_t>(op % 0xffffffffull);
        parity = op & 1;
    }
    __device__ uint64_t slot(int sender, int word, int w) const {
        return base + kA2avHeaderBytes + (parity * kA2avPacketWords + static_cast<uint64_t>(sender) * w + word) * 16;
    }
    __device__ void send(int pe, int word, int w, int64_t v) const {
        packet_store(t.at<uint4>(pe, slot(t.rank, word, w)), static_cast<uint64_t>(v), flag);
    }
    __device__ int64_t recv(int pe, int word, int w) const {
        uint64_t v = packet_load(t.mine<uint4>(slot(pe, word, w)), flag, "a MoE all-to-all-v's splits", pe);
        return static_cast<int64_t>(v);
    }
    // Counts this block among those that have read the counter (once it
    // has; one thread of the block's last warp, which sent no packet, so
    // that its fence waits on nothing else). The count comes back while
    // the block works; `end` looks at it.
    __device__ void arrive() {
        if (threadIdx.x == blockDim.x - 1) {
            __threadfence();
            last = atomicAdd(t.mine<unsigned int>(base + 8), 1u) == gridDim.x - 1;
        }
    }
    // The last block to arrive advances the counter.
    __device__ void end() const {
        if (last) {
            *t.mine<unsigned int>(base + 8) = 0;
            *t.mine<uint64_t>(base) = op;
        }
    }
};

}  // namespace k
}  // namespace shmem

using shmem::k::A2av;
using shmem::k::TeamSync;

extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_a2av_plan(TeamSync t, A2av a) {
    shmem::k::follow_stream();
    using namespace shmem::k;
    // Every PE's splits and the work arrays, read over and over below: in
    // shared memory where they fit (the host sizes it), else global.
    extern __shared__ uint64_t shared_work[];
    A2avTable tb = a2av_table(t, a);
    const int n = t.n, me = t.rank;
    if (a.shared_splits) {
        tb.staged = reinterpret_cast<int64_t *>(shared_work);
        tb.work = shared_work + static_cast<uint64_t>(n) * tb.w;
    }
    uint64_t epoch = begin_epoch(t);
    __shared__ unsigned long long busiest;  // zeroed before the barriers below
    if (threadIdx.x == 0) busiest = 0;
    exchange(t, Arrive, epoch);
    const uint64_t bytes = static_cast<uint64_t>(tb.w) * 8;
    for (int s = 0; s < n; s++) {
        uint8_t *to = reinterpret_cast<uint8_t *>(tb.splits(s));
        if (s == me) {
            block_copy(to, t.mine<uint8_t>(a.splits), bytes);
        } else if (t.nvlink(s)) {
            block_copy(to, t.at<uint8_t>(s, a.splits), bytes);
        } else {
            // NVSHMEM gets into global memory; then into shared memory.
            uint8_t *g = reinterpret_cast<uint8_t *>(tb.fetched(s));
            rma_get(g, t.mine<uint8_t>(a.splits), bytes, t.pes[s]);
            __syncthreads();
            if (to != g) block_copy(to, g, bytes);
        }
    }
    __syncthreads();
    if (a2av_sums<kAnyKind>(a, tb, &busiest)) {
        a2av_report_first<kAnyKind>(a, tb);
        if (threadIdx.x == 0) *tb.verdict() = 1;
        end_epoch(t, epoch);
        return;
    }
    a2av_plan_sends<kAnyKind>(t, a, tb);
    a2av_write_so<kAnyKind>(t, a, tb);
    if (threadIdx.x == 0) {
        *tb.active_blocks() = a2av_active(a, busiest);
        *tb.verdict() = 0;
    }
    end_epoch(t, epoch);
}

// Each working block (the first `active_blocks`) pushes its share of the
// planned chunks (`a2av_push`).
extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_a2av_move(TeamSync t, A2av a) {
    shmem::k::follow_stream();
    using namespace shmem::k;
    A2avTable tb = a2av_table(t, a);
    // The verdict and the active blocks are the same on every PE.
    if (*tb.verdict() != 0) return;
    const int active = static_cast<int>(*tb.active_blocks());
    if (static_cast<int>(blockIdx.x) >= active) return;
    uint64_t epoch = begin_epoch(t);
    // The plan, read by every thread of the block: into shared memory where it fits.
    constexpr int kCachedWords = 4 * 768;
    __shared__ uint64_t cached[kCachedWords];
    const int words = 4 * t.n * a.ne;
    const bool fits = words <= kCachedWords;
    if (fits)
        for (int i = threadIdx.x; i < words; i += blockDim.x) cached[i] = tb.plan(0, 0, a.ne)[i];
    __syncthreads();
    a2av_push(t, a, fits ? cached : tb.plan(0, 0, a.ne), active, epoch);
    end_epoch(t, epoch);
}

namespace shmem {
namespace k {

// The one-kernel form (see the top of this file): the world or any team
// whose peers are all reached over NVLink, n × w ≤ kA2avPacketWords; a
// kernel for each kind (`shmem_a2av_fused_*` below).
template <int K> __device__ __forceinline__ void a2av_fused(const TeamSync &team, const A2av &a) {
    phase_begin("fused");
    extern __shared__ uint64_t shared_table[];
    // The peers' heap bases, read at every send: in shared memory.
    __shared__ uint64_t heaps[kMaxTeam];
    TeamSync t = team;
    t.peer_heap = heaps;
    A2avTable tb = a2av_shared_table<K>(t, a, shared_table);
    const int n = t.n, w = tb.w, me = t.rank;
    // This PE's splits and the heap bases, loaded beside the counter and
    // the epoch.
    const int64_t *mine = t.mine<int64_t>(a.splits);
    for (int i = threadIdx.x; i < w; i += blockDim.x) tb.splits(me)[i] = mine[i];
    for (int pe = threadIdx.x; pe < n; pe += blockDim.x) heaps[pe] = team.peer_heap[pe];
    __shared__ unsigned long long busiest;  // zeroed before the barriers below
    __shared__ int active_blocks;
    if (threadIdx.x == 0) busiest = 0;
    A2avPackets pk(t);
    phase_mark("counter");
    // Block 0 sends this PE's splits to every peer; every block gathers
    // every PE's.
    if (blockIdx.x == 0)
        for (int x = threadIdx.x; x < (n - 1) * w; x += blockDim.x) {
            int d = (me + 1 + x / w) % n, i = x % w;
            pk.send(d, i, w, tb.splits(me)[i]);
        }
    for (int x = threadIdx.x; x < n * w; x += blockDim.x) {
        int s = x / w, i = x % w;
        if (s != me) tb.staged[x] = pk.recv(s, i, w);
    }
    phase_mark("send_recv_splits");
    __syncthreads();
    phase_mark("sync");
    pk.arrive();
    if (a2av_sums<K>(a, tb, &busiest)) {
        a2av_report_first<K>(a, tb);  // a bad exchange is never sent
    } else {
        // The working blocks, by the block's last thread beside the plan.
        a2av_plan<K>(t, a, tb, [&] {
            if (threadIdx.x == blockDim.x - 1) active_blocks = a2av_active(a, busiest);
        });
        const int active = active_blocks;
        if (static_cast<int>(blockIdx.x) < active) {
            a2av_push(t, a, tb.plans, active, pk.epoch);
            phase_mark("push_signal_wait");
            end_epoch(t, pk.epoch);
        }
    }
    pk.end();
    phase_mark("end");
    phase_end();
}

}  // namespace k
}  // namespace shmem

// A kernel for each kind, NAME_v, NAME_2d and NAME_2d_offset, each BODY
// made for its kind (`A2AV_FUSED` and `A2AV_LINES` in kernels.rs), after
// the wait for the kernel before it (launched as a dependent launch).
#define SHMEM_A2AV_KERNELS(NAME, BODY)                                                                           \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) NAME##_v(TeamSync t, A2av a) {         \
        shmem::k::follow_stream();                                                                               \
        BODY<shmem::k::A2avV>(t, a);                                                                             \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) NAME##_2d(TeamSync t, A2av a) {        \
        shmem::k::follow_stream();                                                                               \
        BODY<shmem::k::A2av2d>(t, a);                                                                            \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads) NAME##_2d_offset(TeamSync t, A2av a) { \
        shmem::k::follow_stream();                                                                               \
        BODY<shmem::k::A2av2dOffset>(t, a);                                                                      \
    }

SHMEM_A2AV_KERNELS(shmem_a2av_fused, shmem::k::a2av_fused)

namespace shmem {
namespace k {

// The line form. A sender's lines for a peer are its splits
// (`split_lines`), then its chunks for that peer in its own order, each
// from a fresh line. Each warp works out where its lines come from by
// itself (`warp_chunks`), from this PE's splits in global memory, so that
// the first line leaves without a barrier; a receiver's chunks, once
// every PE's splits are in, are in the block's shared memory after the
// send plan (`recvs`, [s][e] for PE s's chunk e: {output row, rows, first
// line}).
// Rows (lines for a warp's first peer) from which the line kernel's rows
// wait for its splits to leave first (`A2avLines::send`).
constexpr uint64_t kGateMinLines = 1024;

// The line kernel's lines: 8-byte flags, 112 data bytes a line. In lines
// of 120 (4-byte flags, as the collectives' since session 21) one token
// and 32 took 0.3–0.55 µs longer in every form (2×H200, session 21, run
// 2; run 8 again with the byte loops rolled): they wait on the latency of
// each line, not on the link. Its byte loops rolled (`load_at`).
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
    // of them (at 128 tokens, 2–4.7 µs after their sending warp's start;
    // session 18, run 1). Fewer rows go at once: they hold the splits
    // back little, and the wait cost one token 0.5–0.6 µs (run 2). The
    // gate orders only what enters the link: the rows' lines are right
    // wherever the splits are. No block barrier: run 4's, after the
    // splits' sends, held block 0's rows back 0.3–0.44 µs at one token,
    // and run 5's, after the rows' plan, the gate 0.3–0.6 µs at 32 and
    // 128. The rows by the grid's warps, 4 lines each a pass.
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
                    while (*gate < epoch) {
                        if (clock64() - start > kWaitCycles) {
                            printf("shmem: an MoE line kernel's rows waited too long for its own splits' sending\n");
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
// and then its rows for each peer in 128-byte lines (`Lines` of
// prims_lines.cuh) into that peer's low-latency buffer for it: it needs
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
        a2av_report_first<K>(a, tb);
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
        // 64-bit division, which cost this step about 0.5 µs in session
        // 18's run 2.)
        int copiers = in == 0    ? warps
                      : own == 0 ? 0
                                 : __float2int_rn(__fdividef(static_cast<float>(own) * warps, static_cast<float>(own + in)));
        if (in != 0 && own != 0) {
            // Receivers enough, where the block has them, for every line
            // to be in the first two passes (`recv_rows` takes two at
            // once; a third is another round of waits): at 128 tokens of
            // 7168 bf16 at 2 PEs, about 8200 lines in, the 8 receivers a
            // block the bytes gave would take three passes of 4096; with
            // this floor dispatch took 9.72 µs against 10.20 (2×H100,
            // session 19, runs 1 and 3).
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

SHMEM_A2AV_KERNELS(shmem_a2av_lines, shmem::k::a2av_lines)
