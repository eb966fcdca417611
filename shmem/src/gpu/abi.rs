//! The host–device ABI of shmem's kernels (`../kernels/`): every struct a
//! kernel takes by value or writes for the host, and every constant both
//! sides use. The CUDA twin is `kernels/abi.cuh`; each struct here is
//! followed by const asserts of its size and of every field's offset, which
//! that header asserts with the same numbers (`static_assert`).
//!
//! A change to any of these is a change to both sides at once.

use std::mem::{offset_of, size_of};

/// Threads of a block of the collective and MoE kernels
/// (`__launch_bounds__(512)`); the line kernels take up to
/// [`LINES_MAX_THREADS`].
pub(crate) const THREADS: u32 = 512;

/// Most blocks a collective kernel uses: one channel of every signal array
/// each (`kMaxBlocks`).
pub(crate) const MAX_BLOCKS: usize = 128;

/// Most threads a block of the line kernels takes (`kLinesMaxThreads`): 20
/// warps, so that 128 blocks move a peer's 1 MiB in one pass of 4 lines a
/// warp.
pub(crate) const LINES_MAX_THREADS: u32 = 640;

/// Most blocks when some peer is reached through RMA (`kRmaBlocks`), and
/// the staging bytes each such block has per peer for gets (`kRmaChunk`).
pub(crate) const RMA_BLOCKS: usize = 32;
pub(crate) const RMA_CHUNK: usize = 8192;

/// Largest team the kernels take (`kMaxTeam`); larger teams use NVSHMEM's
/// collectives.
pub(crate) const MAX_TEAM: usize = 64;

/// The push kernels: the most bytes one PE sends another
/// (`kPushMaxBytes`), and the largest world they have staging for
/// (`kPushMaxTeam`).
pub(crate) const PUSH_MAX_BYTES: usize = 1 << 20;
pub(crate) const PUSH_MAX_TEAM: usize = 8;

/// Signal arrays of a team's synchronisation slot (`enum Array`: arrive,
/// data, depart), each [`MAX_BLOCKS`] × n 64-bit words; then
/// [`MAX_BLOCKS`] epoch counters of the block channels and [`MAX_BLOCKS`]
/// that the low-latency and push kernels share.
pub(crate) const SIGNAL_ARRAYS: usize = 3;
pub(crate) const EPOCH_COUNTERS: usize = 2 * MAX_BLOCKS;

/// Alignment of the regions of the kernels' state that are rounded up
/// (`(x + 255) / 256 * 256` on the device).
pub(crate) const STATE_ALIGN: usize = 256;

/// Bytes of the one-kernel MoE all-to-all-v's counters in a team's slot,
/// before its packets (`A2avPackets::slot`).
pub(crate) const A2AV_COUNTER_BYTES: usize = 256;

/// Split words that the one-kernel MoE all-to-all-v's packets take per
/// buffer (`kA2avPacketWords`), each in a packet of [`PACKET_BYTES`].
pub(crate) const A2AV_PACKET_WORDS: usize = 1024;

/// A low-latency packet: 8 data bytes with a flag in each 4-byte half.
pub(crate) const PACKET_BYTES: usize = 16;

/// The low-latency packets' room per sender: in any world
/// (`kLLMaxBytes`), and in worlds of up to [`PUSH_MAX_TEAM`]
/// (`kLLMaxBytesSmallTeam`).
pub(crate) const LL_MAX_BYTES: usize = 128 << 10;
pub(crate) const LL_MAX_BYTES_SMALL_TEAM: usize = 1 << 20;

/// Bytes of a sender's low-latency buffer beyond its packets that only
/// lines use (`kLinesSlackBytes`).
pub(crate) const LINES_SLACK_BYTES: usize = 64 << 10;

/// A line of the line kernels, and its data bytes with a 4-byte flag in
/// each 64-byte half (`LinesOf<4>::kDataBytes`) or an 8-byte one
/// (`LinesOf<8>::kDataBytes`).
pub(crate) const LINE_BYTES: usize = 128;
pub(crate) const LINE_DATA_BYTES: usize = LINE_BYTES - 2 * 4;
pub(crate) const LINE_DATA_BYTES_WIDE: usize = LINE_BYTES - 2 * 8;

/// Words of a collective call's descriptor row (`kAgreeWords`): the
/// control plane's `DESC_WORDS` (asserted where both are seen,
/// `team.rs`). Word [`AGREE_HEAD_WORD`] holds, from bit
/// [`AGREE_ERROR_SHIFT`], the error code of a PE whose own arguments
/// failed its checks; word [`AGREE_PRIVATE_WORD`] is per PE, not compared.
pub(crate) const AGREE_WORDS: usize = 8;
pub(crate) const AGREE_HEAD_WORD: usize = 1;
pub(crate) const AGREE_ERROR_SHIFT: u32 = 24;
pub(crate) const AGREE_PRIVATE_WORD: usize = 7;
/// Bytes an eager all-reduce over NVLink may carry in its agreement's
/// packets (`kAgreeDataBytes`; `allreduce_agreed` in `coll/reduce.cuh`).
pub(crate) const AGREE_DATA_BYTES: usize = 256;

