// The two-kernel form's data kernel, `shmem_a2av_move` (see moe/a2av.cuh): the
// planned chunks' pushes and the signals.
#include "moe/a2av.cuh"

using shmem::k::A2av;
using shmem::k::TeamSync;

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
