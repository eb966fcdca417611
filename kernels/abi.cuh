// The host–device ABI of shmem's own kernels: every struct the Rust host
// passes to them (by value as a kernel argument, or through memory), and
// every constant both sides use. Each struct has a `repr(C)` twin on the
// Rust side (shmem/src/gpu/abi.rs) with the same fields in the same order;
// the static_asserts after each struct pin today's layout, so a field moved
// on one side alone fails the build of that side (the Rust twin asserts the
// same numbers). A change here is a change there, and the other way round.
//
// `PeerHandle`, the one struct of users' kernels, lives in the public
// header shmem_device.cuh (self-contained for NVRTC), with its asserts.
#pragma once
#include <cstddef>
#include <cstdint>

namespace shmem {
namespace k {

// ---- Limits and sizes ----

// Threads of a block of the collective and MoE kernels (their launch
// bound; the line kernels take up to kLinesMaxThreads): `THREADS` in
// kernels.rs.
constexpr int kBlockThreads = 512;
// Most blocks a collective kernel uses: one channel of every signal array
// each (`MAX_BLOCKS`).
constexpr int kMaxBlocks = 128;
// Most threads a block of the line kernels takes (`LINES_MAX_THREADS` in
// algo.rs): 20 warps, so that 128 blocks take a peer's 1 MiB (9363 lines)
// in one pass; at most 96 registers a thread.
constexpr int kLinesMaxThreads = 640;
// Most blocks when some peer is reached through RMA, and the staging each
// such block has per peer for gets (`RMA_BLOCKS`, `RMA_CHUNK`).
constexpr int kRmaBlocks = 32;
constexpr uint64_t kRmaChunk = 8192;
// Largest team the kernels take (`MAX_TEAM`; checked on the host).
constexpr int kMaxTeam = 64;
// The push kernels: the most bytes one PE sends another, and the largest
// world they have staging for (`PUSH_MAX_BYTES`, `PUSH_MAX_TEAM`).
constexpr uint64_t kPushMaxBytes = 1 << 20;
constexpr int kPushMaxTeam = 8;
// The low-latency packets' room per sender: 128 KiB in any world, 1 MiB in
// worlds of up to kPushMaxTeam (`LOW_LATENCY_MAX_BYTES`,
// `LOW_LATENCY_ROOM_BYTES` in algo.rs).
constexpr uint64_t kLLMaxBytes = 128 << 10;
constexpr uint64_t kLLMaxBytesSmallTeam = 1 << 20;
// What a sender's low-latency buffer has beyond twice its packets' room,
// for lines only (`low_latency_buffer_bytes` in algo.rs).
constexpr uint64_t kLinesSlackBytes = 64 << 10;
// A line of the line protocol, and its data bytes with 4-byte and with
// 8-byte flags (`LINE_DATA_BYTES`, `LINE_DATA_BYTES_WIDE` in algo.rs).
constexpr uint64_t kLineBytes = 128;
constexpr uint64_t kLineDataBytes = 120;
constexpr uint64_t kLineDataBytesWide = 112;

// ---- The kernels' state after the heap (`Layout` in kernels.rs) ----

// Signal arrays of a team's synchronisation state (Arrive, Data, Depart),
// each kMaxBlocks × n 64-bit words; then kMaxBlocks epoch counters of the
// team's own, then kMaxBlocks that the low-latency and push kernels share.
constexpr int kSignalArrays = 3;
constexpr int kEpochCounterSets = 2;
// The regions of the state that follow a run of words (the one-kernel MoE
// form's packets, the push staging) start at a multiple of this.
constexpr uint64_t kStateAlign = 256;
// The one-kernel MoE form's header in a team's slot (its operation counter,
// then its count of blocks done), before its packets, and the split words
// of one operation its packets hold (`A2AV_PACKET_WORDS`).
constexpr uint64_t kA2avHeaderBytes = 256;
constexpr int kA2avPacketWords = 1024;
// Most experts per PE of the MoE line kernel: a warp works out a
// destination's chunks a lane each (`A2AV_LINES_MAX_EXPERTS`).
constexpr int kA2avLinesMaxExperts = 32;

// ---- The rail pipes of the node-aware collectives (prims/rail.cuh) ----

// Pipe channels between two PEs of one rail, in each direction
// (`RAIL_CHANNELS`): a node-aware kernel's blocks each take one (a block
// of each role per channel, so at most kRailChannels / 2 blocks a role).
constexpr int kRailChannels = 16;
// Chunks a pipe holds in flight (`RAIL_DEPTH`), and a chunk's most bytes
// (`RAIL_CHUNK`).
constexpr int kRailDepth = 4;
constexpr uint64_t kRailChunk = 64 << 10;

// ---- The agreement of an eager collective call (core/agree.cuh) ----

// Words of a call's descriptor row (`DESC_WORDS` of the control plane,
// `Desc::words` in team.rs): the host exchange's sequence number, the
// head (kind, dtype, reduction and, from bit kAgreeErrorShift, the error
// code of a PE whose own arguments failed its checks), five arguments,
// and a per-PE word that is carried but not compared.
constexpr int kAgreeWords = 8;
constexpr int kAgreeHeadWord = 1;
constexpr int kAgreeErrorShift = 24;
constexpr int kAgreePrivateWord = 7;
// Data a call may carry with its row (`AGREE_DATA_BYTES`): an eager
// all-reduce of at most this many bytes over NVLink sends its source in
// the agreement's packets, after its row's (`allreduce_agreed` in
// coll/reduce.cuh), so that agreeing and moving the data are one round trip.
constexpr int kAgreeDataBytes = 256;
// Packets a sender has in the agreement's buffer: its row's, then its data's.
constexpr int kAgreePackets = kAgreeWords + kAgreeDataBytes / 8;

// ---- Kernel arguments ----

// A team's view of the symmetric heap and its synchronisation state, the
// first argument of every collective and MoE kernel: at `sync_offset` of
// every member's heap, the signal arrays, then the epoch counters (see
// above; the low-latency ones: world team only), the MoE form's header
// and packets, then the agreement's state (`agree_base`).
//
// `agree`, `report` and `row` are the agreement of an eager collective
// (core/agree.cuh): the host passes its call's descriptor row whole, as a
// kernel argument (80 bytes more to a launch's arguments, no copy to the device),
// with the agreement's epoch (the team's count of eager calls, the same
// on every member; 0 for no agreement: graph capture, the kernels after
// the first of a call, internal kernels), so that the members compare whole rows and a
// mismatch can be reported with every member's row, as the host's
// exchange reports it.
struct TeamSync {
    const uint64_t *peer_heap;  // n heap bases; 0 where the peer is reached through RMA
    const int *pes;             // n world PE numbers (for NVSHMEM)
    uint64_t heap;              // this PE's heap base (also the symmetric address)
    uint64_t sync_offset;       // heap offset of the team's synchronisation state
    uint64_t ll_offset;         // heap offset of the low-latency packets (world)
    uint64_t temp_offset;       // heap offset of this PE's RMA staging
    int rank;
    int n;
    int rma;                    // some peer is reached through RMA
    int pad;                    // (`_pad` in the Rust twin)
    uint64_t agree;             // this call's agreement epoch; 0: no agreement
    uint64_t report;            // device address of the host-mapped AgreeFailure
    uint64_t row[kAgreeWords];  // this PE's descriptor row of the call (with `agree`)
    uint64_t remote;            // bit r: member r (< kMaxTeam) is on another node (also under force_rma)
    uint64_t net_offset;        // heap offset of this PE's NetCounters

