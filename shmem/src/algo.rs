//! Which implementation and algorithm the GPU backend's collectives use.
//!
//! By default shmem's own device kernels run every collective and choose
//! the algorithm by size and team size; NVSHMEM's team collectives stay
//! available as a named baseline ([`CollImpl::Nvshmem`]). The host backend
//! ignores these settings but [`AcrossNodes`] and [`ReduceOrder`], which
//! choose the data's route across nodes. Every PE must make the same choice, set between
//! collectives: the choice decides which kernel runs, and PEs running
//! different kernels would wait for each other forever (until the bounded
//! device wait traps).
//!
//! The choices themselves are this module's (crate-private) pure
//! functions, called by the collectives and the kernels' launchers: which
//! implementation runs, which algorithm and protocol a size, team and
//! tuning take, and the kernels' grids.

use crate::gpu::abi;

/// Who runs the GPU backend's collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CollImpl {
    /// shmem's device kernels (`kernels/*.cu`).
    #[default]
    Kernels,
    /// NVSHMEM's own team collectives (`nvshmemx_*_on_stream`), the
    /// baseline. Its reduce-scatter takes a source of at most half of
    /// `NVSHMEM_REDUCE_SCRATCH_SIZE` (512 KiB by default), past which
    /// NVSHMEM writes beyond its scratch: a larger one is refused on every
    /// PE ([`crate::Error::Invalid`]).
    Nvshmem,
}

/// The all-reduce algorithm of shmem's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllReduceAlgo {
    /// Chosen by size and team size.
    #[default]
    Auto,
    /// Every PE pushes its input, with a flag in every 8-byte word, into
    /// every peer's receive buffer and reduces what arrives: no barrier,
    /// one link latency. World team, up to [`low_latency_max_bytes`],
    /// NVLink path.
    LowLatency,
    /// As [`LowLatency`](Self::LowLatency), in 128-byte lines of 120 data
    /// bytes and a 4-byte flag in each 64-byte half (after NCCL's LL128;
    /// 112 and 8-byte flags for 8-byte elements): 1.07× the data's bytes on
    /// the link (1.14× with 8-byte flags), against the 8-byte packets' 2×. World
    /// team, up to the packets' room (1 MiB a peer in worlds of up to 8
    /// PEs, else 128 KiB), NVLink path, no PE sharing its GPU (there the
    /// 8-byte packets). The automatic choice from
    /// [`LOW_LATENCY_LINES_MIN_BYTES`] a peer.
    LowLatency128,
    /// Every PE stores its input into every peer's staging with one flag
    /// per block, and reduces what arrives: no barrier, plain 16-byte
    /// stores. World team of up to 8 PEs, up to [`PUSH_MAX_BYTES`], NVLink
    /// path; the automatic choice above the low-latency kernels' limit.
    Push,
    /// Every PE reads every peer's input and reduces all of it.
    OneShot,
    /// Every PE reduces its `1/n` share and writes it to every peer.
    TwoShot,
    /// Two-shot by stores alone, for a team of two over NVLink, out of
    /// place (elsewhere as [`TwoShot`](Self::TwoShot)): each PE stores its
    /// source's half of the peer's share into the peer's destination,
    /// then reduces its own share from its source and its destination and
    /// stores the result into both PEs' destinations. No loads cross the
    /// link. The automatic choice where it applies from 16 MiB a PE.
    TwoShotStores,
}

/// The all-gather algorithm of shmem's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllGatherAlgo {
    /// The low-latency kernel up to [`low_latency_max_bytes`] per PE (world
    /// team, NVLink), else the SM kernel, which is as fast as copy engines
    /// or faster at every size (`docs/tuning.md`).
    #[default]
    Auto,
    /// An SM kernel writes this PE's block into every peer's output.
    Sm,
    /// Copy engines move the blocks (`cuMemcpyAsync` through peer
    /// addresses): no SM moves data; two one-block barrier kernels bracket it.
    CopyEngine,
}

/// How shmem's kernels run the MoE all-to-all-v (`all_to_all_v`,
/// `all_to_all_v_2d`, `all_to_all_v_2d_offset` and [`crate::MoeAllToAll`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MoeKernels {
    /// One kernel where every peer is reached over NVLink and the splits
    /// are small enough (`n_pes² × experts_per_pe` words up to 1024, twice
    /// that for the combine, and every PE's splits with the plan's work
    /// arrays within 46 KiB of shared memory): each PE's splits travel
    /// with a flag in every word, no barrier runs first, every block checks
    /// the whole exchange and pushes its share of the rows straight into
    /// the peers' outputs. On the world team, an input of at most
    /// [`Tuning::moe_lines_max_bytes`] (by default any) goes as
    /// [`MoeKernels::Lines`] where it fits. Otherwise as
    /// [`MoeKernels::PlanThenMove`].
    #[default]
    Auto,
    /// A barrier and plan kernel (one block), then a data kernel: any
    /// team, RMA included.
    PlanThenMove,
    /// One kernel in which each PE, as it starts, sends its splits and
    /// then its rows for each peer in 128-byte lines of 112 data bytes and
    /// a flag in each half (after LL128) into the peer's low-latency
    /// buffer, while every PE checks the whole exchange and plans; each PE
    /// then copies what arrives into its output. No fence, signal or
    /// barrier: a line's flags are its arrival, and the rows are on the
    /// link while the peers check.
    /// The world team, every peer over NVLink, at most 32 experts per PE,
    /// an input that fits the buffer ([`moe_lines_fit`]) and splits within
    /// 46 KiB of shared memory, as [`MoeKernels::Auto`]'s one kernel;
    /// otherwise as [`MoeKernels::Auto`] without it. Its lines share the
    /// protocol of [`AllReduceAlgo::LowLatency128`].
    Lines,
}

