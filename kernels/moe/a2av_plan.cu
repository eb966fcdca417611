// The two-kernel form's first kernel (see moe/a2av.cuh): the agreement, the
// barrier, the check of the whole exchange and the plan.
#include "moe/a2av.cuh"

using shmem::k::A2av;
using shmem::k::TeamSync;

extern "C" __global__ void __launch_bounds__(shmem::k::kBlockThreads)
    shmem_a2av_plan(TeamSync t, A2av a) {
    shmem::k::follow_stream();
    using namespace shmem::k;
    if (!a2av_agreed(t, a)) {
        // The data kernel reads the verdict and skips too.
        if (blockIdx.x == 0 && threadIdx.x == 0) *a2av_table(t, a).verdict() = 1;
        return;
    }
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
            rma_get(t, s, g, t.mine<uint8_t>(a.splits), bytes);
            __syncthreads();
            if (to != g) block_copy(to, g, bytes);
        }
    }
    __syncthreads();
    if (a2av_sums<kAnyKind>(a, tb, &busiest)) {
        a2av_report_first<kAnyKind>(t, a, tb);
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
