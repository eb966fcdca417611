//! Launchers of the collective kernels (`coll/move.cu`, `coll/reduce.cuh`, and the
//! node-aware `coll/move_nodes.cu`, `coll/reduce_nodes.cuh`): the algorithm and
//! protocol come from [`crate::algo`]; here they become a kernel
//! ([`KernelId`]) and its grid.

use super::abi::{RailOp, TeamSync, AGREE_DATA_BYTES, AGREE_WORDS, LINE_DATA_BYTES, RAIL_CHANNELS, THREADS};
use super::kernel_id::{KernelId, Movement, Plain, ReduceKernel};
use super::kernels::Kernels;
use super::module::Grid;
use super::{CUstream, CudaCall, GpuWorld};
use crate::algo::{
    all_reduce_choice, low_latency_blocks, low_latency_threads, protocol, push_blocks, reduce_line_data_bytes,
    AllReduceAlgo, AllReduceChoice, BroadcastForm, Protocol, ReduceOrder, TeamShape, Tuning,
};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use std::ffi::c_void;

/// What a collective's choice of kernel reads besides its team's view:
/// whether the team is the world's (whose buffers the low-latency and push
/// kernels use), and the tuning. The same on every PE (the settings must
/// be).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Protocols {
    world: bool,
    lines: bool,
    tuning: Tuning,
}

impl Protocols {
    /// `lines`: [`Kernels::lines`].
    pub(crate) fn new(world: bool, lines: bool, tuning: &Tuning) -> Protocols {
        Protocols { world, lines, tuning: *tuning }
    }

    /// What the choice reads of team `t`.
    pub(crate) fn shape(&self, t: &TeamSync) -> TeamShape {
        TeamShape { world: self.world, n_pes: t.n_pes(), nvlink: t.nvlink(), lines: self.lines }
    }

    /// The low-latency kernels' grid for `bytes` per peer, in lines of
    /// `line_bytes` data bytes or in packets.
    fn ll_grid(&self, bytes: usize, line_bytes: Option<usize>) -> Grid {
        let blocks = low_latency_blocks(bytes, &self.tuning);
        Grid { blocks: blocks as usize, threads: low_latency_threads(bytes, blocks, line_bytes, &self.tuning) }
    }

    /// The grid of a kernel of `protocol` moving `bytes` per peer (lines
    /// of `line_bytes` data bytes): SM kernels by the 16-byte `units` they
    /// move.
    fn grid(&self, t: &TeamSync, protocol: Protocol, bytes: usize, line_bytes: usize, units: usize) -> Grid {
        match protocol {
            Protocol::LowLatency => self.ll_grid(bytes, None),
            Protocol::LowLatency128 => self.ll_grid(bytes, Some(line_bytes)),
            Protocol::Push => Grid::of(push_blocks(&self.tuning)),
            Protocol::Sm => Grid::of(Kernels::blocks(t, units)),
        }
    }
}

