// The MoE all-to-all-v (1D, 2D dispatch, 2D combine; see shmem/src/moe.rs
// for the semantics) as two kernels on the caller's stream:
//
// 1. `shmem_a2av_plan` (one block): a barrier (every PE's splits and input
//    are ready, and its output is free), then every PE copies every PE's
//    splits into its own staging, checks the *whole* exchange — the same
//    data in the same order, so every PE reaches the same verdict without
//    another round — and, if it is good, writes its out_splits_offsets and
//    its send plan (where each of its chunks lands); if not, it writes
//    nothing but the verdict and an error record the host reads later.
// 2. `shmem_a2av_move` (many blocks): pushes the planned chunks — stores
//    through NVLink addresses or RMA puts — then signals every peer and
//    waits for every peer's signal, as the all-to-all kernel does.
//
// Nothing is read from the host, so both kernels can be captured in a CUDA
// graph and replayed with new splits.
#include "common.cuh"

namespace shmem {
namespace k {

enum A2avKind { A2avV = 0, A2av2d = 1, A2av2dOffset = 2 };

// What the host passes (`A2av` in kernels.rs).
struct A2av {
    uint64_t input, output, splits, out_so;  // heap offsets
    uint64_t row_bytes;
    uint64_t in_rows, out_rows;  // rows the input and the output hold
    uint64_t table;              // heap offset of this PE's staging
    uint64_t error;              // device address of the host-mapped error record
    int kind;
    int ne;  // experts per PE (1 for 1D)
    int major_align;
    int shared_splits;  // the plan kernel stages the splits in its shared memory
    int blocks;         // the data kernel's grid
    int pad;
};

// Bytes one block of the data kernel moves at least, of the busiest PE's.
constexpr uint64_t kA2avBytesPerBlock = 32 << 10;

// The error record the host reads (`A2avError` in kernels.rs): `code` is
// class << 56 | pe << 32 | index, `value` the offending number.
struct A2avError {
    unsigned long long code;   // and the kind << 52
    long long value;
    unsigned long long count;  // failed operations since the host last looked
    unsigned long long limit;  // the input's or the output's rows
};

enum A2avClass : unsigned long long {
    NegativeSplit = 1,
    NegativeOffset = 2,
    OffsetBackwards = 3,
    PastInput = 4,
    PastOutput = 5,
};

// This PE's staging (global memory), in 64-bit words: the verdict, the
// data kernel's active blocks, every PE's splits (and offsets) as fetched
// (`w` words each), the work arrays (below) where they do not fit in the
// plan kernel's shared memory, and the send plan: for each destination
// `d` and each of its `ne` chunks, {source row, destination row, rows,
// first row of the chunk among this PE's rows for `d`}.
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
    __device__ uint64_t *verdict() const { return base; }
    __device__ uint64_t *active_blocks() const { return base + 1; }
    __device__ int64_t *fetched(int pe) const {
        return reinterpret_cast<int64_t *>(base + 2) + static_cast<uint64_t>(pe) * w;
    }
    __device__ int64_t *splits(int pe) const { return staged + static_cast<uint64_t>(pe) * w; }
    __device__ uint64_t *rp(int s) const { return work + static_cast<uint64_t>(s) * (m + 1); }
    __device__ uint64_t *op(int d) const { return work + static_cast<uint64_t>(n + d) * (m + 1); }
    __device__ uint64_t *plan(int d, int e, int ne) const {
        return base + 2 + static_cast<uint64_t>(n) * w + 2ull * n * (m + 1) + 4 * (static_cast<uint64_t>(d) * ne + e);
    }
};

__device__ __forceinline__ A2avTable a2av_table(const TeamSync &t, const A2av &a) {
    int m = t.n * a.ne;
    uint64_t *base = t.mine<uint64_t>(a.table);
    int w = a.kind == A2av2dOffset ? 2 * m : m;
    int64_t *fetched = reinterpret_cast<int64_t *>(base + 2);
    return {base, t.n, m, w, fetched, base + 2 + static_cast<uint64_t>(t.n) * w};
}

__device__ __forceinline__ uint64_t sat_add(uint64_t a, uint64_t b) { return a > ~0ull - b ? ~0ull : a + b; }

// Exclusive prefix sums, saturating, of each of `segments` runs of `len`
// words at `a`, in place: a warp per run, 32 words at a time.
__device__ void segmented_exclusive_scan(uint64_t *a, int segments, int len) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int g = warp; g < segments; g += warps) {
        uint64_t *p = a + static_cast<uint64_t>(g) * len, carry = 0;
        for (int base = 0; base < len; base += 32) {
            int i = base + lane;
            uint64_t incl = i < len ? p[i] : 0;
            for (int off = 1; off < 32; off <<= 1) {
                uint64_t o = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off) incl = sat_add(incl, o);
            }
            uint64_t excl = __shfl_up_sync(0xffffffffu, incl, 1);
            if (i < len) p[i] = lane == 0 ? carry : sat_add(carry, excl);
            carry = sat_add(carry, __shfl_sync(0xffffffffu, incl, 31));
        }
    }
}