/// The rail pipes of the node-aware collectives (`prims/rail.cuh`): pipe
/// channels between two PEs of one rail in each direction (a kernel's
/// blocks of each role take one each, so at most half of them a role),
/// chunks a pipe holds in flight, and a chunk's most bytes
/// (`kRailChannels`, `kRailDepth`, `kRailChunk`).
pub(crate) const RAIL_CHANNELS: usize = 16;
pub(crate) const RAIL_DEPTH: usize = 4;
pub(crate) const RAIL_CHUNK: usize = 64 << 10;

/// `shmem::k::TeamSync` of `abi.cuh`, passed by value: a team's view
/// of the heap and of its synchronisation state, and the agreement of an
/// eager collective call (see `kernels/core/agree.cuh`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct TeamSync {
    /// Device address of the members' heap bases (0 where a member is
    /// reached through RMA).
    pub(in crate::gpu) peer_heap: u64,
    /// Device address of the members' world PE numbers (`int`).
    pub(in crate::gpu) pes: u64,
    /// This PE's heap base (also the symmetric address).
    pub(in crate::gpu) heap: u64,
    /// Heap offsets of the team's synchronisation slot, the world's
    /// low-latency packets and this PE's RMA staging.
    pub(in crate::gpu) sync_offset: u64,
    pub(in crate::gpu) ll_offset: u64,
    pub(in crate::gpu) temp_offset: u64,
    pub(in crate::gpu) rank: i32,
    pub(in crate::gpu) n: i32,
    /// Non-zero when some member is reached through RMA.
    pub(in crate::gpu) rma: i32,
    pub(in crate::gpu) _pad: i32,
    /// The call's agreement epoch (the team's count of eager calls on the
    /// device path); 0: the kernel does not agree (graph capture, the
    /// kernels after the first of a call, internal launches).
    pub(in crate::gpu) agree: u64,
    /// Device address of this PE's host-mapped [`AgreeFailure`].
    pub(in crate::gpu) report: u64,
    /// This PE's descriptor row of the call, with `agree`.
    pub(in crate::gpu) row: [u64; AGREE_WORDS],
    /// Bit r set when member r is on another node (members past
    /// [`MAX_TEAM`] have none: the kernels take no such team). The node's
    /// mask also where RMA is forced.
    pub(in crate::gpu) remote: u64,
    /// Heap offset of this PE's [`NET_COUNTER_WORDS`] counters of traffic
    /// with other nodes (`NetCounters`).
    pub(in crate::gpu) net_offset: u64,
}

const _: () = assert!(size_of::<TeamSync>() == 160);
const _: () = assert!(offset_of!(TeamSync, peer_heap) == 0);
const _: () = assert!(offset_of!(TeamSync, pes) == 8);
const _: () = assert!(offset_of!(TeamSync, heap) == 16);
const _: () = assert!(offset_of!(TeamSync, sync_offset) == 24);
const _: () = assert!(offset_of!(TeamSync, ll_offset) == 32);
const _: () = assert!(offset_of!(TeamSync, temp_offset) == 40);
const _: () = assert!(offset_of!(TeamSync, rank) == 48);
const _: () = assert!(offset_of!(TeamSync, n) == 52);
const _: () = assert!(offset_of!(TeamSync, rma) == 56);
const _: () = assert!(offset_of!(TeamSync, _pad) == 60);
const _: () = assert!(offset_of!(TeamSync, agree) == 64);
const _: () = assert!(offset_of!(TeamSync, report) == 72);
const _: () = assert!(offset_of!(TeamSync, row) == 80);
const _: () = assert!(offset_of!(TeamSync, remote) == 144);
const _: () = assert!(offset_of!(TeamSync, net_offset) == 152);
const _: () = assert!(MAX_TEAM <= 64, "TeamSync::remote has a bit a member");

/// Words of `NetCounters` (`abi.cuh`): bytes put, bytes got, puts, gets,
/// signals, in that order ([`crate::traffic::NetTraffic::from_words`]).
pub(crate) const NET_COUNTER_WORDS: usize = 5;

impl TeamSync {
    /// Members of the team.
    pub(crate) fn n_pes(&self) -> usize {
        self.n as usize
    }

    /// Whether every member is reached over NVLink (no RMA).
    pub(crate) fn nvlink(&self) -> bool {
        self.rma == 0
    }