/// Data bytes of one 128-byte line of the collectives' line kernels: a
/// 4-byte flag in each 64-byte half (`LinesOf` in the kernels'
/// `prims/lines.cuh`). Reductions of 8-byte elements and the MoE line kernel
/// carry [`LINE_DATA_BYTES_WIDE`].
pub const LINE_DATA_BYTES: usize = abi::LINE_DATA_BYTES;

/// Data bytes of one line with an 8-byte flag in each half: in reductions
/// of 8-byte elements (f64, i64, u64), so that no element is split between
/// two lanes' words, and in the MoE line kernel ([`MoeKernels::Lines`]),
/// which waits on each line's latency more than on the link
/// (`docs/tuning.md`).
pub const LINE_DATA_BYTES_WIDE: usize = abi::LINE_DATA_BYTES_WIDE;

/// Data bytes of one line of a reduction of `elem_bytes`-byte elements.
pub fn reduce_line_data_bytes(elem_bytes: usize) -> usize {
    if elem_bytes == 8 {
        LINE_DATA_BYTES_WIDE
    } else {
        LINE_DATA_BYTES
    }
}

/// Whether a MoE all-to-all-v (`combine`: `all_to_all_v_2d_offset`) on a
/// world of `n_pes` with `experts_per_pe` experts each fits the
/// low-latency buffer in lines ([`MoeKernels::Lines`]) with an input of
/// `input_bytes`: a PE's splits and all of its input, each chunk from a
/// fresh line, within one sender's buffer ([`low_latency_buffer_bytes`]).
pub fn moe_lines_fit(n_pes: usize, experts_per_pe: usize, combine: bool, input_bytes: usize) -> bool {
    let room = low_latency_buffer_bytes(n_pes) / abi::LINE_BYTES;
    let words = n_pes.saturating_mul(experts_per_pe).saturating_mul(if combine { 2 } else { 1 });
    let lines = words
        .div_ceil(LINE_DATA_BYTES_WIDE / 8)
        .saturating_add(experts_per_pe)
        .saturating_add(input_bytes.div_ceil(LINE_DATA_BYTES_WIDE));
    lines <= room
}

/// Largest message (bytes one PE sends another) of the low-latency kernels
/// in worlds of more than 8 PEs, and the least of any world, unless tuned
/// ([`Tuning::low_latency_max_bytes`]); see [`low_latency_max_bytes`].
pub const LOW_LATENCY_MAX_BYTES: usize = abi::LL_MAX_BYTES;

/// Room for the low-latency kernels' packets per sender in worlds of up to
/// 8 PEs: the largest [`Tuning::low_latency_max_bytes`] there (in larger
/// worlds, [`LOW_LATENCY_MAX_BYTES`]).
pub const LOW_LATENCY_ROOM_BYTES: usize = abi::LL_MAX_BYTES_SMALL_TEAM;

/// Room for the low-latency packets per sender in a world of `n_pes`: the
/// most bytes one PE sends another through them (`ll_max_bytes` in the
/// kernels' `prims/ll.cuh`, which must agree). The lines of
/// [`AllReduceAlgo::LowLatency128`] share their buffer, which is larger
/// ([`low_latency_buffer_bytes`]).
pub fn low_latency_room_bytes(n_pes: usize) -> usize {
    if n_pes <= abi::PUSH_MAX_TEAM {
        LOW_LATENCY_ROOM_BYTES
    } else {
        LOW_LATENCY_MAX_BYTES
    }
}

/// Bytes of a sender's low-latency buffer (at each receiver, for each of
/// two epoch parities) in a world of `n_pes`: its packets (16 bytes for 8
/// of data) and 64 KiB more that only lines use, so that the MoE line
/// kernel takes 128 tokens of 7168 bf16 with their splits (`ll_buffer_bytes`
/// in the kernels' `prims/ll.cuh`, which must agree).
pub fn low_latency_buffer_bytes(n_pes: usize) -> usize {
    2 * low_latency_room_bytes(n_pes) + abi::LINES_SLACK_BYTES
}

/// Largest message (bytes one PE sends another) that the low-latency
/// kernels take in a world of `n_pes` under `tuning`.
///
/// By default each PE sends at most [`LOW_LATENCY_ROOM_BYTES`] of data in
/// all (`1 MiB / (n_pes - 1)` a peer), and never less than
/// [`LOW_LATENCY_MAX_BYTES`] a peer (`docs/tuning.md`): their packets
/// carry a flag in every 8-byte word, so a PE's link carries twice its
/// data, and the limit is set by what each PE sends in all.
pub fn low_latency_max_bytes(n_pes: usize, tuning: &Tuning) -> usize {
    let room = low_latency_room_bytes(n_pes);
    let default = (LOW_LATENCY_ROOM_BYTES / n_pes.saturating_sub(1).max(1)).max(LOW_LATENCY_MAX_BYTES);
    tuning.low_latency_max_bytes.unwrap_or(default).min(room)
}

/// Smallest message (bytes one PE sends another) that the low-latency
/// kernels move in 128-byte lines rather than 8-byte packets under
/// `tuning`; by default [`LOW_LATENCY_LINES_MIN_BYTES`].
pub fn low_latency_lines_min_bytes(tuning: &Tuning) -> usize {
    tuning.low_latency_lines_min_bytes.unwrap_or(LOW_LATENCY_LINES_MIN_BYTES)
}

