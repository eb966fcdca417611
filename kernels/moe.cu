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

// This PE's staging: the verdict word, the data kernel's active blocks,
// every PE's splits (and offsets)
// side by side (`w` words each), then the send plan: for each destination
// `d` and each of its `ne` chunks, {source row, destination row, rows}.
struct A2avTable {
    uint64_t *base;
    int n, m, w;
    int64_t *staged;  // every PE's splits: in shared memory, or after the verdict
    __device__ uint64_t *verdict() const { return base; }
    __device__ uint64_t *active_blocks() const { return base + 1; }
    __device__ int64_t *global_splits(int pe) const {
        return reinterpret_cast<int64_t *>(base + 2) + static_cast<uint64_t>(pe) * w;
    }
    __device__ int64_t *splits(int pe) const { return staged + static_cast<uint64_t>(pe) * w; }
    __device__ uint64_t *plan(int d, int e, int ne) const {
        return base + 2 + static_cast<uint64_t>(n) * w + 3 * (static_cast<uint64_t>(d) * ne + e);
    }
};

__device__ __forceinline__ A2avTable a2av_table(const TeamSync &t, const A2av &a) {
    int m = t.n * a.ne;
    uint64_t *base = t.mine<uint64_t>(a.table);
    return {base, t.n, m, a.kind == A2av2dOffset ? 2 * m : m, reinterpret_cast<int64_t *>(base + 2)};
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
    // Every PE's splits, read over and over below: in shared memory where
    // they fit (the host sizes it), else in the global staging.
    extern __shared__ int64_t shared_splits[];
    A2avTable tb = a2av_table(t, a);
    if (a.shared_splits) tb.staged = shared_splits;
    const int n = t.n, m = tb.m, ne = a.ne, kind = a.kind;
    uint64_t epoch = begin_epoch(t);
    exchange(t, Arrive, epoch);
    const uint64_t bytes = static_cast<uint64_t>(tb.w) * 8;
    for (int s = 0; s < n; s++) {
        uint8_t *to = reinterpret_cast<uint8_t *>(tb.splits(s));
        if (s == t.rank) {
            block_copy(to, t.mine<uint8_t>(a.splits), bytes);
        } else if (t.nvlink(s)) {
            block_copy(to, t.at<uint8_t>(s, a.splits), bytes);
        } else {
            // NVSHMEM gets into global memory; then into shared memory.
            uint8_t *g = reinterpret_cast<uint8_t *>(tb.global_splits(s));
            rma_get(g, t.mine<uint8_t>(a.splits), bytes, t.pes[s]);
            __syncthreads();
            if (to != g) block_copy(to, g, bytes);
        }
    }
    __syncthreads();
    // The first error by (class, PE, entry): each thread keeps the first
    // it finds of the sources and destinations it checks.
    __shared__ unsigned long long first;
    __shared__ long long first_value;
    if (threadIdx.x == 0) first = ~0ull;
    unsigned long long code = ~0ull;
    long long value = 0;
    auto note = [&](unsigned long long c, long long v) {
        if (c < code) code = c, value = v;
    };
    // Each source's chunks lie in its input, in order.
    for (int s = threadIdx.x; s < n; s += blockDim.x) {
        const int64_t *sp = tb.splits(s);
        uint64_t end = 0;
        for (int i = 0; i < m; i++) {
            uint64_t from = end;
            if (sp[i] < 0) {
                note(err_code(NegativeSplit, s, i), sp[i]);
                break;
            }
            if (kind == A2av2dOffset) {
                if (sp[m + i] < 0) {
                    note(err_code(NegativeOffset, s, i), sp[m + i]);
                    break;
                }
                from = sp[m + i];
                if (from < end) {
                    note(err_code(OffsetBackwards, s, i), sp[m + i]);
                    break;
                }
            }
            uint64_t rows = sp[i];
            if (rows > a.in_rows || from > a.in_rows - rows) {
                note(err_code(PastInput, s, i), sp[i]);
                break;
            }
            end = from + rows;
        }
    }
    // Each destination's output holds what it receives (sums saturate).
    for (int d = threadIdx.x; d < n; d += blockDim.x) {
        const uint64_t most = ~0ull;
        uint64_t at = 0, start = 0;
        for (int j = 0; j < m; j++) {
            int s, i;
            out_entry(kind, n, ne, d, j, &s, &i);
            uint64_t r = rows_of(tb, s, i);
            at = r > most - at ? most : at + r;
            if (kind == A2av2d && (j + 1) % n == 0) {
                uint64_t len = at - start > most - a.major_align ? most : padded(at - start, a.major_align);
                at = start = len > most - start ? most : start + len;
            }
        }
        if (at > a.out_rows) note(err_code(PastOutput, d, 0), at > (most >> 1) ? (most >> 1) : at);
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
    const int me = t.rank;
    // Where each of this PE's chunks goes: entry i of its splits.
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
        int d, e;
        uint64_t src_row = 0, dst_row = 0;
        const int64_t *mine = tb.splits(me);
        if (kind == A2avV) {
            d = i, e = 0;
            for (int j = 0; j < i; j++) src_row += mine[j];
            for (int s = 0; s < me; s++) dst_row += rows_of(tb, s, d);
        } else if (kind == A2av2d) {
            d = i / ne, e = i % ne;
            for (int j = 0; j < i; j++) src_row += mine[j];
            for (int x = 0; x < e; x++) {
                uint64_t r = 0;
                for (int s = 0; s < n; s++) r += rows_of(tb, s, d * ne + x);
                dst_row += padded(r, a.major_align);
            }
            for (int s = 0; s < me; s++) dst_row += rows_of(tb, s, i);
        } else {
            e = i / n, d = i % n;  // input entry e × n + d
            src_row = mine[m + i];
            for (int s = 0; s < me; s++)
                for (int x = 0; x < ne; x++) dst_row += rows_of(tb, s, x * n + d);
            for (int x = 0; x < e; x++) dst_row += mine[x * n + d];
        }
        uint64_t *p = tb.plan(d, e, ne);
        p[0] = src_row, p[1] = dst_row, p[2] = mine[i];
    }
    // What this PE receives: out_splits_offsets.
    int64_t *so = t.mine<int64_t>(a.out_so);
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
        int s, i;
        out_entry(kind, n, ne, me, j, &s, &i);
        uint64_t at = 0;
        if (kind == A2av2d) {
            int e = j / n;
            for (int x = 0; x < e; x++) {
                uint64_t r = 0;
                for (int y = 0; y < n; y++) r += rows_of(tb, y, me * ne + x);
                at += padded(r, a.major_align);
            }
            for (int y = 0; y < s; y++) at += rows_of(tb, y, i);
        } else {
            for (int x = 0; x < j; x++) {
                int s2, i2;
                out_entry(kind, n, ne, me, x, &s2, &i2);
                at += rows_of(tb, s2, i2);
            }
        }
        so[j] = tb.splits(s)[i];
        so[m + j] = static_cast<int64_t>(at);
    }
    // The data kernel's blocks that work: by what the busiest PE sends,
    // the same number on every PE (the same splits everywhere), so that
    // the idle ones skip their channel everywhere.
    __shared__ unsigned long long busiest;
    if (threadIdx.x == 0) busiest = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < n; s += blockDim.x) {
        uint64_t rows = 0;
        for (int i = 0; i < m; i++) rows += rows_of(tb, s, i);
        atomicMax(&busiest, static_cast<unsigned long long>(rows));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t bytes = busiest * a.row_bytes;
        uint64_t want = (bytes + kA2avBytesPerBlock - 1) / kA2avBytesPerBlock;
        *tb.active_blocks() = want < 1 ? 1 : (want > a.blocks ? a.blocks : want);
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
    constexpr int kCachedWords = 3 * 1024;
    __shared__ uint64_t cached[kCachedWords];
    const int words = 3 * t.n * ne;
    const bool fits = words <= kCachedWords;
    if (fits)
        for (int i = threadIdx.x; i < words; i += blockDim.x) cached[i] = tb.plan(0, 0, ne)[i];
    __syncthreads();
    auto plan = [&](int d, int e) { return fits ? cached + 3 * (d * ne + e) : tb.plan(d, e, ne); };
    for (int k = 1; k <= t.n; k++) {
        int d = (t.rank + k) % t.n;  // this PE's own chunks last
        uint64_t total = 0;
        for (int e = 0; e < ne; e++) total += plan(d, e)[2] * a.row_bytes;
        Range r = split((total + 15) / 16, blockIdx.x, active);
        uint64_t lo = min(r.lo * 16, total), hi = min(r.hi * 16, total), at = 0;
        for (int e = 0; e < ne && at < hi; e++) {
            const uint64_t *p = plan(d, e);
            uint64_t bytes = p[2] * a.row_bytes, a0 = max(lo, at), a1 = min(hi, at + bytes);
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
            at += bytes;
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