    /// The view for a call that its kernel agrees on: agreement `epoch`
    /// (from 1) of this PE's descriptor `row`.
    pub(crate) fn agreeing(self, epoch: u64, row: [u64; AGREE_WORDS]) -> TeamSync {
        TeamSync { agree: epoch, row, ..self }
    }

    /// The agreement's epoch (0: none).
    pub(crate) fn agreement(&self) -> u64 {
        self.agree
    }
}

/// `AgreeFailure` of `abi.cuh`: what a kernel records, in host memory
/// mapped into the device, when its agreement on an eager collective call
/// fails. The first failure since the host last looked is kept whole; each
/// counts and names itself in `latest_*`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct AgreeFailure {
    /// Failed agreements since the host last looked (0: none).
    pub count: u64,
    /// The latest failure's epoch and its team's `sync_offset`.
    pub latest_epoch: u64,
    pub latest_slot: u64,
    /// The first failure's epoch and its team's `sync_offset`.
    pub epoch: u64,
    pub slot: u64,
    /// The first failure's team: its members, this PE's place among them,
    /// their world PEs and their rows.
    pub n: i32,
    pub rank: i32,
    pub pes: [i32; MAX_TEAM],
    pub rows: [[u64; AGREE_WORDS]; MAX_TEAM],
}

const _: () = assert!(size_of::<AgreeFailure>() == 4400);
const _: () = assert!(std::mem::align_of::<AgreeFailure>() == 8);
const _: () = assert!(offset_of!(AgreeFailure, count) == 0);
const _: () = assert!(offset_of!(AgreeFailure, latest_epoch) == 8);
const _: () = assert!(offset_of!(AgreeFailure, latest_slot) == 16);
const _: () = assert!(offset_of!(AgreeFailure, epoch) == 24);
const _: () = assert!(offset_of!(AgreeFailure, slot) == 32);
const _: () = assert!(offset_of!(AgreeFailure, n) == 40);
const _: () = assert!(offset_of!(AgreeFailure, rank) == 44);
const _: () = assert!(offset_of!(AgreeFailure, pes) == 48);
const _: () = assert!(offset_of!(AgreeFailure, rows) == 304);

/// `RailOp` of `abi.cuh`: one node-aware collective of the world team
/// laid out node by node, passed by value to the `shmem_*_nodes` kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RailOp {
    /// Heap offsets of the destination and the source.
    pub dst: u64,
    pub src: u64,
    /// Bytes (all-gather, all-to-all: per member; broadcast) or elements
    /// (all-reduce; reduce-scatter: per member).
    pub count: u64,
    /// Heap offset of the rail pipes' state (set by the launcher).
    pub(in crate::gpu) rail: u64,
    /// Members on each node.
    pub per_node: i32,
    /// Pipe channels of each role: the grid is twice as many blocks (set
    /// by the launcher).
    pub(in crate::gpu) channels: i32,
    /// The broadcast's root (team rank).
    pub root: i32,
    pub(in crate::gpu) _pad: i32,
}

const _: () = assert!(size_of::<RailOp>() == 48);
const _: () = assert!(offset_of!(RailOp, dst) == 0);
const _: () = assert!(offset_of!(RailOp, src) == 8);
const _: () = assert!(offset_of!(RailOp, count) == 16);
const _: () = assert!(offset_of!(RailOp, rail) == 24);
const _: () = assert!(offset_of!(RailOp, per_node) == 32);
const _: () = assert!(offset_of!(RailOp, channels) == 36);
const _: () = assert!(offset_of!(RailOp, root) == 40);
const _: () = assert!(offset_of!(RailOp, _pad) == 44);

/// Which MoE all-to-all-v an [`A2av`] is (`A2avKind` of `abi.cuh`): the
/// kernels are built once for each.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum A2avKind {
    /// `all_to_all_v`: one split per PE (`A2avV`).
    V = 0,
    /// `all_to_all_v_2d`: the dispatch, splits per expert (`A2av2d`).
    TwoD = 1,
    /// `all_to_all_v_2d_offset`: the combine, splits and offsets per
    /// expert (`A2av2dOffset`).
    TwoDOffset = 2,
}

impl A2avKind {
    pub(crate) const ALL: [A2avKind; 3] = [A2avKind::V, A2avKind::TwoD, A2avKind::TwoDOffset];

    /// The kind of [`A2av::kind`]'s value.
    pub(crate) fn of(kind: i32) -> Option<A2avKind> {
        A2avKind::ALL.into_iter().find(|k| *k as i32 == kind)
    }
}