/// From this message a peer the low-latency kernels move lines, where they
/// are the fastest setting (`docs/tuning.md`). Each 64-byte half of a line
/// carries its own flag: with one flag a
/// line, a line could be taken on its flag while its first 64 bytes were
/// still the buffer's older contents.
pub const LOW_LATENCY_LINES_MIN_BYTES: usize = 256 << 10;

/// The largest input (bytes of a PE's rows) that [`MoeKernels::Auto`]
/// sends in lines ([`MoeKernels::Lines`]) where they fit, under `tuning`;
/// by default [`MOE_LINES_MAX_BYTES`] (every input that fits).
pub fn moe_lines_max_bytes(tuning: &Tuning) -> Option<usize> {
    tuning.moe_lines_max_bytes.or(MOE_LINES_MAX_BYTES)
}

/// Every input that fits goes in lines by default, the faster form where
/// it fits (`docs/tuning.md`). Its lines share the protocol of
/// [`AllReduceAlgo::LowLatency128`], a flag in each half
/// ([`LOW_LATENCY_LINES_MIN_BYTES`]).
pub const MOE_LINES_MAX_BYTES: Option<usize> = Some(usize::MAX);

/// Blocks of the low-latency kernels for a message of `bytes` a peer
/// under `tuning`: by default 16 below 32 KiB and 128 from there, where
/// more blocks are faster (`docs/tuning.md`).
pub fn low_latency_blocks(bytes: usize, tuning: &Tuning) -> u32 {
    match tuning.low_latency_blocks {
        Some(b) => b.clamp(1, 128),
        None if bytes < 32 << 10 => 16,
        None => 128,
    }
}

/// Most threads a block of the line kernels takes (`kLinesMaxThreads` in
/// `abi.cuh`): 20 warps, so that 128 blocks move a peer's 1 MiB in one
/// pass of 4 lines a warp.
pub const LINES_MAX_THREADS: u32 = abi::LINES_MAX_THREADS;

/// Threads a block of the low-latency kernels for `bytes` a peer on
/// `blocks` blocks, in 128-byte lines of `line_bytes` data bytes (else in
/// packets), under `tuning`.
/// By default 512 for packets; for lines, the warps that take every line
/// in one pass (4 lines a warp a pass), at least 8 and at most 20: a
/// second pass costs more than the warps it saves, and fewer warps start
/// sooner (`docs/tuning.md`). Tuned: whole warps, 32 to 512 (to 640 for
/// lines; outside, the nearer end; between, the warp below).
pub fn low_latency_threads(bytes: usize, blocks: u32, line_bytes: Option<usize>, tuning: &Tuning) -> u32 {
    let most = if line_bytes.is_some() { LINES_MAX_THREADS } else { abi::THREADS };
    match (tuning.low_latency_threads, line_bytes) {
        (Some(t), _) => t.clamp(32, most) / 32 * 32,
        (None, None) => abi::THREADS,
        (None, Some(per_line)) => {
            let per_pass = 4 * blocks.max(1) as usize;
            let warps = bytes.max(1).div_ceil(per_line.max(1)).div_ceil(per_pass);
            32 * warps.clamp(8, 20) as u32
        }
    }
}

/// Smallest collective (bytes of its destination) that a team of one PE
/// runs as a copy-engine copy (`cuMemcpyAsync` from its source) rather than
/// by a kernel, under `tuning`; see [`Tuning::solo_copy_engine_min_bytes`].
///
/// By default: every size in a CUDA graph; outside one, from
/// [`SOLO_COPY_ENGINE_MIN_BYTES_REDUCE`] for reductions (`reduces`) and
/// from [`SOLO_COPY_ENGINE_MIN_BYTES`] for the others, where the kernels'
/// launch is cheaper below (`docs/tuning.md`).
pub fn solo_copy_engine_min_bytes(reduces: bool, captured: bool, tuning: &Tuning) -> usize {
    match tuning.solo_copy_engine_min_bytes {
        Some(b) => b,
        None if captured => 0,
        None if reduces => SOLO_COPY_ENGINE_MIN_BYTES_REDUCE,
        None => SOLO_COPY_ENGINE_MIN_BYTES,
    }
}

/// Outside a CUDA graph, the smallest all-gather, broadcast or all-to-all
/// of a team of one that a copy engine copies (`docs/tuning.md`).
pub const SOLO_COPY_ENGINE_MIN_BYTES: usize = 8 << 20;

/// As [`SOLO_COPY_ENGINE_MIN_BYTES`] for all-reduce and reduce-scatter:
/// past the low-latency kernels (1 MiB) the reductions' kernels read and
/// write as for peers.
pub const SOLO_COPY_ENGINE_MIN_BYTES_REDUCE: usize = 2 << 20;

/// Smallest broadcast (bytes) that the members pull from the root over
/// NVLink, under `tuning`; by default [`BROADCAST_PULL_MIN_BYTES`].
pub fn broadcast_pull_min_bytes(tuning: &Tuning) -> usize {
    tuning.broadcast_pull_min_bytes.unwrap_or(BROADCAST_PULL_MIN_BYTES)
}

/// By default no broadcast is pulled (every member reading the root's
/// source through NVLink): the root's push kernel stores into the peers
/// and its own destination in one pass, and is as fast or faster
/// (`docs/tuning.md`).
pub const BROADCAST_PULL_MIN_BYTES: usize = usize::MAX;