impl Kernels {
    /// All-reduce of `count` elements at heap offsets `dst`/`src` (the same
    /// on every member; equal for in place) with the algorithm `algo` asks
    /// for where it applies, else the automatic choice
    /// ([`all_reduce_choice`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_reduce(
        &self,
        t: TeamSync,
        p: Protocols,
        algo: AllReduceAlgo,
        dtype: DType,
        op: ReduceOp,
        dst: usize,
        src: usize,
        count: usize,
        s: CUstream,
    ) -> Result<()> {
        let bytes = count * dtype.size();
        let units = bytes.div_ceil(16);
        let line_bytes = reduce_line_data_bytes(dtype.size());
        let (kernel, grid) = match all_reduce_choice(p.shape(&t), algo, bytes, dst == src, &p.tuning) {
            // An eager call of a few bytes over NVLink: its data rides its
            // agreement, one round trip for both (the choice reads the
            // size, settings and topology, the same on every member).
            AllReduceChoice::LowLatency if t.agreement() != 0 && t.nvlink() && bytes <= AGREE_DATA_BYTES => {
                let packets = t.n_pes() * (AGREE_WORDS + bytes.div_ceil(8));
                let threads = (packets.next_multiple_of(32) as u32).min(THREADS);
                (ReduceKernel::AllReduceAgreed, Grid { blocks: 1, threads })
            }
            AllReduceChoice::LowLatency => (ReduceKernel::AllReduceLowLatency, p.ll_grid(bytes, None)),
            AllReduceChoice::LowLatency128 => {
                (ReduceKernel::AllReduceLowLatency128, p.ll_grid(bytes, Some(line_bytes)))
            }
            AllReduceChoice::Push => (ReduceKernel::AllReducePush, Grid::of(push_blocks(&p.tuning))),
            AllReduceChoice::OneShot => (ReduceKernel::AllReduceOneShot, Grid::of(Self::blocks(&t, units))),
            AllReduceChoice::TwoShot => {
                (ReduceKernel::AllReduceTwoShot, Grid::of(Self::blocks(&t, units.div_ceil(t.n_pes()))))
            }
            AllReduceChoice::TwoShotStores => {
                (ReduceKernel::AllReduceTwoShotStores, Grid::of(Self::blocks(&t, units.div_ceil(2))))
            }
        };
        self.reduce(t, kernel, grid, dtype, op, dst, src, count, s)
    }

    /// Reduce-scatter: `count` elements into each member's `dst` from block
    /// `rank` of every member's `src`, by the [`protocol`] of its size.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce_scatter(
        &self,
        t: TeamSync,
        p: Protocols,
        dtype: DType,
        op: ReduceOp,
        dst: usize,
        src: usize,
        count: usize,
        s: CUstream,
    ) -> Result<()> {
        let bytes = count * dtype.size();
        let how = protocol(p.shape(&t), bytes, &p.tuning);
        let kernel = match how {
            Protocol::Sm => ReduceKernel::ReduceScatter,
            Protocol::LowLatency => ReduceKernel::ReduceScatterLowLatency,
            Protocol::LowLatency128 => ReduceKernel::ReduceScatterLowLatency128,
            Protocol::Push => ReduceKernel::ReduceScatterPush,
        };
        let grid = p.grid(&t, how, bytes, reduce_line_data_bytes(dtype.size()), bytes.div_ceil(16));
        self.reduce(t, kernel, grid, dtype, op, dst, src, count, s)
    }

    /// Launches reduction `kernel` for `dtype` and `op` (the team's own
    /// build of a sum over 2, 4 or 8 PEs).
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        t: TeamSync,
        kernel: ReduceKernel,
        grid: Grid,
        dtype: DType,
        op: ReduceOp,
        dst: usize,
        src: usize,
        count: usize,
        s: CUstream,
    ) -> Result<()> {
        let id = KernelId::reduce(kernel, dtype, op, t.n_pes());
        // SAFETY: (TeamSync, dst, src, count) as every reduction kernel
        // declares; regions checked and agreed by the caller.
        unsafe { self.launch4(id, grid, t, dst as u64, src as u64, count as u64, s) }
    }

    /// All-gather by an SM kernel: block `rank` of every member's `dst`
    /// from this PE's `src` (or its own block of `dst` when `in_place`),
    /// `bytes` per member.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_gather(
        &self,
        t: TeamSync,
        p: Protocols,
        dst: usize,
        src: usize,
        bytes: usize,
        in_place: bool,
        s: CUstream,
    ) -> Result<()> {
        self.launch_move(Movement::AllGather, t, p, dst, src, bytes, in_place as i32, s)
    }

    /// All-gather by copy engines: a barrier kernel (every destination is
    /// free), one `cuMemcpyAsync` per peer through its NVLink address, a
    /// barrier kernel (every peer's copies into this PE are done). Needs
    /// every member over NVLink.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_gather_ce(
        &self,
        g: &GpuWorld,
        t: TeamSync,
        members: &[usize],
        dst: usize,
        src: usize,
        bytes: usize,
        in_place: bool,
        s: CUstream,
    ) -> Result<()> {
        let rank = t.rank as usize;
        let mine = dst + rank * bytes;
        let from = g.addr(if in_place { mine } else { src });
        self.barrier(t, s)?;
        for i in 1..members.len() {
            let pe = members[(rank + i) % members.len()];
            let base = g.peer_base[pe].ok_or_else(|| Error::Invalid(format!("PE {pe} has no NVLink address")))?;
            // SAFETY: `mine` is a checked region of every member's heap,
            // reached through the peer's mapping of it.
            unsafe { cudarc::driver::result::memcpy_dtod_async(base + mine as u64, from, bytes, s) }
                .cuda("cuMemcpyDtoDAsync")?;
        }
        if !in_place {
            // SAFETY: checked regions of this PE's heap.
            unsafe { cudarc::driver::result::memcpy_dtod_async(g.addr(mine), from, bytes, s) }
                .cuda("cuMemcpyDtoDAsync")?;
        }
        self.barrier(t, s)
    }

    /// Broadcast of `bytes` from member `root`'s `src` into every member's
    /// `dst`, in `form` ([`broadcast_form`](crate::algo::broadcast_form)):
    /// pushed by the root, by the [`protocol`] of `bytes`; pulled from the
    /// root by every member (`shmem_broadcast_pull`; the root waits until
    /// all have read); or relayed (`shmem_broadcast_relay`: each of n−1
    /// members reads its share of the root's source and stores it into
    /// every non-root; three or more members). Pulls and relays need every
    /// member's NVLink address (`t.rma == 0`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn broadcast(
        &self,
        form: BroadcastForm,
        t: TeamSync,
        p: Protocols,
        dst: usize,
        src: usize,
        bytes: usize,
        root: usize,
        s: CUstream,
    ) -> Result<()> {
        let id = match form {
            BroadcastForm::Push => return self.launch_move(Movement::Broadcast, t, p, dst, src, bytes, root as i32, s),
            BroadcastForm::Pull => KernelId::Plain(Plain::BroadcastPull),
            BroadcastForm::Relay => KernelId::Plain(Plain::BroadcastRelay),
        };
        debug_assert!(t.nvlink(), "pulls and relays need every member's NVLink address");
        debug_assert!(form != BroadcastForm::Relay || t.n >= 3, "relays need three or more members");
        let grid = Grid::of(Self::blocks(&t, bytes.div_ceil(16)));
        // SAFETY: (TeamSync, dst, src, bytes, root) as the kernel declares;
        // regions checked and agreed by the caller.
        unsafe { self.launch5(id, grid, t, dst, src, bytes, root as i32, s) }
    }

    /// Launches a (TeamSync, dst, src, bytes, int) kernel of `coll/move.cu` by
    /// the [`protocol`] of `bytes`.
    #[allow(clippy::too_many_arguments)]
    fn launch_move(
        &self,
        kernel: Movement,
        t: TeamSync,
        p: Protocols,
        dst: usize,
        src: usize,
        bytes: usize,
        x: i32,
        s: CUstream,
    ) -> Result<()> {
        let how = protocol(p.shape(&t), bytes, &p.tuning);
        let grid = p.grid(&t, how, bytes, LINE_DATA_BYTES, bytes.div_ceil(16));
        // SAFETY: (TeamSync, u64, u64, u64, int) as these kernels declare;
        // regions checked and agreed by the caller.
        unsafe { self.launch5(KernelId::Move(kernel, how), grid, t, dst, src, bytes, x, s) }
    }

    /// All-to-all of `bytes` per member; `src` and `dst` apart unless
    /// [`crate::algo::all_to_all_in_place`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_to_all(
        &self,
        t: TeamSync,
        p: Protocols,
        dst: usize,
        src: usize,
        bytes: usize,
        s: CUstream,
    ) -> Result<()> {
        let how = protocol(p.shape(&t), bytes, &p.tuning);
        let grid = p.grid(&t, how, bytes, LINE_DATA_BYTES, bytes.div_ceil(16));
        let id = KernelId::Move(Movement::AllToAll, how);
        // SAFETY: (TeamSync, dst, src, bytes) as the kernel declares.
        unsafe { self.launch4(id, grid, t, dst as u64, src as u64, bytes as u64, s) }
    }

    /// Launches a (TeamSync, u64, u64, u64) kernel.
    ///
    /// # Safety
    /// `dst` and `src` are heap offsets of checked regions; the launch reads
    /// and writes them on every member as the kernel describes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch4(
        &self,
        id: KernelId,
        grid: Grid,
        t: TeamSync,
        dst: u64,
        src: u64,
        x: u64,
        s: CUstream,
    ) -> Result<()> {
        let (mut t, mut dst, mut src, mut x) = (t, dst, src, x);
        let mut params: [*mut c_void; 4] =
            [(&raw mut t).cast(), (&raw mut dst).cast(), (&raw mut src).cast(), (&raw mut x).cast()];
        // SAFETY: (TeamSync, u64, u64, u64) as the kernel declares; the caller's contract.
        unsafe { self.module.launch(id, grid, 0, s, &mut params) }
    }

    /// Launches a (TeamSync, dst, src, bytes, int) kernel of `coll/move.cu`.
    ///
    /// # Safety
    /// The kernel declares these parameters; `dst` and `src` are heap
    /// offsets of checked regions, read and written as the kernel describes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch5(
        &self,
        id: KernelId,
        grid: Grid,
        t: TeamSync,
        dst: usize,
        src: usize,
        bytes: usize,
        x: i32,
        s: CUstream,
    ) -> Result<()> {
        let (mut t, mut dst, mut src, mut bytes, mut x) = (t, dst as u64, src as u64, bytes as u64, x);
        let mut params: [*mut c_void; 5] = [
            (&raw mut t).cast(),
            (&raw mut dst).cast(),
            (&raw mut src).cast(),
            (&raw mut bytes).cast(),
            (&raw mut x).cast(),
        ];
        // SAFETY: the caller's contract.
        unsafe { self.module.launch(id, grid, 0, s, &mut params) }
    }
}

