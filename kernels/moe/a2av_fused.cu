// The one-kernel form of the MoE all-to-all-v (see moe/a2av.cuh): every PE's
// splits travel as low-latency packets, and every block checks, plans and
// pushes.
#include "moe/a2av.cuh"

namespace shmem {
namespace k {

// The one-kernel form's state, in the team's synchronisation slot after
// its epoch counters (`Layout::slot_bytes` in kernels.rs), zeroed with
// the slot: a header of kA2avHeaderBytes, which holds the operation
// counter (its own, advanced only by this kernel, so that operations
// alternate between the two packet buffers) and then a count of the
// blocks done with the current operation; then two buffers, by the
// operation's parity, of kA2avPacketWords 16-byte packets {low half,
// flag, high half, flag}: [sender][word] holds word `word` of `sender`'s
// splits.
//
// A PE writes a buffer again two operations later, after it has received
// every peer's splits of the operation between, which each peer sent when
// that operation's kernel began, after its kernel before (every block of
// which read the buffer) had ended: the low-latency argument of
// prims/ll.cuh. A flag is never 0 (the zeroed buffer) nor that of two
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

// The one-kernel form (see moe/a2av.cuh): the world or any team whose peers
// are all reached over NVLink, n × w ≤ kA2avPacketWords; a kernel for
// each kind (`shmem_a2av_fused_*` below).
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
    // The call's agreement, on the block's copy of the view (the peers'
    // heap bases are in shared memory since the counter's barrier; the
    // counter is only read so far): where it fails, nothing is sent.
    if (!a2av_agreed(t, a)) {
        phase_end();
        return;
    }
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
        a2av_report_first<K>(t, a, tb);  // a bad exchange is never sent
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

SHMEM_A2AV_KERNELS(fused, shmem::k::a2av_fused)