/// Smallest broadcast (bytes) that the members relay, under `tuning`; by
/// default [`BROADCAST_RELAY_MIN_BYTES`].
pub fn broadcast_relay_min_bytes(tuning: &Tuning) -> usize {
    tuning.broadcast_relay_min_bytes.unwrap_or(BROADCAST_RELAY_MIN_BYTES)
}

/// By default a team of three or more over NVLink relays every broadcast
/// the push kernels do not take (past [`PUSH_MAX_BYTES`]): the root's
/// stores send each byte n−1 times through the root's links, the relay
/// once (`docs/tuning.md`).
pub const BROADCAST_RELAY_MIN_BYTES: usize = abi::PUSH_MAX_BYTES + 1;

/// Largest all-reduce of the push kernel ([`AllReduceAlgo::Push`]), bytes per PE.
pub const PUSH_MAX_BYTES: usize = abi::PUSH_MAX_BYTES;

/// The collectives' settings; see [`crate::Context::set_collectives`]. The
/// host backend reads [`Collectives::across_nodes`] and
/// [`Collectives::reduce_order`] only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Collectives {
    /// Who runs them.
    pub implementation: CollImpl,
    /// Every peer through NVSHMEM's RMA (put-with-signal, get) inside the
    /// kernels, even peers with an NVLink address (`SHMEM_FORCE_RMA=1`).
    pub force_rma: bool,
    /// The all-reduce algorithm.
    pub all_reduce: AllReduceAlgo,
    /// The all-gather algorithm.
    pub all_gather: AllGatherAlgo,
    /// The MoE all-to-all-v's kernels.
    pub moe: MoeKernels,
    /// Of the MoE all-to-all-v's data blocks, how many copy this PE's own
    /// chunks while the others push to the peers: `None` (the default)
    /// lets the kernel choose by the blocks at work (half of a small grid,
    /// an eighth of a large one); `Some(0)` has
    /// each block push its share, then copy its share; a number not below
    /// the working blocks counts as 0. A tuning knob; each PE may choose
    /// its own.
    pub moe_local_blocks: Option<u32>,
    /// The kernels' protocol limits and grids.
    pub tuning: Tuning,
    /// Whether collectives of a team spanning nodes take the node-aware
    /// forms, where a byte crosses between nodes once.
    pub across_nodes: AcrossNodes,
    /// The order in which the node-aware reductions combine the PEs' values.
    pub reduce_order: ReduceOrder,
}

/// Whether a collective across nodes takes its node-aware form: each byte
/// crosses between nodes once, between the PEs of one *rail* (the PEs of
/// the same local rank, one on each node), and is spread inside a node
/// from there; or its flat form, where every PE reaches every peer alike
/// and a byte may cross to a node once for each of its PEs.
///
/// The node-aware forms: an all-gather sends each PE's block to its rail
/// peers, which hand it to their node's PEs; a broadcast goes to the root's
/// node, then each of its PEs sends its share (`1/L` of the vector, `L`
/// PEs a node) along its rail; an all-to-all sends a PE's blocks for a node
/// as one transfer to its rail peer there, which hands each block to its
/// destination; an all-reduce and a reduce-scatter combine along the rails
/// in the order [`ReduceOrder`] says.
///
/// They apply (as [`crate::Team::node_aware`] tells) to the world team
/// spread over two nodes or more with the same number `L` of PEs on every
/// node, its ranks node by node (ranks `a·L .. a·L + L` on node `a`), not
/// under [`Collectives::force_rma`]. [`AcrossNodes::Auto`] also wants
/// `L ≥ 2` (with one PE a node both forms send the same bytes). Everywhere
/// else a collective runs flat, its reductions in PE order: split teams (the forms'
/// buffers are the world's), nodes of different sizes within the team,
/// ranks not node by node (`--map-by node`, where a chain in PE order would
/// cross the network at every PE), forced RMA (the flat form is the RMA
/// path's test) and one node.
///
/// Both backends take every node-aware form: the gpu backend in kernels
/// over the rail pipes, which stream pipelined chunks between the PEs of a
/// rail (its all-to-all in place goes through a copy of the source, which
/// a CUDA graph cannot capture). Node-aware collectives of the world must not run on
/// two streams at once (they share the world's pipes, as the low-latency
/// kernels share their buffers). Every PE must choose alike, between
/// collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AcrossNodes {
    /// Node-aware where it applies and each node has two PEs or more.
    #[default]
    Auto,
    /// Always the flat forms: the baseline.
    Flat,
    /// Node-aware where it applies, one PE a node included.
    NodeAware,
}

/// How the node-aware all-reduce and reduce-scatter ([`AcrossNodes`])
/// combine the values of the PEs; the flat forms always combine them in PE
/// order. Integer and bitwise reductions give the same bits in either
/// order; so do floats on one node.
///
/// Both backends give the same bits in either order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReduceOrder {
    /// The flat fold `x0 ⊕ x1 ⊕ … ⊕ x(n−1)` in PE order, in the accumulator
    /// type (`f32` for `f16` and `bf16`), rounded once: the same bits as the
    /// flat forms and as one node, on any number of nodes. Each rail carries
    /// a running sum from node to node, in the accumulator type, so the
    /// partial sums of 2-byte floats cross the network at twice their size.
    #[default]
    PeOrder,
    /// Each node's PEs first, then the nodes in node order:
    /// `from_acc(Σ_a to_acc(from_acc(P_a)))`, where `P_a` is node `a`'s
    /// fold in PE order in the accumulator type; the node partials cross
    /// the network rounded to the element type. The tree of node
    /// reduce-scatter, reduction among each rail, node all-gather, with the
    /// fewest bytes across nodes (`2 (N−1)/N · S/L` for an all-reduce of `S`
    /// bytes on `N` nodes of `L` PEs); its floats differ from PE order.
    NodeGrouped,
}