/// The node-aware collectives of the world team laid out node by node
/// (`coll/move_nodes.cu`, `coll/reduce_nodes.cuh`), over the rail pipes: `2C` blocks,
/// `C` of each role, every one of them resident at once on every PE's GPU
/// (blocks of one PE wait on blocks of another, and those on the first's).
impl Kernels {
    /// `C`, the pipe channels of each role: up to half the pipes' channels,
    /// within half the blocks resident on every PE's GPU (the same on every
    /// PE); `None` where the world does not span nodes (no pipes) or no two
    /// blocks are resident at once.
    pub(crate) fn rail_channels(&self) -> Option<usize> {
        self.layout.rail()?;
        let c = (RAIL_CHANNELS / 2).min(self.resident_blocks / 2);
        (c >= 1).then_some(c)
    }

    /// Launches node-aware `id` with `op` (its pipes and channels filled in).
    fn launch_nodes(&self, id: KernelId, t: TeamSync, op: RailOp, s: CUstream) -> Result<()> {
        let (Some(rail), Some(channels)) = (self.layout.rail(), self.rail_channels()) else {
            return Err(Error::Invalid("the node-aware collectives need a world spanning nodes".into()));
        };
        let op = RailOp { rail: rail as u64, channels: channels as i32, _pad: 0, ..op };
        // SAFETY: (TeamSync, RailOp) as every node-aware kernel declares;
        // the regions are checked and agreed by the caller, and the grid of
        // 2C blocks is within the blocks resident on every PE's GPU.
        unsafe { self.launch_with(id, 2 * channels, 0, t, op, s) }
    }