/// `A2av` of `abi.cuh`: one MoE all-to-all-v, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct A2av {
    /// Heap offsets of the input, the output, the splits (and offsets) and
    /// out_splits_offsets.
    pub input: u64,
    pub output: u64,
    pub splits: u64,
    pub out_so: u64,
    pub row_bytes: u64,
    /// Rows the input and the output hold.
    pub in_rows: u64,
    pub out_rows: u64,
    /// Heap offset of this PE's staging (set by the launcher).
    pub(in crate::gpu) table: u64,
    /// Device address of the host-mapped [`A2avError`] (set by the launcher).
    pub(in crate::gpu) error: u64,
    /// Bytes of the busiest PE's rows per working data block (set by the
    /// launcher).
    pub(in crate::gpu) block_bytes: u64,
    /// An [`A2avKind`].
    pub kind: i32,
    /// Experts per PE (1 for [`A2avKind::V`]).
    pub ne: i32,
    pub major_align: i32,
    /// Whether the plan kernel stages the splits in its shared memory (set
    /// by the launcher).
    pub(in crate::gpu) shared_splits: i32,
    /// The data kernel's grid (set by the launcher).
    pub(in crate::gpu) blocks: i32,
    /// Of the working blocks, how many copy this PE's own chunks (0: each
    /// block does both; negative: the kernel chooses; set by the launcher).
    pub(in crate::gpu) local_blocks: i32,
    /// Heap offset of an `i64` of this PE that is non-zero where an
    /// agreement covering this call failed, so that the kernels skip it
    /// (the node-aware MoE layer's agreement over the world); 0: none.
    pub skip_if: u64,
}

const _: () = assert!(size_of::<A2av>() == 112);
const _: () = assert!(offset_of!(A2av, input) == 0);
const _: () = assert!(offset_of!(A2av, output) == 8);
const _: () = assert!(offset_of!(A2av, splits) == 16);
const _: () = assert!(offset_of!(A2av, out_so) == 24);
const _: () = assert!(offset_of!(A2av, row_bytes) == 32);
const _: () = assert!(offset_of!(A2av, in_rows) == 40);
const _: () = assert!(offset_of!(A2av, out_rows) == 48);
const _: () = assert!(offset_of!(A2av, table) == 56);
const _: () = assert!(offset_of!(A2av, error) == 64);
const _: () = assert!(offset_of!(A2av, block_bytes) == 72);
const _: () = assert!(offset_of!(A2av, kind) == 80);
const _: () = assert!(offset_of!(A2av, ne) == 84);
const _: () = assert!(offset_of!(A2av, major_align) == 88);
const _: () = assert!(offset_of!(A2av, shared_splits) == 92);
const _: () = assert!(offset_of!(A2av, blocks) == 96);
const _: () = assert!(offset_of!(A2av, local_blocks) == 100);
const _: () = assert!(offset_of!(A2av, skip_if) == 104);

impl A2av {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        kind: i32,
        input: usize,
        output: usize,
        splits: usize,
        out_so: usize,
        row_bytes: usize,
        in_rows: usize,
        out_rows: usize,
        ne: usize,
        major_align: usize,
    ) -> A2av {
        A2av {
            input: input as u64,
            output: output as u64,
            splits: splits as u64,
            out_so: out_so as u64,
            row_bytes: row_bytes as u64,
            in_rows: in_rows as u64,
            out_rows: out_rows as u64,
            table: 0,
            error: 0,
            block_bytes: 0,
            kind,
            ne: ne as i32,
            major_align: major_align as i32,
            shared_splits: 0,
            blocks: 0,
            local_blocks: 0,
            skip_if: 0,
        }
    }

    /// Whether this is the combine ([`A2avKind::TwoDOffset`]), whose
    /// splits come with offsets.
    pub(crate) fn with_offsets(&self) -> bool {
        self.kind == A2avKind::TwoDOffset as i32
    }
}

/// `A2avError` of `abi.cuh`: the record a MoE kernel writes, in host memory
/// mapped into the device, when its check of an exchange fails.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct A2avError {
    /// The first failure: `class << 56 | kind << 52 | pe << 32 | index`
    /// (see the `A2AV_CODE_*` constants).
    pub code: u64,
    /// The offending split, offset or received rows.
    pub value: i64,
    /// Failed operations since the host last looked (0: none).
    pub count: u64,
    /// The input's or the output's rows.
    pub limit: u64,
}

const _: () = assert!(size_of::<A2avError>() == 32);
const _: () = assert!(offset_of!(A2avError, code) == 0);
const _: () = assert!(offset_of!(A2avError, value) == 8);
const _: () = assert!(offset_of!(A2avError, count) == 16);
const _: () = assert!(offset_of!(A2avError, limit) == 24);