/// Knobs of shmem's kernels for measuring them on a machine (`shmem-bench
/// --ll-max-bytes …`, `gpu-run.sh --tune`); `None` keeps the default
/// (`docs/tuning.md` gives each default's evidence). Every PE must set the same: PEs that
/// disagree pick different kernels or grids and wait for each other until
/// the device-side wait traps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tuning {
    /// Largest message (bytes one PE sends another) that the low-latency
    /// kernels take (world team, NVLink): by default as
    /// [`low_latency_max_bytes`] says; at most [`LOW_LATENCY_ROOM_BYTES`]
    /// in worlds of up to 8 PEs and [`LOW_LATENCY_MAX_BYTES`] in larger
    /// ones (more counts as that).
    pub low_latency_max_bytes: Option<usize>,
    /// Smallest message (bytes one PE sends another) that the low-latency
    /// kernels move in 128-byte lines of 120 data bytes and a flag in each
    /// half (after NCCL's LL128) rather than in 8-byte packets with a flag
    /// each: by default as [`low_latency_lines_min_bytes`] says (256 KiB).
    pub low_latency_lines_min_bytes: Option<usize>,
    /// Blocks of the low-latency kernels at every size: by default as
    /// [`low_latency_blocks`] says; 1 to 128 (outside, the nearer end).
    pub low_latency_blocks: Option<u32>,
    /// Threads a block of the low-latency kernels: by default as
    /// [`low_latency_threads`] says (512 for packets; for lines, enough
    /// warps for one pass, 8 to 20).
    pub low_latency_threads: Option<u32>,
    /// Blocks of the push kernels: by default 64; 1 to 128 (outside, the
    /// nearer end).
    pub push_blocks: Option<u32>,
    /// The MoE all-to-all-v: bytes of the busiest PE's rows per working
    /// data block, which sets how many blocks move the rows: by default
    /// 32 KiB; at least 16. In [`MoeKernels::Lines`], where every block
    /// works, bytes of the input (rows it can hold) per block: by default
    /// 7168 (one pass of the block's warps, 4 lines of 112 bytes each),
    /// on no more blocks than every PE's GPU runs at once (a block an SM;
    /// under CUDA MPS, a PE's share of them less an eighth). Either way at
    /// most 128 blocks.
    pub moe_block_bytes: Option<usize>,
    /// The largest input (bytes of rows a PE's input holds) for which
    /// [`MoeKernels::Auto`] moves the rows in lines
    /// ([`MoeKernels::Lines`]) where they fit: by default as
    /// [`moe_lines_max_bytes`] says (every input that fits); 0 leaves
    /// only empty inputs to them.
    pub moe_lines_max_bytes: Option<usize>,
    /// The most bytes of rows for the team's `n_pes × max_tokens` tokens
    /// for which the decode form of [`crate::MoeAllToAll`] sends its
    /// dispatch's rows and its combine's partials in 128-byte lines where
    /// they fit: by default 512 KiB for the dispatch's rows and 2 MiB for
    /// the combine's partials (past those, counted stores are faster); 0
    /// never.
    pub moe_layer_lines_max_bytes: Option<usize>,
    /// A team of one PE (the world of a single-PE run, or a split team of
    /// one): every data collective's result is its source as it is (a
    /// reduction over one member, the only block, the root's own data), so
    /// it is a copy, and nothing where source and destination are the
    /// same. From this many bytes of destination the copy goes to a copy
    /// engine (`cuMemcpyAsync`, as NCCL does with one rank), in CUDA graphs
    /// and outside them, below it to the kernels: by default as
    /// [`solo_copy_engine_min_bytes`] says.
    pub solo_copy_engine_min_bytes: Option<usize>,
    /// Smallest broadcast (bytes) that every member pulls from the root
    /// through NVLink rather than the root pushing it (every member over
    /// NVLink): by default as [`broadcast_pull_min_bytes`] says (none).
    pub broadcast_pull_min_bytes: Option<usize>,
    /// Smallest broadcast (bytes) of a team of three or more over NVLink
    /// that the members relay: each of n−1 members reads its share of the
    /// root's source and stores it into every non-root, rather than the
    /// root storing everything into every peer: by default as
    /// [`broadcast_relay_min_bytes`] says. A pulled broadcast
    /// ([`Tuning::broadcast_pull_min_bytes`]) is pulled at any size.
    pub broadcast_relay_min_bytes: Option<usize>,
}

/// Up to this many bytes per PE the automatic all-reduce is one-shot (each
/// PE reduces everything) where it may be (out of place, on the GPU
/// backend), above it two-shot (reduce-scatter, then all-gather).
pub(crate) const ONE_SHOT_MAX_BYTES: usize = 256 << 10;

/// From this many bytes per PE the automatic two-shot all-reduce of a pair
/// over NVLink, out of place, moves both halves by stores
/// ([`AllReduceAlgo::TwoShotStores`]), faster there than the pulling
/// two-shot (`docs/tuning.md`).
pub(crate) const TWO_SHOT_STORES_MIN_BYTES: usize = 16 << 20;