    /// All-gather across nodes: block `rank` of every member's `dst` from
    /// this PE's `src` (its own block of `dst` in place), `bytes` per
    /// member; `per_node` members on each node.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_gather_nodes(
        &self,
        t: TeamSync,
        per_node: usize,
        dst: usize,
        src: usize,
        bytes: usize,
        in_place: bool,
        s: CUstream,
    ) -> Result<()> {
        let src = if in_place { dst + t.rank as usize * bytes } else { src };
        let op = rail_op(dst, src, bytes, per_node, 0);
        self.launch_nodes(KernelId::Plain(Plain::AllGatherNodes), t, op, s)
    }

    /// Broadcast across nodes of `bytes` from member `root`'s `src` into
    /// every member's `dst`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn broadcast_nodes(
        &self,
        t: TeamSync,
        per_node: usize,
        dst: usize,
        src: usize,
        bytes: usize,
        root: usize,
        s: CUstream,
    ) -> Result<()> {
        self.launch_nodes(KernelId::Plain(Plain::BroadcastNodes), t, rail_op(dst, src, bytes, per_node, root), s)
    }

    /// All-to-all across nodes of `bytes` per member, `src` and `dst`
    /// apart: rows for another node through the rail pipes, one a node.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_to_all_nodes(
        &self,
        t: TeamSync,
        per_node: usize,
        dst: usize,
        src: usize,
        bytes: usize,
        s: CUstream,
    ) -> Result<()> {
        self.launch_nodes(KernelId::Plain(Plain::AllToAllNodes), t, rail_op(dst, src, bytes, per_node, 0), s)
    }

    /// All-reduce across nodes in `order`, `count` elements (`dst` equal
    /// to `src` for in place).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_reduce_nodes(
        &self,
        t: TeamSync,
        per_node: usize,
        order: ReduceOrder,
        dtype: DType,
        op: ReduceOp,
        dst: usize,
        src: usize,
        count: usize,
        s: CUstream,
    ) -> Result<()> {
        let kernel = match order {
            ReduceOrder::PeOrder => ReduceKernel::AllReduceNodes,
            ReduceOrder::NodeGrouped => ReduceKernel::AllReduceGrouped,
        };
        let id = KernelId::reduce(kernel, dtype, op, t.n_pes());
        self.launch_nodes(id, t, rail_op(dst, src, count, per_node, 0), s)
    }

    /// Reduce-scatter across nodes in `order`: `count` elements into this
    /// PE's `dst` (which in place is its block of `src`, at an offset that
    /// differs by PE) from block `rank` of every member's `src`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce_scatter_nodes(
        &self,
        t: TeamSync,
        per_node: usize,
        order: ReduceOrder,
        dtype: DType,
        op: ReduceOp,
        dst: usize,
        src: usize,
        count: usize,
        s: CUstream,
    ) -> Result<()> {
        let kernel = match order {
            ReduceOrder::PeOrder => ReduceKernel::ReduceScatterNodes,
            ReduceOrder::NodeGrouped => ReduceKernel::ReduceScatterGrouped,
        };
        let id = KernelId::reduce(kernel, dtype, op, t.n_pes());
        self.launch_nodes(id, t, rail_op(dst, src, count, per_node, 0), s)
    }
}

/// A [`RailOp`] before the launcher fills in the pipes.
fn rail_op(dst: usize, src: usize, count: usize, per_node: usize, root: usize) -> RailOp {
    RailOp {
        dst: dst as u64,
        src: src as u64,
        count: count as u64,
        rail: 0,
        per_node: per_node as i32,
        channels: 0,
        root: root as i32,
        _pad: 0,
    }
}
