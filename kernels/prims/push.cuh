// The push protocol (world team, every peer over NVLink, at most
// kPushMaxTeam PEs, at most kPushMaxBytes from one PE to another per
// operation): block b stores its share of what goes to each peer into
// that peer's staging for this PE, with plain 16-byte stores, and raises
// one flag there; once every peer's flag for block b is up, it reads the
// same share of every peer's staging. One link latency and no barrier, as
// the low-latency protocol, with one flag a block instead of one a word.
//
// The staging (after the low-latency packets, at every PE alike): flags
// [sender][block] (the epoch), then two buffers by epoch parity of
// kPushMaxBytes per sender. A PE writes a buffer again two epochs later,
// after it has seen every peer's flag of the epoch between, which each
// peer raised only once its kernel of the epoch before (which read that
// buffer) was over: the LL argument, with which it shares the epochs and
// their counters (every kernel of either kind hears from every peer:
// every block flags every peer, with or without data).
#pragma once
#include <cstdint>
#include "prims/ll.cuh"
#include "prims/simple.cuh"

namespace shmem {
namespace k {

struct Push {
    const TeamSync &t;
    uint64_t epoch;
    uint64_t parity;

    __device__ Push(const TeamSync &team) : t(team) {
        __shared__ uint64_t shared_epoch;
        if (threadIdx.x == 0) shared_epoch = *t.ll_counter(blockIdx.x) + 1;
        __syncthreads();
        epoch = shared_epoch;
        parity = epoch & 1;
    }
    __device__ uint64_t flags() const { return t.ll_offset + 2 * t.n * ll_buffer_bytes(t.n); }
    // Heap offset (every PE alike) of the staging for what `sender` sends.
    __device__ uint64_t staging(int sender) const {
        uint64_t f = (static_cast<uint64_t>(t.n) * kMaxBlocks * 8 + kStateAlign - 1) / kStateAlign * kStateAlign;
        return flags() + f + (parity * t.n + sender) * kPushMaxBytes;
    }
    // `bytes` at `src` into member `pe`'s staging for this PE, at `off`.
    __device__ void send(int pe, uint64_t off, const uint8_t *src, uint64_t bytes) const {
        block_copy(t.at<uint8_t>(pe, staging(t.rank) + off), src, bytes);
    }
    // What member `pe` sent, in this PE's staging, at `off`.
    template <typename T> __device__ const T *received(int pe, uint64_t off) const {
        return reinterpret_cast<const T *>(t.mine<uint8_t>(staging(pe)) + off);
    }
    // Flags every peer (after this block's sends), then waits for every
    // peer's flag for this block.
    __device__ void flag_and_wait() const {
        __syncthreads();
        uint64_t *mine = t.mine<uint64_t>(flags());
        for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x) {
            if (pe == t.rank) continue;
            st_release64(t.at<uint64_t>(pe, flags()) + t.rank * kMaxBlocks + blockIdx.x, epoch);
        }
        for (int pe = threadIdx.x; pe < t.n; pe += blockDim.x)
            if (pe != t.rank) wait_geq(mine + pe * kMaxBlocks + blockIdx.x, epoch);
        __syncthreads();
    }
    __device__ void end() const { ll_counters_end(t, epoch); }
};

}  // namespace k
}  // namespace shmem