/// In a world of 4 to 8 PEs over NVLink the automatic all-reduce takes
/// the lines from this size per PE, below [`WIDE_TWO_SHOT_MIN_BYTES`], and
/// the two-shot from there, where a pair takes packets, lines and pushes
/// (`docs/tuning.md`). Only where neither low-latency limit is tuned.
pub(crate) const WIDE_LINES_MIN_BYTES: usize = 16 << 10;
/// See [`WIDE_LINES_MIN_BYTES`].
pub(crate) const WIDE_TWO_SHOT_MIN_BYTES: usize = 1 << 20;

/// Blocks of the push kernels unless tuned ([`Tuning::push_blocks`]).
pub(crate) const PUSH_BLOCKS: usize = 64;

/// What the choice of a collective's protocol reads of its team.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TeamShape {
    /// The world team: the low-latency and push kernels' buffers are its.
    pub(crate) world: bool,
    pub(crate) n_pes: usize,
    /// Every member is reached over NVLink (no RMA).
    pub(crate) nvlink: bool,
    /// The line protocol may serve it: no PE of the world shares its GPU
    /// with another. A line's two flags vouch for 64-byte halves, which
    /// NVLink delivers whole; stores to a process on the same GPU reach
    /// its memory in 32-byte sectors, so a receiver there can see a half's
    /// flag beside older contents in its other sector.
    pub(crate) lines: bool,
}

impl TeamShape {
    /// Whether the world's protocols (low-latency packets and lines,
    /// pushes) may serve this team at all.
    fn world_over_nvlink(self) -> bool {
        self.world && self.nvlink
    }

    /// Whether the world's line protocols (the low-latency lines, the MoE
    /// line kernel) may serve this team: as [`TeamShape::world_over_nvlink`],
    /// and no PE sharing its GPU ([`TeamShape::lines`]).
    fn lines_serve(self) -> bool {
        self.world_over_nvlink() && self.lines
    }
}

/// How a collective's kernel reaches the peers: by loads and stores (or
/// RMA) on the team's synchronisation, or by one of the world team's
/// protocols over NVLink: low-latency packets, their 128-byte lines, or
/// pushes into the peers' staging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Sm,
    LowLatency,
    LowLatency128,
    Push,
}

/// How an all-reduce runs: [`AllReduceAlgo`] resolved for one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllReduceChoice {
    LowLatency,
    LowLatency128,
    Push,
    OneShot,
    TwoShot,
    TwoShotStores,
}

/// Whether shmem's kernels run a collective of a team of `n_pes` under
/// `implementation` (else NVSHMEM's collectives), where the kernels are
/// loaded.
pub(crate) fn kernels_take(implementation: CollImpl, n_pes: usize) -> bool {
    implementation == CollImpl::Kernels && n_pes <= abi::MAX_TEAM
}

/// Where a team's members are, for the choice between flat and node-aware
/// collectives ([`node_aware`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NodeShape {
    /// The world team: the node-aware forms' buffers are its.
    pub(crate) world: bool,
    /// The nodes the members are on.
    pub(crate) nodes: usize,
    /// Members on each node, where every node has as many; else 0.
    pub(crate) per_node: usize,
    /// Members `a·L .. a·L + L` in team order are one node's (with `L` =
    /// `per_node`, nonzero): member `a·L + i` is PE (node `a`, local rank `i`).
    pub(crate) contiguous: bool,
}

impl NodeShape {
    /// The shape of a team of `members` (world PEs in team order), with
    /// `node_of` each world PE's node.
    pub(crate) fn of(world: bool, members: &[usize], node_of: impl Fn(usize) -> usize) -> NodeShape {
        let nodes_in_order: Vec<usize> = members.iter().map(|&pe| node_of(pe)).collect();
        let mut distinct = nodes_in_order.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let counts = distinct.iter().map(|&k| nodes_in_order.iter().filter(|&&m| m == k).count());
        let per_node = match counts.clone().min() {
            Some(least) if counts.clone().all(|c| c == least) => least,
            _ => 0,
        };
        // Node by node: each block of `per_node` members is one node's, and
        // the blocks' nodes all differ (they cover the nodes, one block each).
        let contiguous =
            per_node > 0 && nodes_in_order.chunks(per_node).all(|block| block.iter().all(|&k| k == block[0])) && {
                let mut firsts: Vec<usize> = nodes_in_order.chunks(per_node).map(|b| b[0]).collect();
                firsts.sort_unstable();
                firsts.dedup();
                firsts.len() == distinct.len()
            };
        NodeShape { world, nodes: distinct.len(), per_node, contiguous }
    }
}

/// Whether a collective of a team of `shape` takes the node-aware form
/// under `asked` (see [`AcrossNodes`] for the forms and the fallbacks):
/// the world team on two nodes or more, as many members on each, node by
/// node, not `force_rma`, not [`AcrossNodes::Flat`]; [`AcrossNodes::Auto`]
/// also wants two members a node or more.
pub(crate) fn node_aware(shape: NodeShape, asked: AcrossNodes, force_rma: bool) -> bool {
    let least = match asked {
        AcrossNodes::Flat => return false,
        AcrossNodes::Auto => 2,
        AcrossNodes::NodeAware => 1,
    };
    shape.world && shape.nodes >= 2 && shape.per_node >= least && shape.contiguous && !force_rma
}

/// The share of rail `i` of `count` elements of `elem_bytes` bytes over
/// `parts` rails (or nodes): whole 16-byte vectors, split as the two-shot
/// kernels split a vector among PEs (`split` in `prims/simple.cuh`), the
/// last share ending at `count`. Shares may be empty.
pub(crate) fn rail_share(count: usize, elem_bytes: usize, i: usize, parts: usize) -> std::ops::Range<usize> {
    let per_vector = (16 / elem_bytes).max(1);
    let vectors = count.div_ceil(per_vector);
    let at = |part: usize| (vectors * part / parts * per_vector).min(count);
    at(i)..at(i + 1)
}