/// Where the parts of [`A2avError::code`] lie: the class (`A2avClass`) from
/// bit 56, the operation's [`A2avKind`] in the 4 bits from 52, the PE in
/// the 20 bits from 32, the entry in the low 32.
pub(crate) const A2AV_CODE_CLASS_SHIFT: u32 = 56;
pub(crate) const A2AV_CODE_KIND_SHIFT: u32 = 52;
pub(crate) const A2AV_CODE_KIND_MASK: u64 = 0xf;
pub(crate) const A2AV_CODE_PE_SHIFT: u32 = 32;
pub(crate) const A2AV_CODE_PE_MASK: u64 = 0xfffff;
pub(crate) const A2AV_CODE_INDEX_MASK: u64 = 0xffff_ffff;

/// The classes of a failed MoE all-to-all-v check (`A2avClass` of
/// `abi.cuh`): a negative split, a negative offset, an offset before the
/// previous chunk's end, a chunk past the input (classes of a PE's splits)
/// and an output too small for what a PE receives.
pub(crate) const A2AV_NEGATIVE_SPLIT: u32 = 1;
pub(crate) const A2AV_NEGATIVE_OFFSET: u32 = 2;
pub(crate) const A2AV_OFFSET_BACKWARDS: u32 = 3;
pub(crate) const A2AV_PAST_INPUT: u32 = 4;
/// The host reads every class from [`A2AV_PAST_INPUT`] on as a size
/// mismatch, and what is not a split's class as this one.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const A2AV_PAST_OUTPUT: u32 = 5;

/// The route kernel's marker of a bad routing in the first split
/// (`kRouteBad` of `moe/layer.cu`, reported as an [`A2AV_NEGATIVE_SPLIT`]):
/// `ROUTE_BAD - code`, where code 0 is a bad token count and `fault <<
/// ROUTE_FAULT_SHIFT | (slot + 1)` names the first bad `token × top_k +
/// slot`, `fault` one of the `ROUTE_*` faults below.
pub(crate) const ROUTE_BAD: i64 = -(1 << 62);
pub(crate) const ROUTE_FAULT_SHIFT: u32 = 56;
pub(crate) const ROUTE_EXPERT_OUT_OF_RANGE: i64 = 0;
pub(crate) const ROUTE_REPEATED_EXPERT: i64 = 1;
pub(crate) const ROUTE_BAD_WEIGHT: i64 = 2;

/// `MoeLayer` of `abi.cuh`: the MoE layer's kernels' arguments (heap
/// offsets and sizes), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MoeLayer {
    /// The caller's tokens: `max_tokens` rows of `data_bytes`.
    pub tokens: u64,
    /// `max_tokens × top_k` i64 global expert ids.
    pub ids: u64,
    /// `max_tokens × top_k` f32 weights.
    pub weights: u64,
    /// One i64: the dispatch's token count.
    pub n_tokens: u64,
    /// Wire rows out; the partials that come back.
    pub send: u64,
    /// Wire rows in; the partials that go back.
    pub stage: u64,
    /// The dispatched view.
    pub recv: u64,
    /// `n` i64: wire rows to each PE.
    pub send_splits: u64,
    /// `2n` i64: the dispatch exchange's out splits/offsets.
    pub stage_so: u64,
    /// `2n` i64: the combine exchange's out splits/offsets.
    pub back_so: u64,
    /// `2 × ne × n` i64: the view's splits and offsets.
    pub view_so: u64,
    /// `max_tokens × top_k` i64: each slot's wire row.
    pub slot_rows: u64,
    /// 2 i64: the last dispatch's token count (-1 after a bad one), and
    /// the verdict of the node-aware form's agreement over the world
    /// (`shmem_moe_agree`; non-zero: failed).
    pub state: u64,
    /// u32 counters: the one-block route's [`ROUTE_THREADS`] × (`n + ne`),
    /// then `ne × n`; or the flat form's route over many blocks' words and
    /// tables (`rank_scratch_len`), zeroed at allocation.
    pub scratch: u64,
    /// The experts' outputs, laid out as the view.
    pub outputs: u64,
    /// The combine's result: `n_tokens` rows.
    pub out: u64,
    /// A token's bytes.
    pub data_bytes: i64,
    /// Where a wire row's metadata starts.
    pub meta: i64,
    /// A wire row's bytes.
    pub stride: i64,
    pub max_tokens: i64,
    pub hidden: i64,
    pub top_k: i32,
    /// Experts per PE.
    pub ne: i32,
    pub major_align: i32,
    /// 0: the source side; 1: the receiving side.
    pub phase: i32,
    /// Pre-quantized tokens' scales: `max_tokens × ⌈hidden/128⌉` f32.
    pub token_scales: u64,
    /// Where the combine's expert side writes its partials (`stage` in the
    /// native format).
    pub partials: u64,
    /// The FP8 view's codes: rows of `hidden` bytes.
    pub recv_codes: u64,
    /// The FP8 view's scales: rows of `⌈hidden/128⌉` f32.
    pub recv_scales: u64,
    /// A partial's row in the combine's exchange.
    pub back_stride: i64,
    /// Where a wire row's scales start (the FP8 format).
    pub scales_at: i64,
    /// The wire format: 0 native; [`FP8_QUANTIZE`]; [`FP8_PRE_QUANTIZED`].
    pub fp8: i32,
    /// The receiver's phase of the FP8 format: 1 to write the bf16 view too.
    pub dequantize: i32,
    /// The node-aware form (all 0 in the flat one): the forwarder's input,
    /// the rail stage's rows.
    pub forward_in: u64,
    /// `2 × nodes` i64: the rail exchange's out splits/offsets.
    pub forward_so: u64,
    /// The forwarder's combine: the rail combine exchange's out
    /// splits/offsets, which it poisons.
    pub next_so: u64,
    /// The forwarder's combine: the rail combine's in_splits, poisoned
    /// where that exchange must fail.
    pub fail_splits: u64,
    /// Bytes between the combine's result rows; 0: `hidden` elements.
    pub out_stride: i64,
    /// The rail route: 1 + this PE, carried in the token field; 0 in the flat form.
    pub origin: i32,
    /// The node stage's receiver: source PEs of the view; 0: the team's.
    pub view_n: i32,
    /// `ne × n` u64 arrival flags (`n` the view's sources; entry
    /// `expert × n + source`), the epoch word, the placement counters
    /// (see `MoeAllToAll::arrivals`).
    pub arrivals: u64,
    /// The decode form (`moe/decode.cu`; 0 in the exchange form): its
    /// words, [`decode_words`] u64, zeroed.
    pub decode: u64,
    /// `n × max_tokens × top_k` i32: the view row of each staged slot.
    pub views: u64,
    /// Device address of the host-mapped [`A2avError`] (set by the launcher).
    pub error: u64,
    /// 1: the decode form's phase in lines (`moe/decode.cu`; see
    /// `MoeAllToAll::dispatch_lines` and `combine_lines`), else 0.
    pub lines: i32,
    pub _pad: i32,
}

