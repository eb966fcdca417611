// All-gather kernel, one-shot over NVLink: every PE pulls every peer's
// block through its peer address into its own destination (each byte
// crosses the link once: the least traffic an all-gather can have). A
// barrier on entry (every source is ready) and on exit (no PE still reads
// a source) brackets it. In place, PE p's source is block p of its own
// destination, which is then left where it is.
#include "common.cuh"

namespace shmem {

__device__ void copy_block(uint8_t *dst, const uint8_t *src, uint64_t bytes, uint64_t tid, uint64_t stride) {
    bool aligned = ((reinterpret_cast<uint64_t>(dst) | reinterpret_cast<uint64_t>(src) | bytes) % 16) == 0;
    if (aligned) {
        const uint4 *s = reinterpret_cast<const uint4 *>(src);
        uint4 *d = reinterpret_cast<uint4 *>(dst);
        for (uint64_t i = tid; i < bytes / 16; i += stride) d[i] = s[i];
    } else {
        for (uint64_t i = tid; i < bytes; i += stride) dst[i] = src[i];
    }
}

}  // namespace shmem

// `dst_offset`/`src_offset`: heap offsets of this PE's destination and (out
// of place) source; `bytes`: one PE's block.
extern "C" __global__ void shmem_allgather_oneshot(shmem::TeamSync t, uint64_t dst_offset, uint64_t src_offset,
                                                   uint64_t bytes, int in_place) {
    shmem::team_barrier(t);
    uint64_t tid = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
    uint8_t *dst = reinterpret_cast<uint8_t *>(t.peer_heap[t.rank] + dst_offset);
    for (int pe = 0; pe < t.n; pe++) {
        if (in_place && pe == t.rank) continue;
        uint64_t from = in_place ? dst_offset + pe * bytes : src_offset;
        const uint8_t *src = reinterpret_cast<const uint8_t *>(t.peer_heap[pe] + from);
        shmem::copy_block(dst + pe * bytes, src, bytes, tid, stride);
    }
    shmem::team_barrier(t);
}