__device__ __forceinline__ uint64_t padded(uint64_t rows, uint64_t align) {
    uint64_t r = (rows + align - 1) / align * align;
    return r < align ? align : r;
}

__device__ __forceinline__ unsigned long long err_code(unsigned long long cls, int pe, uint64_t index) {
    return cls << 56 | static_cast<unsigned long long>(pe) << 32 | (index & 0xffffffffull);
}

// Rows of entry `i` of PE `s` (negative ones count as 0 once reported).
__device__ __forceinline__ uint64_t rows_of(const A2avTable &tb, int s, int i) {
    int64_t r = tb.splits(s)[i];
    return r < 0 ? 0 : static_cast<uint64_t>(r);
}

// The (source, entry of that source's splits) of output entry `j` of PE
// `d`, in output order, and the size of the groups that are padded.
__device__ __forceinline__ void out_entry(int kind, int n, int ne, int d, int j, int *s, int *i) {
    if (kind == A2avV) {
        *s = j, *i = d;
    } else if (kind == A2av2d) {
        *s = j % n, *i = d * ne + j / n;  // j = e × n + s
    } else {
        *s = j / ne, *i = (j % ne) * n + d;  // j = s × ne + e
    }
}

}  // namespace k
}  // namespace shmem

using shmem::k::A2av;
using shmem::k::TeamSync;

extern "C" __global__ void __launch_bounds__(512) shmem_a2av_plan(TeamSync t, A2av a) {
    using namespace shmem::k;
    // Every PE's splits and the work arrays, read over and over below: in
    // shared memory where they fit (the host sizes it), else global.
    extern __shared__ uint64_t shared_work[];
    A2avTable tb = a2av_table(t, a);
    const int n = t.n, m = tb.m, ne = a.ne, kind = a.kind, me = t.rank;
    if (a.shared_splits) {
        tb.staged = reinterpret_cast<int64_t *>(shared_work);
        tb.work = shared_work + static_cast<uint64_t>(n) * tb.w;
    }
    uint64_t epoch = begin_epoch(t);
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
    // The work arrays' rows, then their prefix sums (a negative split
    // counts as 0 here; it fails below).
    const int runs = n * (m + 1);
    for (int x = threadIdx.x; x < runs; x += blockDim.x) {
        int who = x / (m + 1), j = x % (m + 1), s, i;
        tb.rp(0)[x] = j < m ? rows_of(tb, who, j) : 0;
        if (j < m) out_entry(kind, n, ne, who, j, &s, &i);
        tb.op(0)[x] = j < m ? rows_of(tb, s, i) : 0;
    }
    __syncthreads();
    if (kind == A2av2d) {
        // Each expert's block of PE d's output: n chunks, padded.
        for (int g = threadIdx.x; g < n * ne; g += blockDim.x) {
            uint64_t *row = tb.op(g / ne) + (g % ne) * n, sum = 0;
            for (int y = 0; y < n; y++) sum = sat_add(sum, row[y]);
            uint64_t len = sum > ~0ull - a.major_align ? ~0ull : padded(sum, a.major_align);
            row[n - 1] = sat_add(row[n - 1], len - sum);
        }
        __syncthreads();
    }
    segmented_exclusive_scan(tb.work, 2 * n, m + 1);
    __syncthreads();

    // The first error by (class, PE, entry).
    __shared__ unsigned long long first;
    __shared__ long long first_value;
    if (threadIdx.x == 0) first = ~0ull;
    unsigned long long code = ~0ull;
    long long value = 0;
    auto note = [&](unsigned long long c, long long v) {
        if (c < code) code = c, value = v;
    };
    // Each chunk lies in its source's input, in order.
    for (int x = threadIdx.x; x < n * m; x += blockDim.x) {
        const int s = x / m, i = x % m;
        const int64_t *sp = tb.splits(s);
        const int64_t r = sp[i];
        if (r < 0) {
            note(err_code(NegativeSplit, s, i), r);
            continue;
        }
        uint64_t from = tb.rp(s)[i];
        if (kind == A2av2dOffset) {
            int64_t off = sp[m + i];
            if (off < 0) {
                note(err_code(NegativeOffset, s, i), off);
                continue;
            }
            if (i > 0 && sp[m + i - 1] >= 0 && static_cast<uint64_t>(off) < sat_add(sp[m + i - 1], rows_of(tb, s, i - 1))) {
                note(err_code(OffsetBackwards, s, i), off);
                continue;
            }
            from = off;
        }
        if (sat_add(from, r) > a.in_rows) note(err_code(PastInput, s, i), r);
    }
    // Each output holds what it receives.
    for (int d = threadIdx.x; d < n; d += blockDim.x) {
        uint64_t total = tb.op(d)[m];
        if (total > a.out_rows) note(err_code(PastOutput, d, 0), total > (~0ull >> 1) ? (~0ull >> 1) : total);
    }
    __syncthreads();
    if (code != ~0ull) atomicMin(&first, code);
    __syncthreads();
    if (code != ~0ull && code == first) first_value = value;
    __syncthreads();
    if (first != ~0ull) {
        if (threadIdx.x == 0) {
            *tb.verdict() = 1;
            if (a.error) {
                // Host-mapped: the host reads it without synchronising.
                volatile A2avError *e = reinterpret_cast<volatile A2avError *>(a.error);
                if (e->count == 0) {
                    e->code = first | static_cast<unsigned long long>(kind) << 52;
                    e->value = first_value;
                    e->limit = first >> 56 == PastOutput ? a.out_rows : a.in_rows;
                }
                __threadfence_system();
                e->count = e->count + 1;
            }
        }
        end_epoch(t, epoch);
        return;
    }
    // Where each of this PE's chunks goes: entry i of its splits is chunk
    // e for destination d, output entry j there.
    const int64_t *mine = tb.splits(me);
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
        int d, e, j;
        uint64_t src_row, start;
        if (kind == A2avV) {
            d = i, e = 0, j = me;
            src_row = tb.rp(me)[i], start = 0;
        } else if (kind == A2av2d) {
            d = i / ne, e = i % ne, j = e * n + me;
            src_row = tb.rp(me)[i], start = src_row - tb.rp(me)[d * ne];
        } else {
            e = i / n, d = i % n, j = me * ne + e;
            src_row = mine[m + i], start = 0;
            for (int x = 0; x < e; x++) start += mine[x * n + d];
        }
        uint64_t *p = tb.plan(d, e, ne);
        p[0] = src_row, p[1] = tb.op(d)[j], p[2] = mine[i], p[3] = start;
    }
    // What this PE receives: out_splits_offsets.
    int64_t *so = t.mine<int64_t>(a.out_so);
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
        int s, i;
        out_entry(kind, n, ne, me, j, &s, &i);
        so[j] = tb.splits(s)[i];
        so[m + j] = static_cast<int64_t>(tb.op(me)[j]);
    }
    // The data kernel's blocks that work: by what the busiest PE sends,
    // the same number on every PE (the same splits everywhere), so that
    // the idle ones skip their channel everywhere.
    if (threadIdx.x == 0) {
        uint64_t busiest = 0;
        for (int s = 0; s < n; s++) busiest = max(busiest, tb.rp(s)[m]);
        uint64_t want = (busiest * a.row_bytes + kA2avBytesPerBlock - 1) / kA2avBytesPerBlock;
        *tb.active_blocks() = want < 1 ? 1 : (want > static_cast<uint64_t>(a.blocks) ? a.blocks : want);
        *tb.verdict() = 0;
    }
    end_epoch(t, epoch);
}