    __device__ uint64_t *word(int array, int channel, int sender) const {
        return reinterpret_cast<uint64_t *>(heap + sync_offset) + (array * kMaxBlocks + channel) * n + sender;
    }
    __device__ uint64_t *epoch_counter(int channel) const {
        return reinterpret_cast<uint64_t *>(heap + sync_offset) + kSignalArrays * kMaxBlocks * n + channel;
    }
    __device__ uint64_t *ll_counter(int block) const { return epoch_counter(kMaxBlocks + block); }
    __device__ bool nvlink(int pe) const { return peer_heap[pe] != 0; }
    // The member `i` places after this PE, (rank + i) % n for 0 <= i < n,
    // without a division (a runtime `%` costs some 30 instructions, on the
    // way to every kernel's first send).
    __device__ int after(int i) const { return rank + i < n ? rank + i : rank + i - n; }
    // A peer's copy of heap offset `off` (NVLink path only).
    template <typename T> __device__ T *at(int pe, uint64_t off) const {
        return reinterpret_cast<T *>(peer_heap[pe] + off);
    }
    // This PE's copy of heap offset `off` (also the symmetric address for NVSHMEM).
    template <typename T> __device__ T *mine(uint64_t off) const { return reinterpret_cast<T *>(heap + off); }
    // Heap offset of the agreement's state in the slot, after the signal
    // arrays and epoch counters (rounded up to kStateAlign) and the MoE
    // form's header and two buffers of packets (`Layout::slot_bytes`):
    // packets [parity][sender][kAgreePackets] of 16 bytes (the row's
    // words, then the data's), then rows [parity][sender][word] of 8, then
    // a signal word a sender.
    __device__ uint64_t agree_base() const {
        uint64_t words = static_cast<uint64_t>(kSignalArrays) * kMaxBlocks * n + kEpochCounterSets * kMaxBlocks;
        return sync_offset + (words * 8 + kStateAlign - 1) / kStateAlign * kStateAlign + kA2avHeaderBytes +
               2 * kA2avPacketWords * 16;
    }
    // Where `sender` puts word `w` of its row of an epoch of `parity`, as
    // a packet (NVLink; packets from kAgreeWords on carry data) or a plain
    // word (RMA), and its RMA signal.
    __device__ uint64_t agree_packet(uint64_t parity, int sender, int w) const {
        return agree_base() + ((parity * n + sender) * kAgreePackets + w) * 16;
    }
    __device__ uint64_t agree_row(uint64_t parity, int sender) const {
        return agree_base() + 2 * static_cast<uint64_t>(n) * kAgreePackets * 16 +
               (parity * n + sender) * kAgreeWords * 8;
    }
    __device__ uint64_t agree_signal(int sender) const {
        return agree_base() + 2 * static_cast<uint64_t>(n) * (kAgreePackets * 16 + kAgreeWords * 8) +
               static_cast<uint64_t>(sender) * 8;
    }
};
static_assert(sizeof(TeamSync) == 160, "TeamSync: size");
static_assert(offsetof(TeamSync, peer_heap) == 0, "TeamSync::peer_heap");
static_assert(offsetof(TeamSync, pes) == 8, "TeamSync::pes");
static_assert(offsetof(TeamSync, heap) == 16, "TeamSync::heap");
static_assert(offsetof(TeamSync, sync_offset) == 24, "TeamSync::sync_offset");
static_assert(offsetof(TeamSync, ll_offset) == 32, "TeamSync::ll_offset");
static_assert(offsetof(TeamSync, temp_offset) == 40, "TeamSync::temp_offset");
static_assert(offsetof(TeamSync, rank) == 48, "TeamSync::rank");
static_assert(offsetof(TeamSync, n) == 52, "TeamSync::n");
static_assert(offsetof(TeamSync, rma) == 56, "TeamSync::rma");
static_assert(offsetof(TeamSync, pad) == 60, "TeamSync::pad");
static_assert(offsetof(TeamSync, agree) == 64, "TeamSync::agree");
static_assert(offsetof(TeamSync, report) == 72, "TeamSync::report");
static_assert(offsetof(TeamSync, row) == 80, "TeamSync::row");
static_assert(offsetof(TeamSync, remote) == 144, "TeamSync::remote");
static_assert(kMaxTeam <= 64, "TeamSync::remote has a bit a member");
static_assert(offsetof(TeamSync, net_offset) == 152, "TeamSync::net_offset");

// This PE's counts of its RMA traffic with other nodes' PEs, at
// `TeamSync::net_offset` (`Layout::net`; read as NET_COUNTER_WORDS words
// in this order by `NetTraffic::from_words`). Only grow.
struct NetCounters {
    unsigned long long bytes_put;  // payload bytes put
    unsigned long long bytes_got;  // payload bytes fetched by gets
    unsigned long long puts;
    unsigned long long gets;
    unsigned long long signals;  // signals sent (not counted as bytes)
};
static_assert(sizeof(NetCounters) == 40, "NetCounters: size (NET_COUNTER_WORDS)");
static_assert(offsetof(NetCounters, bytes_put) == 0, "NetCounters::bytes_put");
static_assert(offsetof(NetCounters, bytes_got) == 8, "NetCounters::bytes_got");
static_assert(offsetof(NetCounters, puts) == 16, "NetCounters::puts");
static_assert(offsetof(NetCounters, gets) == 24, "NetCounters::gets");
static_assert(offsetof(NetCounters, signals) == 32, "NetCounters::signals");

// One node-aware collective, the second argument of the `shmem_*_nodes`
// kernels (coll/move_nodes.cu, coll/reduce.cuh), for the world team laid out node
// by node: member a·L + i is PE (node a, local rank i).
struct RailOp {
    uint64_t dst, src;  // heap offsets (the same on every member)
    uint64_t count;     // bytes (all-gather, all-to-all: per member; broadcast), or elements (all-reduce; reduce-scatter: per member)
    uint64_t rail;      // heap offset of the rail pipes' state (`Layout::rail`)
    int per_node;       // L: members on each node
    int channels;       // C: pipe channels of each role; the grid is 2C blocks
    int root;           // the broadcast's root (team rank)
    int pad;            // (`_pad` in the Rust twin)
};
static_assert(sizeof(RailOp) == 48, "RailOp: size");
static_assert(offsetof(RailOp, dst) == 0, "RailOp::dst");
static_assert(offsetof(RailOp, src) == 8, "RailOp::src");
static_assert(offsetof(RailOp, count) == 16, "RailOp::count");
static_assert(offsetof(RailOp, rail) == 24, "RailOp::rail");
static_assert(offsetof(RailOp, per_node) == 32, "RailOp::per_node");
static_assert(offsetof(RailOp, channels) == 36, "RailOp::channels");
static_assert(offsetof(RailOp, root) == 40, "RailOp::root");
static_assert(offsetof(RailOp, pad) == 44, "RailOp::pad");

// The operation of a MoE all-to-all-v (`A2av::kind`; the kernel names'
// suffixes `_v`, `_2d`, `_2d_offset`).
enum A2avKind { A2avV = 0, A2av2d = 1, A2av2dOffset = 2 };

// One MoE all-to-all-v, the second argument of the `shmem_a2av_*` kernels.
struct A2av {
    uint64_t input, output, splits, out_so;  // heap offsets
    uint64_t row_bytes;
    uint64_t in_rows, out_rows;  // rows the input and the output hold
    uint64_t table;              // heap offset of this PE's staging
    uint64_t error;              // device address of the host-mapped error record (`A2avError`)
    uint64_t block_bytes;        // bytes of the busiest PE's rows per working data block
    int kind;                    // an A2avKind
    int ne;  // experts per PE (1 for 1D)
    int major_align;
    int shared_splits;  // the plan kernel stages the splits in its shared memory
    int blocks;         // the data kernel's grid
    int local_blocks;   // of the working blocks, how many copy this PE's own chunks (0: each block
                        // does both; negative: chosen by `a2av_local_blocks`)
    uint64_t skip_if;   // heap offset of an i64 of this PE, non-zero where an agreement that covers
                        // this call failed (the node-aware MoE layer's over the world); 0: none
};
static_assert(sizeof(A2av) == 112, "A2av: size");
static_assert(offsetof(A2av, input) == 0, "A2av::input");
static_assert(offsetof(A2av, output) == 8, "A2av::output");
static_assert(offsetof(A2av, splits) == 16, "A2av::splits");
static_assert(offsetof(A2av, out_so) == 24, "A2av::out_so");
static_assert(offsetof(A2av, row_bytes) == 32, "A2av::row_bytes");
static_assert(offsetof(A2av, in_rows) == 40, "A2av::in_rows");
static_assert(offsetof(A2av, out_rows) == 48, "A2av::out_rows");
static_assert(offsetof(A2av, table) == 56, "A2av::table");
static_assert(offsetof(A2av, error) == 64, "A2av::error");
static_assert(offsetof(A2av, block_bytes) == 72, "A2av::block_bytes");
static_assert(offsetof(A2av, kind) == 80, "A2av::kind");
static_assert(offsetof(A2av, ne) == 84, "A2av::ne");
static_assert(offsetof(A2av, major_align) == 88, "A2av::major_align");
static_assert(offsetof(A2av, shared_splits) == 92, "A2av::shared_splits");
static_assert(offsetof(A2av, blocks) == 96, "A2av::blocks");
static_assert(offsetof(A2av, local_blocks) == 100, "A2av::local_blocks");
static_assert(offsetof(A2av, skip_if) == 104, "A2av::skip_if");

// ---- The MoE all-to-all-v's error record ----

// The record a failed check writes, in host-mapped memory at `A2av::error`
// (the host reads it as four words without synchronising).
struct A2avError {
    unsigned long long code;   // the class, the kind, the PE and the entry (below)
    long long value;           // the offending number
    unsigned long long count;  // failed operations since the host last looked
    unsigned long long limit;  // the input's or the output's rows
};
static_assert(sizeof(A2avError) == 32, "A2avError: size");
static_assert(offsetof(A2avError, code) == 0, "A2avError::code");
static_assert(offsetof(A2avError, value) == 8, "A2avError::value");
static_assert(offsetof(A2avError, count) == 16, "A2avError::count");
static_assert(offsetof(A2avError, limit) == 24, "A2avError::limit");

// What a check found wrong (`A2avError::code >> kA2avErrClassShift`).
enum A2avClass : unsigned long long {
    NegativeSplit = 1,    // a split below 0
    NegativeOffset = 2,   // a combine's offset below 0
    OffsetBackwards = 3,  // a combine's offset before its previous chunk's end
    PastInput = 4,        // a chunk past the sender's input
    PastOutput = 5,       // more rows than the receiver's output holds
};

// `A2avError::code`: class << 56 | kind << 52 | pe << 32 | entry, the kind
// in 4 bits, the PE in 20, the entry (of the PE's splits) in 32.
constexpr int kA2avErrClassShift = 56;
constexpr int kA2avErrKindShift = 52;
constexpr int kA2avErrPeShift = 32;
constexpr unsigned long long kA2avErrIndexMask = 0xffffffffull;

// ---- The agreement's failure record ----

// What a failed agreement records, in host-mapped memory at
// `TeamSync::report` (the host reads it without synchronising): block 0 of
// the kernel of a PE whose own row was valid writes it. The first failure
// since the host last looked is kept whole (its epoch, its team's slot,
// every member's world PE and row); every failure counts, and names
// itself in `latest_*`, so that the host can tell whether a given call
// failed (`count` last, after a system fence).
struct AgreeFailure {
    unsigned long long count;         // failed agreements since the host last looked
    unsigned long long latest_epoch;  // the latest failure's epoch
    unsigned long long latest_slot;   // and its team's `sync_offset`
    unsigned long long epoch;         // the first failure's epoch
    unsigned long long slot;          // and its team's `sync_offset`
    int n;                            // the first failure's team: members
    int rank;                         // and this PE's place among them
    int pes[kMaxTeam];                // their world PEs
    unsigned long long rows[kMaxTeam][kAgreeWords];  // their rows
};
static_assert(sizeof(AgreeFailure) == 4400, "AgreeFailure: size");
static_assert(offsetof(AgreeFailure, count) == 0, "AgreeFailure::count");
static_assert(offsetof(AgreeFailure, latest_epoch) == 8, "AgreeFailure::latest_epoch");
static_assert(offsetof(AgreeFailure, latest_slot) == 16, "AgreeFailure::latest_slot");
static_assert(offsetof(AgreeFailure, epoch) == 24, "AgreeFailure::epoch");
static_assert(offsetof(AgreeFailure, slot) == 32, "AgreeFailure::slot");
static_assert(offsetof(AgreeFailure, n) == 40, "AgreeFailure::n");
static_assert(offsetof(AgreeFailure, rank) == 44, "AgreeFailure::rank");
static_assert(offsetof(AgreeFailure, pes) == 48, "AgreeFailure::pes");
static_assert(offsetof(AgreeFailure, rows) == 304, "AgreeFailure::rows");

// ---- The MoE layer's kernels (moe/layer.cu); heap offsets ----

// The MoE layer's kernels (`shmem_moe_route`, `shmem_moe_gather`,
// `shmem_moe_combine_<dtype>`), each in two phases; see moe/layer.cu and
// shmem/src/moe/layer.rs for the wire row's layout.
struct MoeLayer {
    uint64_t tokens;  // the caller's tokens: max_tokens rows of data_bytes
    uint64_t ids;  // max_tokens × top_k i64 global expert ids
    uint64_t weights;  // max_tokens × top_k f32 weights
    uint64_t n_tokens;  // one i64: the dispatch's token count
    uint64_t send;  // wire rows out; the partials that come back
    uint64_t stage;  // wire rows in; the partials that go back
    uint64_t recv;  // the dispatched view: rows of data_bytes
    uint64_t send_splits;  // n i64: wire rows to each PE
    uint64_t stage_so;  // 2n i64: the dispatch exchange's out splits/offsets
    uint64_t back_so;  // 2n i64: the combine exchange's out splits/offsets
    uint64_t view_so;  // 2 × ne × n i64: the view's splits and offsets
    uint64_t slot_rows;  // max_tokens × top_k i64: each slot's wire row
    uint64_t state;  // 2 i64: the last dispatch's token count (-1 after a bad one), the world agreement's verdict
    uint64_t scratch;  // u32 counters: blockDim.x × (n + ne), then ne × n; or the ranked route's (`RankScratch`)
    uint64_t outputs;  // the experts' outputs, laid out as the view
    uint64_t out;  // the combine's result: n_tokens rows
    int64_t data_bytes;  // a token's bytes
    int64_t meta;  // where a wire row's metadata starts
    int64_t stride;  // a wire row's bytes
    int64_t max_tokens;
    int64_t hidden;
    int top_k;
    int ne;  // experts per PE
    int major_align;
    int phase;  // 0: the source side; 1: the receiving side (see moe/layer.cu)
    uint64_t token_scales;  // pre-quantized tokens' scales: max_tokens × ⌈hidden/128⌉ f32
    uint64_t partials;  // where the combine's expert side writes its partials (stage in the native format)
    uint64_t recv_codes;  // the FP8 view's codes: rows of hidden bytes
    uint64_t recv_scales;  // the FP8 view's scales: rows of ⌈hidden/128⌉ f32
    int64_t back_stride;  // a partial's row in the combine's exchange
    int64_t scales_at;  // where a wire row's scales start (the FP8 format)
    int fp8;  // the wire format: 0 native, kFp8Quantize, kFp8PreQuantized
    int dequantize;  // the receiver's phase of the FP8 format: 1 to write the bf16 view too
    // The node-aware form (moe/layer.cu); all 0 in the flat form.
    uint64_t forward_in;  // the forwarder's input: the rail stage's rows (the route and gather, phase 0)
    uint64_t forward_so;  // 2 × nodes i64: the rail exchange's out splits/offsets
    uint64_t next_so;  // the forwarder's combine: the rail combine exchange's out splits/offsets, poisoned
    uint64_t fail_splits;  // the forwarder's combine: the rail combine's in_splits, poisoned when it must fail
    int64_t out_stride;  // bytes between the combine's result rows; 0: hidden elements
    int origin;  // the rail route: 1 + this PE, carried in the token field (kOriginShift); 0 in the flat form
    int view_n;  // the node stage's receiver: source PEs of the view (the world); 0: the team's
    uint64_t arrivals;  // ne × n u64 arrival flags (n: the view's sources), entry e × n + source, then the epoch
    // The decode form (moe/decode.cu); 0 in the exchange form.
    uint64_t decode;  // kDecodeHeadWords + n (5 + 2 ne) u64: the decode form's words (`DecodeWords`)
    uint64_t views;  // n × max_tokens × top_k i32: the view row of each staged slot, -1 for another PE's
    uint64_t error;  // device address of the host-mapped `A2avError` (the routing faults it finds)
    int lines;  // 1: the decode form's phase in lines (moe/decode.cu), else 0
    int pad;  // (`_pad` in the Rust twin)
};
// Where the node-aware form's token field carries its source PE.
constexpr int kOriginShift = 32;
// `MoeLayer::fp8`: e4m3 on the wire, quantized from bf16 tokens in the
// gather, or from codes and scales the caller gave.
constexpr int kFp8Quantize = 1, kFp8PreQuantized = 2;
// The MoE layer's row kernels (moe/layer.cu) split a row into pieces of
// this many bytes, a block a piece; the host sizes their grids alike
// (`LAYER_CHUNK_BYTES` in abi.rs). A multiple of 16 and of kQuantGroup.
constexpr int64_t kLayerChunkBytes = 8192;
// The source's gather quantizing to FP8 splits a token into pieces of this
// many elements (`LAYER_QUANT_CHUNK` in abi.rs): a multiple of kQuantGroup.
constexpr int64_t kLayerQuantChunk = 2048;
// Most slots of a token (or of a staged row) a row kernel keeps in shared
// memory; a larger top-k takes the slower loops that read them from
// global memory, and the source's gather then works a slot at a time, not
// a token (`LAYER_SHARED_SLOTS` in abi.rs sizes its grid alike).
constexpr int kLayerSharedSlots = 64;
// The flat form's route over many blocks (moe/layer.cu's `shmem_moe_rank`
// and `shmem_moe_stamp`) takes a top-k up to this (kRouteFastSlots in
// moe/layer_rows.cuh) and experts a PE up to kRankKeys, a chunk of kRankChunk
// tokens or rows a block (`RANK_TOP_K`, `RANK_KEYS`, `RANK_CHUNK` in
// abi.rs size its grids and scratch alike).
constexpr int kRankTopK = 8;
constexpr int kRankKeys = 64;
constexpr int kRankChunk = kBlockThreads;
// The decode form (moe/decode.cu): at most this many tokens a PE, this many
// experts a PE, this top-k, and this many experts in the team (PEs ×
// experts a PE: the route's rank tables)
// (`DECODE_MAX_TOKENS`, `DECODE_MAX_EXPERTS`, `DECODE_MAX_PAIRS` in abi.rs);
// the head of its words (the operation counter, the blocks done with it);
// where its token field carries the wire row the combine's partial goes
// back to (the token below).
constexpr int kDecodeMaxTokens = 256;
constexpr int kDecodeMaxExperts = 32;
constexpr int kDecodeMaxTopK = 8;
constexpr int kDecodeMaxPairs = 512;
constexpr int kDecodeHeadWords = 3;
constexpr int kDecodeRowShift = 32;
static_assert(sizeof(MoeLayer) == 328, "MoeLayer: size");
static_assert(offsetof(MoeLayer, lines) == 320, "MoeLayer::lines");
static_assert(offsetof(MoeLayer, decode) == 296, "MoeLayer::decode");
static_assert(offsetof(MoeLayer, views) == 304, "MoeLayer::views");
static_assert(offsetof(MoeLayer, error) == 312, "MoeLayer::error");
static_assert(offsetof(MoeLayer, forward_in) == 240, "MoeLayer::forward_in");
static_assert(offsetof(MoeLayer, forward_so) == 248, "MoeLayer::forward_so");
static_assert(offsetof(MoeLayer, next_so) == 256, "MoeLayer::next_so");
static_assert(offsetof(MoeLayer, fail_splits) == 264, "MoeLayer::fail_splits");
static_assert(offsetof(MoeLayer, out_stride) == 272, "MoeLayer::out_stride");
static_assert(offsetof(MoeLayer, origin) == 280, "MoeLayer::origin");
static_assert(offsetof(MoeLayer, view_n) == 284, "MoeLayer::view_n");
static_assert(offsetof(MoeLayer, arrivals) == 288, "MoeLayer::arrivals");
static_assert(offsetof(MoeLayer, token_scales) == 184, "MoeLayer::token_scales");
static_assert(offsetof(MoeLayer, partials) == 192, "MoeLayer::partials");
static_assert(offsetof(MoeLayer, recv_codes) == 200, "MoeLayer::recv_codes");
static_assert(offsetof(MoeLayer, recv_scales) == 208, "MoeLayer::recv_scales");
static_assert(offsetof(MoeLayer, back_stride) == 216, "MoeLayer::back_stride");
static_assert(offsetof(MoeLayer, scales_at) == 224, "MoeLayer::scales_at");
static_assert(offsetof(MoeLayer, fp8) == 232, "MoeLayer::fp8");
static_assert(offsetof(MoeLayer, dequantize) == 236, "MoeLayer::dequantize");
static_assert(offsetof(MoeLayer, tokens) == 0, "MoeLayer::tokens");
static_assert(offsetof(MoeLayer, ids) == 8, "MoeLayer::ids");
static_assert(offsetof(MoeLayer, weights) == 16, "MoeLayer::weights");
static_assert(offsetof(MoeLayer, n_tokens) == 24, "MoeLayer::n_tokens");
static_assert(offsetof(MoeLayer, send) == 32, "MoeLayer::send");
static_assert(offsetof(MoeLayer, stage) == 40, "MoeLayer::stage");
static_assert(offsetof(MoeLayer, recv) == 48, "MoeLayer::recv");
static_assert(offsetof(MoeLayer, send_splits) == 56, "MoeLayer::send_splits");
static_assert(offsetof(MoeLayer, stage_so) == 64, "MoeLayer::stage_so");
static_assert(offsetof(MoeLayer, back_so) == 72, "MoeLayer::back_so");
static_assert(offsetof(MoeLayer, view_so) == 80, "MoeLayer::view_so");
static_assert(offsetof(MoeLayer, slot_rows) == 88, "MoeLayer::slot_rows");
static_assert(offsetof(MoeLayer, state) == 96, "MoeLayer::state");
static_assert(offsetof(MoeLayer, scratch) == 104, "MoeLayer::scratch");
static_assert(offsetof(MoeLayer, outputs) == 112, "MoeLayer::outputs");
static_assert(offsetof(MoeLayer, out) == 120, "MoeLayer::out");
static_assert(offsetof(MoeLayer, data_bytes) == 128, "MoeLayer::data_bytes");
static_assert(offsetof(MoeLayer, meta) == 136, "MoeLayer::meta");
static_assert(offsetof(MoeLayer, stride) == 144, "MoeLayer::stride");
static_assert(offsetof(MoeLayer, max_tokens) == 152, "MoeLayer::max_tokens");
static_assert(offsetof(MoeLayer, hidden) == 160, "MoeLayer::hidden");
static_assert(offsetof(MoeLayer, top_k) == 168, "MoeLayer::top_k");
static_assert(offsetof(MoeLayer, ne) == 172, "MoeLayer::ne");
static_assert(offsetof(MoeLayer, major_align) == 176, "MoeLayer::major_align");
static_assert(offsetof(MoeLayer, phase) == 180, "MoeLayer::phase");

// The marker of a bad routing in the first split, which fails the
// dispatch's check (class NegativeSplit) on every PE: `kRouteBad - code`,
// where code 0 is a bad token count and `fault << 56 | (slot + 1)` names
// the first bad (token × top_k + slot), the fault one of
// `kRouteExpertOutOfRange`, `kRouteRepeatedExpert`, `kRouteBadWeight`
// (`ROUTE_BAD` and its faults in abi.rs).
constexpr int64_t kRouteBad = -(1ll << 62);
constexpr int kRouteFaultShift = 56;
constexpr unsigned long long kRouteExpertOutOfRange = 0, kRouteRepeatedExpert = 1, kRouteBadWeight = 2;

}  // namespace k
}  // namespace shmem