/// `MoeLayer::fp8`: e4m3 on the wire, quantized from bf16 tokens in the gather.
pub(crate) const FP8_QUANTIZE: i32 = 1;
/// `MoeLayer::fp8`: e4m3 on the wire, from codes and scales the caller gave.
pub(crate) const FP8_PRE_QUANTIZED: i32 = 2;
/// The MoE layer's row kernels split a row into pieces of this many bytes,
/// a block a piece (`kLayerChunkBytes` in abi.cuh; a test checks they agree).
pub(crate) const LAYER_CHUNK_BYTES: usize = 8192;
/// The source's gather quantizing to FP8 splits a token into pieces of
/// this many elements (`kLayerQuantChunk` in abi.cuh; a test checks they agree).
pub(crate) const LAYER_QUANT_CHUNK: usize = 2048;
/// Most slots of a token the MoE layer's gather keeps in shared memory: up
/// to this top-k it works a token at a time, beyond it a slot at a time
/// (`kLayerSharedSlots` in abi.cuh; a test checks they agree).
pub(crate) const LAYER_SHARED_SLOTS: usize = 64;

/// The flat form's route over many blocks (`shmem_moe_rank`,
/// `shmem_moe_stamp` of moe/layer.cu) takes a top-k up to [`RANK_TOP_K`]
/// and experts a PE up to [`RANK_KEYS`], a chunk of [`RANK_CHUNK`] tokens
/// or staged rows a block (`kRankTopK`, `kRankKeys`, `kRankChunk` in
/// abi.cuh; a test checks they agree).
pub(crate) const RANK_TOP_K: usize = 8;
pub(crate) const RANK_KEYS: usize = 64;
pub(crate) const RANK_CHUNK: usize = THREADS as usize;

/// The MoE layer's decode form: at most this many tokens a PE
/// (`kDecodeMaxTokens` in abi.cuh), experts a PE (`kDecodeMaxExperts`), top-k
/// (`kDecodeMaxTopK`) and experts in the team, PEs × experts a PE
/// (`kDecodeMaxPairs`); its words' head (`kDecodeHeadWords`). A test
/// checks they agree.
pub(crate) const DECODE_MAX_TOKENS: usize = 256;
pub(crate) const DECODE_MAX_EXPERTS: usize = 32;
pub(crate) const DECODE_MAX_TOP_K: usize = 8;
pub(crate) const DECODE_MAX_PAIRS: usize = 512;
pub(crate) const DECODE_HEAD_WORDS: usize = 3;

