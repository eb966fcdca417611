//! shmem's own device-initiated kernels, as the rest of the crate holds
//! them: [`Kernels`] is the loaded cubin with the kernels' state (its
//! layout after the heap, each team's view, the MoE error record). Their
//! launchers live beside it, one file per kernel family: `collectives.rs`
//! (`coll/move.cu`, `coll/reduce.cuh`), `a2av.rs` (`moe_*.cu`), `moe_layer.rs`
//! (`moe/layer.cu`) and `overlap.rs` (`coll/overlap.cu`).

use super::abi::{MAX_BLOCKS, RMA_BLOCKS, THREADS};
use super::kernel_id::{KernelId, Plain};
use super::module::{Grid, Module};
use super::record::{AgreeRecord, HostRecord, PeerDied};
use super::teams::View;
use super::{CUstream, CudaCall, GpuWorld};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

pub(crate) use super::abi::{decode_words, MoeLayer, TeamSync, MAX_TEAM, ROUTE_THREADS};
pub(crate) use super::layout::Layout;
pub(crate) use super::module::not_built;
pub(crate) use super::moe_layer::{combine_lines_fit, decode_fits, dispatch_lines_fit, rank_scratch_len, source_units};
pub(crate) use super::record::{AgreementFailure, DeviceCheckFailure};

/// The loaded kernels and their state.
pub(crate) struct Kernels {
    pub(super) module: Module,
    pub(super) layout: Layout,
    /// Views by (team slot, RMA forced).
    pub(super) views: Mutex<HashMap<(usize, bool), View>>,
    /// Where the MoE kernels record a failed check.
    pub(super) a2av_error: HostRecord,
    /// Where the collectives record a failed agreement on an eager call.
    pub(super) agree_error: AgreeRecord,
    /// The word that makes the kernels' waits give up on a dead peer.
    peer_died: PeerDied,
    /// Blocks of a kernel (of 512 threads, one an SM) resident at once on
    /// every PE's GPU, agreed when the kernels are loaded
    /// ([`Kernels::set_resident_blocks`]): the MoE line kernel's grid
    /// stays within them (`Kernels::all_to_all_v`). Before, this PE's SMs.
    pub(super) resident_blocks: usize,
    /// Whether some PE of the world shares its GPU with another, agreed
    /// when the kernels are loaded ([`Kernels::set_shared_gpu`]): then no
    /// line protocol runs ([`Kernels::lines`]) and the decode form's
    /// combine keeps to the dispatch's grid.
    pub(super) shared_gpu: bool,
}

impl Kernels {
    /// Loads the cubin, registers it with NVSHMEM, checks that it sees this
    /// PE, and makes the world's and node's views. The state (`layout`) is
    /// zeroed on every PE.
    pub(crate) fn load(g: &GpuWorld, me: usize, n: usize, layout: Layout, node: &[usize]) -> Result<Kernels> {
        let module = Module::load(g)?;
        let a2av_error = HostRecord::new()?;
        let agree_error = AgreeRecord::new()?;
        let peer_died = PeerDied::new()?;
        module.set_global_u64("shmem_peer_died", peer_died.device())?;
        let sms = g
            .cuda
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .cuda("cuDeviceGetAttribute")?;
        let k = Kernels {
            module,
            layout,
            views: Mutex::new(HashMap::new()),
            a2av_error,
            agree_error,
            peer_died,
            resident_blocks: sms.max(1) as usize,
            shared_gpu: false,
        };
        k.selfcheck(g, me, n)?;
        let world: Vec<usize> = (0..n).collect();
        for force in [false, true] {
            k.add_view(g, 0, &world, me, force)?;
            k.add_view(g, 1, node, me, force)?;
        }
        Ok(k)
    }

    /// Makes every wait of the kernels, running or to come, give up (trap):
    /// the host has seen a PE of the job die, so the peers they wait for
    /// may never come. See `Context`'s liveness watcher.
    pub(crate) fn peer_died(&self) {
        self.peer_died.set();
    }

    /// The blocks resident at once: this PE's GPU's SMs (under CUDA MPS,
    /// its share) until [`Kernels::set_resident_blocks`].
    pub(crate) fn resident_blocks(&self) -> usize {
        self.resident_blocks
    }

    /// The blocks resident at once on every PE's GPU, agreed by every PE:
    /// the fewest of each PE's SMs, less an eighth where PEs share a GPU
    /// (under MPS their grids must fit it together: `docs/tuning.md`).
    pub(crate) fn set_resident_blocks(&mut self, blocks: usize) {
        self.resident_blocks = blocks.max(1);
    }

    /// Whether the line protocols may run
    /// ([`TeamShape::lines`](crate::algo::TeamShape::lines)): no PE of the
    /// world shares its GPU.
    pub(crate) fn lines(&self) -> bool {
        !self.shared_gpu
    }

    /// Some PE of the world shares its GPU with another (agreed by every
    /// PE): no line protocol runs, the low-latency kernels keep to packets.
    pub(crate) fn set_shared_gpu(&mut self) {
        self.shared_gpu = true;
    }