// Each working block (the first `active_blocks`) pushes a share of every
// peer's chunks, then copies its share of this PE's own, then signals the
// peers on its channel and waits for theirs.
extern "C" __global__ void __launch_bounds__(512) shmem_a2av_move(TeamSync t, A2av a) {
    using namespace shmem::k;
    A2avTable tb = a2av_table(t, a);
    // The verdict and the active blocks are the same on every PE.
    if (*tb.verdict() != 0) return;
    const int active = static_cast<int>(*tb.active_blocks());
    if (static_cast<int>(blockIdx.x) >= active) return;
    const int ne = a.ne;
    const uint8_t *in = t.mine<uint8_t>(a.input);
    uint64_t epoch = begin_epoch(t);
    // The plan, read by every thread below: into shared memory where it fits.
    constexpr int kCachedWords = 4 * 768;
    __shared__ uint64_t cached[kCachedWords];
    const int words = 4 * t.n * ne;
    const bool fits = words <= kCachedWords;
    if (fits)
        for (int i = threadIdx.x; i < words; i += blockDim.x) cached[i] = tb.plan(0, 0, ne)[i];
    __syncthreads();
    auto plan = [&](int d, int e) { return fits ? cached + 4 * (d * ne + e) : tb.plan(d, e, ne); };
    for (int k = 1; k <= t.n; k++) {
        int d = (t.rank + k) % t.n;  // this PE's own chunks last
        const uint64_t *tail = plan(d, ne - 1);
        uint64_t total = (tail[3] + tail[2]) * a.row_bytes;
        Range r = split((total + 15) / 16, blockIdx.x, active);
        uint64_t lo = min(r.lo * 16, total), hi = min(r.hi * 16, total);
        if (lo >= hi) continue;
        // The last chunk that starts at or before `lo` (starts never decrease).
        int e0 = 0;
        for (int step = 1 << 30; step > 0; step >>= 1)
            if (e0 + step < ne && plan(d, e0 + step)[3] * a.row_bytes <= lo) e0 += step;
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
                    block_copy(t.mine<uint8_t>(to), from, a1 - a0);
                } else {
                    block_send(t, d, to, from, a1 - a0);
                }
            }
        }
    }
    // The move kernels' ending: every peer hears from every working block.
    __syncthreads();
    for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x)
        if (pe != t.rank) signal(t, Data, pe, epoch);
    wait_all(t, Data, epoch, t.rank);
    __syncthreads();
    if (t.rma && threadIdx.x == 0) nvshmem_quiet();
    end_epoch(t, epoch);
}