/// The decode form's words on `n` PEs of `experts_per_pe` experts
/// (`DecodeWords` in moe/decode.cu): the head, then for each member its
/// `start`, `data` and `ready` words and, by the operation's parity, two
/// `info` records of `1 + experts_per_pe` words.
pub(crate) fn decode_words(n: usize, experts_per_pe: usize) -> usize {
    DECODE_HEAD_WORDS + n * (3 + 2 * (1 + experts_per_pe))
}

const _: () = assert!(size_of::<MoeLayer>() == 328);
const _: () = assert!(offset_of!(MoeLayer, lines) == 320);
const _: () = assert!(offset_of!(MoeLayer, decode) == 296);
const _: () = assert!(offset_of!(MoeLayer, views) == 304);
const _: () = assert!(offset_of!(MoeLayer, error) == 312);
const _: () = assert!(offset_of!(MoeLayer, forward_in) == 240);
const _: () = assert!(offset_of!(MoeLayer, forward_so) == 248);
const _: () = assert!(offset_of!(MoeLayer, next_so) == 256);
const _: () = assert!(offset_of!(MoeLayer, fail_splits) == 264);
const _: () = assert!(offset_of!(MoeLayer, out_stride) == 272);
const _: () = assert!(offset_of!(MoeLayer, origin) == 280);
const _: () = assert!(offset_of!(MoeLayer, view_n) == 284);
const _: () = assert!(offset_of!(MoeLayer, arrivals) == 288);
const _: () = assert!(offset_of!(MoeLayer, tokens) == 0);
const _: () = assert!(offset_of!(MoeLayer, token_scales) == 184);
const _: () = assert!(offset_of!(MoeLayer, partials) == 192);
const _: () = assert!(offset_of!(MoeLayer, recv_codes) == 200);
const _: () = assert!(offset_of!(MoeLayer, recv_scales) == 208);
const _: () = assert!(offset_of!(MoeLayer, back_stride) == 216);
const _: () = assert!(offset_of!(MoeLayer, scales_at) == 224);
const _: () = assert!(offset_of!(MoeLayer, fp8) == 232);
const _: () = assert!(offset_of!(MoeLayer, dequantize) == 236);
const _: () = assert!(offset_of!(MoeLayer, ids) == 8);
const _: () = assert!(offset_of!(MoeLayer, weights) == 16);
const _: () = assert!(offset_of!(MoeLayer, n_tokens) == 24);
const _: () = assert!(offset_of!(MoeLayer, send) == 32);
const _: () = assert!(offset_of!(MoeLayer, stage) == 40);
const _: () = assert!(offset_of!(MoeLayer, recv) == 48);
const _: () = assert!(offset_of!(MoeLayer, send_splits) == 56);
const _: () = assert!(offset_of!(MoeLayer, stage_so) == 64);
const _: () = assert!(offset_of!(MoeLayer, back_so) == 72);
const _: () = assert!(offset_of!(MoeLayer, view_so) == 80);
const _: () = assert!(offset_of!(MoeLayer, slot_rows) == 88);
const _: () = assert!(offset_of!(MoeLayer, state) == 96);
const _: () = assert!(offset_of!(MoeLayer, scratch) == 104);
const _: () = assert!(offset_of!(MoeLayer, outputs) == 112);
const _: () = assert!(offset_of!(MoeLayer, out) == 120);
const _: () = assert!(offset_of!(MoeLayer, data_bytes) == 128);
const _: () = assert!(offset_of!(MoeLayer, meta) == 136);
const _: () = assert!(offset_of!(MoeLayer, stride) == 144);
const _: () = assert!(offset_of!(MoeLayer, max_tokens) == 152);
const _: () = assert!(offset_of!(MoeLayer, hidden) == 160);
const _: () = assert!(offset_of!(MoeLayer, top_k) == 168);
const _: () = assert!(offset_of!(MoeLayer, ne) == 172);
const _: () = assert!(offset_of!(MoeLayer, major_align) == 176);
const _: () = assert!(offset_of!(MoeLayer, phase) == 180);

/// Threads of the route kernel (its `blockDim.x`), which sizes its scratch.
pub(crate) const ROUTE_THREADS: usize = THREADS as usize;

/// 64-bit words of one PE's splits in the MoE all-to-all-v's table
/// (`split_words` of `moe/a2av.cuh`): `n × ne`, twice that with offsets.
pub(crate) fn a2av_split_words(n: usize, ne: usize, with_offsets: bool) -> usize {
    let m = n.saturating_mul(ne);
    if with_offsets {
        m.saturating_mul(2)
    } else {
        m
    }
}