    /// Runs `shmem_selfcheck`: the kernels' NVSHMEM state must name this
    /// PE and the world's size.
    fn selfcheck(&self, g: &GpuWorld, me: usize, n: usize) -> Result<()> {
        let s = g.own_stream();
        let mut out = s.alloc_zeros::<i32>(2).cuda("CudaStream::alloc_zeros")?;
        let (ptr, sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut out, s);
        let mut p = ptr;
        let grid = Grid { blocks: 1, threads: 1 };
        // SAFETY: one int* argument, pointing at 2 ints.
        unsafe {
            self.module.launch(KernelId::Plain(Plain::SelfCheck), grid, 0, s.cu_stream(), &mut [(&raw mut p).cast()])?
        };
        drop(sync);
        let got = s.clone_dtoh(&out).cuda("CudaStream::clone_dtoh")?;
        if got != [me as i32, n as i32] {
            return Err(Error::BackendUnavailable(format!(
                "the kernels' NVSHMEM state says PE {} of {}, expected {me} of {n}",
                got[0], got[1]
            )));
        }
        Ok(())
    }

    /// The most blocks of a data kernel over `t`: fewer where peers are
    /// reached through RMA.
    pub(super) fn most_blocks(t: &TeamSync) -> usize {
        if t.nvlink() {
            MAX_BLOCKS
        } else {
            RMA_BLOCKS
        }
    }

    /// Blocks for `units` of 16 bytes spread over threads (the same on every PE).
    pub(super) fn blocks(t: &TeamSync, units: usize) -> usize {
        units.div_ceil(THREADS as usize).clamp(1, Self::most_blocks(t))
    }

    /// Launches a `(TeamSync, A)` kernel of [`THREADS`] threads a block
    /// with `shared` bytes of dynamic shared memory.
    ///
    /// # Safety
    /// `A` is the `repr(C)` struct the kernel declares as its second
    /// parameter; the launch's reads and writes are the caller's to allow.
    pub(super) unsafe fn launch_with<A: Copy>(
        &self,
        id: KernelId,
        blocks: usize,
        shared: u32,
        t: TeamSync,
        arg: A,
        s: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_in(id, Grid::of(blocks), shared, t, arg, s) }
    }

    /// [`Kernels::launch_with`] on blocks of `grid.threads` (at most the
    /// kernels' `kBlockThreads`).
    ///
    /// # Safety
    /// As [`Kernels::launch_with`].
    pub(super) unsafe fn launch_in<A: Copy>(
        &self,
        id: KernelId,
        grid: Grid,
        shared: u32,
        t: TeamSync,
        arg: A,
        s: CUstream,
    ) -> Result<()> {
        let (mut t, mut arg) = (t, arg);
        let mut params: [*mut c_void; 2] = [(&raw mut t).cast(), (&raw mut arg).cast()];
        // SAFETY: the caller's contract.
        unsafe { self.module.launch(id, grid, shared, s, &mut params) }
    }

    /// A barrier of the team on the stream.
    pub(crate) fn barrier(&self, t: TeamSync, s: CUstream) -> Result<()> {
        let mut t = t;
        let grid = Grid { blocks: 1, threads: 32 };
        // SAFETY: (TeamSync) as the kernel declares.
        unsafe { self.module.launch(KernelId::Plain(Plain::Barrier), grid, 0, s, &mut [(&raw mut t).cast()]) }
    }

    /// The agreement of an eager call alone (`shmem_agree`, one block), for
    /// a PE whose own arguments failed its checks: `t` carries its row,
    /// error code included, so that every member's kernel of the call
    /// skips it.
    pub(crate) fn agree(&self, t: TeamSync, s: CUstream) -> Result<()> {
        let mut t = t;
        let grid = Grid { blocks: 1, threads: 256 };
        // SAFETY: (TeamSync) as the kernel declares; it writes only the
        // agreement's state and record.
        unsafe { self.module.launch(KernelId::Plain(Plain::Agree), grid, 0, s, &mut [(&raw mut t).cast()]) }
    }

    /// What the MoE kernels' checks found since the last look (cleared).
    pub(crate) fn take_a2av_error(&self) -> Option<DeviceCheckFailure> {
        self.a2av_error.take()
    }

    /// The first failed agreement on an eager collective since the last
    /// look (cleared).
    pub(crate) fn take_agreement_failure(&self) -> Option<AgreementFailure> {
        self.agree_error.take()
    }

    /// Whether the agreement of the call `t` was launched with failed, once
    /// its kernel has run (after a synchronisation): the latest failure
    /// recorded is its own.
    pub(crate) fn agreement_failed(&self, t: &TeamSync) -> bool {
        t.agree != 0 && self.agree_error.latest_is(t.sync_offset, t.agree)
    }
}

/// Host-initiated atomics on peers without an NVLink address.
impl Kernels {
    /// Launches `shmem_amo`: atomic `op` (numbered as `gpu/amo.rs` numbers
    /// them) with operands `a`, `b` on PE `pe`'s `bytes`-byte element at
    /// symmetric address `sym`; the old value to device word `old`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn amo(
        &self,
        sym: u64,
        op: i32,
        a: u64,
        b: u64,
        bytes: usize,
        pe: usize,
        old: u64,
        s: CUstream,
    ) -> Result<()> {
        let (mut sym, mut op, mut a, mut b, mut old) = (sym, op, a, b, old);
        let (mut bytes, mut pe) = (bytes as i32, pe as i32);
        let mut params: [*mut c_void; 7] = [
            (&raw mut sym).cast(),
            (&raw mut op).cast(),
            (&raw mut a).cast(),
            (&raw mut b).cast(),
            (&raw mut bytes).cast(),
            (&raw mut pe).cast(),
            (&raw mut old).cast(),
        ];
        // One thread: one atomic.
        let grid = Grid { blocks: 1, threads: 1 };
        // SAFETY: the parameters as the kernel declares them; `sym` is an
        // element of the heap and `old` a device word, both checked by the
        // caller.
        unsafe { self.module.launch(KernelId::Plain(Plain::Amo), grid, 0, s, &mut params) }
    }
}