/// Whether the low-latency kernels take `bytes` per peer on `team`.
pub(crate) fn low_latency_takes(team: TeamShape, bytes: usize, tuning: &Tuning) -> bool {
    // The limit is within the packets' room already.
    team.world_over_nvlink() && bytes <= low_latency_max_bytes(team.n_pes, tuning)
}

/// Whether the line kernels take `bytes` per peer on `team` when asked for
/// ([`AllReduceAlgo::LowLatency128`]): the low-latency packets' room, which
/// their lines share.
pub(crate) fn lines_take(team: TeamShape, bytes: usize) -> bool {
    team.lines_serve() && bytes <= low_latency_room_bytes(team.n_pes)
}

/// Whether the push kernels take `bytes` per peer on `team`.
pub(crate) fn push_takes(team: TeamShape, bytes: usize) -> bool {
    team.world_over_nvlink() && team.n_pes <= abi::PUSH_MAX_TEAM && bytes <= abi::PUSH_MAX_BYTES
}

/// The protocol of an all-gather, broadcast (pushed by the root),
/// all-to-all or reduce-scatter of `bytes` per peer on `team`: the
/// low-latency kernels where they take it (in lines from
/// [`low_latency_lines_min_bytes`]), else the push kernels where they take
/// it, else loads and stores.
pub(crate) fn protocol(team: TeamShape, bytes: usize, tuning: &Tuning) -> Protocol {
    if low_latency_takes(team, bytes, tuning) {
        if bytes >= low_latency_lines_min_bytes(tuning) && lines_take(team, bytes) {
            Protocol::LowLatency128
        } else {
            Protocol::LowLatency
        }
    } else if push_takes(team, bytes) {
        Protocol::Push
    } else {
        Protocol::Sm
    }
}

/// Whether an all-to-all of `bytes` per member may be in place on the
/// device: the low-latency and push kernels read every block of a chunk
/// before writing it; the others go through a copy of the source.
pub(crate) fn all_to_all_in_place(team: TeamShape, bytes: usize, tuning: &Tuning) -> bool {
    protocol(team, bytes, tuning) != Protocol::Sm
}

/// The all-reduce of `bytes` per PE on `team`: `asked` where it applies,
/// else the automatic choice. In a world of 4 to 8 PEs over NVLink,
/// lines from [`WIDE_LINES_MIN_BYTES`] and two-shot from
/// [`WIDE_TWO_SHOT_MIN_BYTES`]. Else low-latency (in lines from
/// [`low_latency_lines_min_bytes`]) where it takes the size, else push,
/// else one-shot out of place up to [`ONE_SHOT_MAX_BYTES`], else two-shot
/// (by stores for a pair over NVLink, out of place, from
/// [`TWO_SHOT_STORES_MIN_BYTES`]).
pub(crate) fn all_reduce_choice(
    team: TeamShape,
    asked: AllReduceAlgo,
    bytes: usize,
    in_place: bool,
    tuning: &Tuning,
) -> AllReduceChoice {
    let ll = low_latency_takes(team, bytes, tuning);
    let push = push_takes(team, bytes);
    let one_shot = !in_place;
    // The two-shot by stores: a pair over NVLink, out of place.
    let stores = team.n_pes == 2 && team.nvlink && !in_place;
    // 4 to 8 PEs over NVLink, the low-latency limits untuned.
    let wide = (4..=abi::PUSH_MAX_TEAM).contains(&team.n_pes)
        && team.world_over_nvlink()
        && tuning.low_latency_lines_min_bytes.is_none()
        && tuning.low_latency_max_bytes.is_none();
    match asked {
        AllReduceAlgo::LowLatency if ll => AllReduceChoice::LowLatency,
        AllReduceAlgo::LowLatency128 if lines_take(team, bytes) => AllReduceChoice::LowLatency128,
        AllReduceAlgo::Push if push => AllReduceChoice::Push,
        AllReduceAlgo::OneShot if one_shot => AllReduceChoice::OneShot,
        AllReduceAlgo::TwoShot => AllReduceChoice::TwoShot,
        AllReduceAlgo::TwoShotStores if stores => AllReduceChoice::TwoShotStores,
        AllReduceAlgo::TwoShotStores => AllReduceChoice::TwoShot,
        _ if wide && bytes >= WIDE_TWO_SHOT_MIN_BYTES => AllReduceChoice::TwoShot,
        _ if wide && bytes >= WIDE_LINES_MIN_BYTES && lines_take(team, bytes) => AllReduceChoice::LowLatency128,
        _ if ll && bytes >= low_latency_lines_min_bytes(tuning) && lines_take(team, bytes) => {
            AllReduceChoice::LowLatency128
        }
        _ if ll => AllReduceChoice::LowLatency,
        _ if push => AllReduceChoice::Push,
        _ if one_shot && bytes <= ONE_SHOT_MAX_BYTES => AllReduceChoice::OneShot,
        _ if stores && bytes >= TWO_SHOT_STORES_MIN_BYTES => AllReduceChoice::TwoShotStores,
        _ => AllReduceChoice::TwoShot,
    }
}

/// Whether the host backend's all-reduce of `count` elements (`bytes` per
/// PE) over `n_pes` is one-shot (every PE reduces the whole vector) rather
/// than two-shot (each reduces its block, then gathers the others'): up to
/// [`ONE_SHOT_MAX_BYTES`], and whenever there are fewer elements than PEs.
pub(crate) fn host_all_reduce_one_shot(bytes: usize, count: usize, n_pes: usize) -> bool {
    bytes <= ONE_SHOT_MAX_BYTES || count < n_pes
}