/// 64-bit words of every PE's splits and the work arrays of the MoE
/// all-to-all-v's table (`A2avTable` of `moe/a2av.cuh`): `n` PEs' splits, then
/// `2n` runs of `n × ne + 1` words.
pub(crate) fn a2av_work_words(n: usize, ne: usize, with_offsets: bool) -> usize {
    let m = n.saturating_mul(ne);
    n.saturating_mul(a2av_split_words(n, ne, with_offsets))
        .saturating_add(n.saturating_mul(2).saturating_mul(m.saturating_add(1)))
}

/// Most dynamic shared memory of a MoE kernel: the default limit (48 KiB),
/// less what the kernels declare statically.
pub(crate) const A2AV_SHARED_MAX_BYTES: usize = 46 << 10;

/// Most experts per PE of the MoE line kernel: a warp works out a
/// destination's chunks a lane each (`A2avLines::warp_chunks` in `moe/a2av_lines.cu`).
pub(crate) const A2AV_LINES_MAX_EXPERTS: usize = 32;

/// Words a chunk of the send plan (`A2avTable::plan`) and of the line
/// kernel's receipts.
const PLAN_WORDS: usize = 4;
const RECEIPT_WORDS: usize = 3;

/// Dynamic shared memory of the one-kernel MoE all-to-all-v: the table's
/// splits and work arrays, and the send plan.
pub(crate) fn a2av_one_kernel_shared_bytes(n: usize, ne: usize, with_offsets: bool) -> usize {
    let chunks = n.saturating_mul(ne);
    a2av_work_words(n, ne, with_offsets).saturating_add(PLAN_WORDS.saturating_mul(chunks)).saturating_mul(8)
}

/// Dynamic shared memory of the MoE line kernel: the table's splits and
/// work arrays, the send plan (for the own copy) and the receipts.
pub(crate) fn a2av_lines_shared_bytes(n: usize, ne: usize, with_offsets: bool) -> usize {
    let chunks = n.saturating_mul(ne);
    a2av_work_words(n, ne, with_offsets)
        .saturating_add((PLAN_WORDS + RECEIPT_WORDS).saturating_mul(chunks))
        .saturating_mul(8)
}

/// Dynamic shared memory of the MoE plan kernel: every PE's splits and the
/// work arrays where they fit, else none (they stay in the table in global
/// memory).
pub(crate) fn a2av_plan_shared_bytes(n: usize, ne: usize, with_offsets: bool) -> usize {
    let staged = a2av_work_words(n, ne, with_offsets).saturating_mul(8);
    if staged <= A2AV_SHARED_MAX_BYTES {
        staged
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    /// The constants that `abi.cuh` defines again for the kernels agree
    /// with this file's: a grid sized by another piece size than the
    /// kernels cut rows into still works, only slower, so nothing else
    /// would notice.
    #[test]
    fn constants_agree_with_abi_cuh() {
        let cuh = include_str!("../../../kernels/abi.cuh");
        for (line, what) in [
            (format!("constexpr int64_t kLayerChunkBytes = {};", super::LAYER_CHUNK_BYTES), "LAYER_CHUNK_BYTES"),
            (format!("constexpr int kLayerSharedSlots = {};", super::LAYER_SHARED_SLOTS), "LAYER_SHARED_SLOTS"),
            (format!("constexpr int kRankTopK = {};", super::RANK_TOP_K), "RANK_TOP_K"),
            (format!("constexpr int kRankKeys = {};", super::RANK_KEYS), "RANK_KEYS"),
            ("constexpr int kRankChunk = kBlockThreads;".to_string(), "RANK_CHUNK"),
            (format!("constexpr int64_t kLayerQuantChunk = {};", super::LAYER_QUANT_CHUNK), "LAYER_QUANT_CHUNK"),
            (format!("constexpr int kDecodeMaxTokens = {};", super::DECODE_MAX_TOKENS), "DECODE_MAX_TOKENS"),
            (format!("constexpr int kDecodeMaxExperts = {};", super::DECODE_MAX_EXPERTS), "DECODE_MAX_EXPERTS"),
            (format!("constexpr int kDecodeMaxTopK = {};", super::DECODE_MAX_TOP_K), "DECODE_MAX_TOP_K"),
            (format!("constexpr int kDecodeMaxPairs = {};", super::DECODE_MAX_PAIRS), "DECODE_MAX_PAIRS"),
            (format!("constexpr int kDecodeHeadWords = {};", super::DECODE_HEAD_WORDS), "DECODE_HEAD_WORDS"),
            (
                format!(
                    "constexpr int kFp8Quantize = {}, kFp8PreQuantized = {};",
                    super::FP8_QUANTIZE,
                    super::FP8_PRE_QUANTIZED
                ),
                "FP8_QUANTIZE, FP8_PRE_QUANTIZED",
            ),
        ] {
            assert!(cuh.contains(&line), "abi.cuh does not say `{line}` ({what} in abi.rs)");
        }
    }
}