/// Blocks of the push kernels under `tuning`: by default [`PUSH_BLOCKS`];
/// 1 to 128 (outside, the nearer end).
pub(crate) fn push_blocks(tuning: &Tuning) -> usize {
    tuning.push_blocks.map_or(PUSH_BLOCKS, |b| (b as usize).clamp(1, abi::MAX_BLOCKS))
}

/// What a collective of a team of one does: its result is its source as
/// it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Solo {
    /// Source and destination are the same, or empty.
    Nothing,
    /// A copy-engine copy from the source.
    CopyEngine,
    /// The kernels, as for a larger team.
    Kernel,
}

/// A team of one's collective of `bytes` of destination: nothing where the
/// source is the destination (`same`) or it is empty; a copy engine from
/// [`solo_copy_engine_min_bytes`] where the two do not overlap; else the
/// kernels.
pub(crate) fn solo(
    same: bool,
    bytes: usize,
    overlapping: bool,
    reduces: bool,
    captured: bool,
    tuning: &Tuning,
) -> Solo {
    if same || bytes == 0 {
        Solo::Nothing
    } else if !overlapping && bytes >= solo_copy_engine_min_bytes(reduces, captured, tuning) {
        Solo::CopyEngine
    } else {
        Solo::Kernel
    }
}

/// Whether an all-gather runs on copy engines: where asked
/// ([`AllGatherAlgo::CopyEngine`]) and every member has an NVLink address
/// (`nvlink`); the SM kernel is as fast or faster at every size, and than
/// pulls (`docs/tuning.md`).
pub(crate) fn all_gather_by_copy_engine(asked: AllGatherAlgo, nvlink: bool) -> bool {
    asked == AllGatherAlgo::CopyEngine && nvlink
}

/// How the kernels move a broadcast over a team whose members all reach
/// each other over NVLink (`nvlink`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BroadcastForm {
    /// The root pushes (or the protocol of its size: [`protocol`]).
    Push,
    /// Every member pulls from the root ([`broadcast_pull_min_bytes`]).
    Pull,
    /// The members relay shares of it ([`broadcast_relay_min_bytes`]; three
    /// or more).
    Relay,
}

/// The form of a broadcast of `bytes` over a team of `n_pes`: pulled from
/// [`broadcast_pull_min_bytes`], else relayed from
/// [`broadcast_relay_min_bytes`] at three or more PEs, else pushed.
pub(crate) fn broadcast_form(nvlink: bool, n_pes: usize, bytes: usize, tuning: &Tuning) -> BroadcastForm {
    if !nvlink {
        BroadcastForm::Push
    } else if bytes >= broadcast_pull_min_bytes(tuning) {
        BroadcastForm::Pull
    } else if n_pes >= 3 && bytes >= broadcast_relay_min_bytes(tuning) {
        BroadcastForm::Relay
    } else {
        BroadcastForm::Push
    }
}

/// How the kernels run one MoE all-to-all-v.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MoeForm {
    /// The line kernel ([`MoeKernels::Lines`]).
    Lines,
    /// The one kernel of [`MoeKernels::Auto`].
    OneKernel,
    /// The plan kernel, then the data kernel ([`MoeKernels::PlanThenMove`]).
    PlanThenMove,
}

/// The MoE all-to-all-v of `input_bytes` on `team`, with `experts_per_pe`
/// experts each (`with_offsets`: the combine, whose splits come with
/// offsets): the line kernel on the world team over NVLink where
/// [`MoeKernels::Lines`] is asked for, or [`MoeKernels::Auto`] and the
/// input is within [`moe_lines_max_bytes`], and it fits (at most 32
/// experts a PE, [`moe_lines_fit`], its tables within the shared memory);
/// else the one kernel over NVLink where the splits fit its packets and
/// shared memory, unless [`MoeKernels::PlanThenMove`] is asked for; else
/// the plan kernel and the data kernel. Every PE makes the same choice.
pub(crate) fn moe_form(
    team: TeamShape,
    experts_per_pe: usize,
    with_offsets: bool,
    input_bytes: usize,
    asked: MoeKernels,
    tuning: &Tuning,
) -> MoeForm {
    let (n, ne) = (team.n_pes, experts_per_pe);
    let lines = team.lines_serve()
        && ne <= abi::A2AV_LINES_MAX_EXPERTS
        && abi::a2av_lines_shared_bytes(n, ne, with_offsets) <= abi::A2AV_SHARED_MAX_BYTES
        && moe_lines_fit(n, ne, with_offsets, input_bytes)
        && match asked {
            MoeKernels::Lines => true,
            MoeKernels::Auto => moe_lines_max_bytes(tuning).is_some_and(|max| input_bytes <= max),
            MoeKernels::PlanThenMove => false,
        };
    if lines {
        return MoeForm::Lines;
    }
    let packets = n * abi::a2av_split_words(n, ne, with_offsets);
    let one_kernel = asked != MoeKernels::PlanThenMove
        && team.nvlink
        && packets <= abi::A2AV_PACKET_WORDS
        && abi::a2av_one_kernel_shared_bytes(n, ne, with_offsets) <= abi::A2AV_SHARED_MAX_BYTES;
    if one_kernel {
        MoeForm::OneKernel
    } else {
        MoeForm::PlanThenMove
    }
}

#[cfg(test)]
mod tests;
