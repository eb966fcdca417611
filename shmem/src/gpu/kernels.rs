//! shmem's own device-initiated kernels (`../kernels/*.cu`), built by
//! `build.rs` into one cubin embedded here, loaded with `cuModuleLoadData`
//! and registered with `nvshmemx_cumodule_init`.

use super::{check, CUstream, CudaCall, GpuWorld, Nv};
use crate::algo::{
    low_latency_buffer_bytes, low_latency_room_bytes, moe_lines_fit, moe_lines_max_bytes, AllReduceAlgo, Collectives,
    MoeKernels, Tuning, LINE_DATA_BYTES, LINE_DATA_BYTES_WIDE,
};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUfunction, CUmodule};
use cudarc::driver::CudaSlice;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::Mutex;

#[cfg(shmem_kernels)]
const CUBIN: Option<&[u8]> = Some(include_bytes!(env!("SHMEM_KERNELS_CUBIN")));
#[cfg(not(shmem_kernels))]
const CUBIN: Option<&[u8]> = None;
#[cfg(shmem_kernels)]
const BUILT_WITH: &str = env!("SHMEM_KERNELS_NVSHMEM_VERSION");
#[cfg(not(shmem_kernels))]
const BUILT_WITH: &str = "";

/// Blocks a collective kernel uses at most: one channel of each signal
/// array each (`kMaxBlocks` in `common.cuh`).
const MAX_BLOCKS: usize = 128;
/// Most blocks when some peer is reached through RMA, and each one's
/// staging per peer (`kRmaBlocks`, `kRmaChunk`).
const RMA_BLOCKS: usize = 32;
const RMA_CHUNK: usize = 8192;
/// Largest team the kernels take (`kMaxTeam`); larger ones use NVSHMEM's collectives.
pub(crate) const MAX_TEAM: usize = 64;
/// Team slots with synchronisation state (as many as the host's team slots).
const TEAM_SLOTS: usize = 64;
/// Threads of a block of the collective kernels (but the low-latency
/// ones: [`crate::algo::low_latency_threads`]).
const THREADS: u32 = 512;
/// Blocks of the push kernels unless tuned.
const PUSH_BLOCKS: usize = 64;
/// The push kernels' largest size and largest world (`kPushMaxBytes`,
/// `kPushMaxTeam` in `common.cuh`).
const PUSH_MAX_BYTES: usize = crate::algo::PUSH_MAX_BYTES;
const PUSH_MAX_TEAM: usize = 8;
/// Up to this many bytes per PE the automatic all-reduce is one-shot (out
/// of place), above it two-shot.
const ONE_SHOT_MAX_BYTES: usize = 256 << 10;
/// From this many bytes per PE the automatic two-shot all-reduce of a pair
/// over NVLink, out of place, moves both halves by stores
/// (`AllReduceAlgo::TwoShotStores`). On 2×H100 (session 17, run 3) it took
/// 57.0 µs at 16 MiB against the pulling two-shot's 59.6 and 745.3 at 256
/// MiB against 795.8; at 2–8 MiB the pulls were 0.2–1.0 µs faster.
const TWO_SHOT_STORES_MIN_BYTES: usize = 16 << 20;

/// 64-bit words of each PE's MoE all-to-all-v staging: the verdict and
/// active blocks, every PE's splits (and offsets), the plan kernel's work
/// arrays, and the send plan (4 words per chunk).
const A2AV_TABLE_WORDS: usize = 1 << 17;
/// Split words (`n × n × experts`, twice that for the combine) that the
/// one-kernel MoE all-to-all-v takes at most (`kA2avPacketWords`).
const A2AV_PACKET_WORDS: usize = 1024;
/// Most dynamic shared memory of a MoE kernel: the default limit, less
/// what the kernels declare statically.
const A2AV_SHARED_MAX_BYTES: usize = 46 << 10;
/// Kernels (by name's start) launched by programmatic dependent launch
/// (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`): their launch
/// overlaps the end of the kernel before them on the stream, which each
/// waits for as its first step (`follow_stream` in common.cuh); measured
/// on H200, the gap between two MoE kernels fell from 2.0 to 0.8 µs.
/// Every kernel named here must begin with that wait.
const FOLLOWS_STREAM: [&str; 7] = [
    "shmem_allreduce_",
    "shmem_reducescatter",
    "shmem_allgather",
    "shmem_broadcast",
    "shmem_alltoall",
    "shmem_barrier",
    "shmem_a2av_",
];
/// Input bytes per block of the MoE all-to-all-v's data kernel's grid
/// unless tuned (the kernels keep as many working as the busiest PE's
/// bytes need: `a2av_active` in `moe.cu`).
const A2AV_BYTES_PER_BLOCK: usize = 32 << 10;
/// Input bytes per block of the MoE line kernel's grid unless tuned: one
/// pass of its 16 warps, 4 lines of 112 data bytes each (`MoeLines` in
/// `moe.cu`), so that a warp's lines leave in one pass where the grid
/// allows. Against 32 KiB a block on one H100 (docs/perf.md, session 15,
/// tokens of 7168 bf16): at 1 PE 5–10 % faster at 1 and 32 tokens (but
/// the combine of 1 token 5 % slower), and at 128 on 128 blocks 3.6–6.8 %
/// faster than on 116 (which were within 3 % of 32 KiB); at 2 PEs sharing
/// the GPU 13–22 % faster at 1 to 32 tokens, within 1.5 % at 128.
const A2AV_LINES_BYTES_PER_BLOCK: usize = 16 * 4 * LINE_DATA_BYTES_WIDE;
/// Most experts per PE of the MoE line kernel: a warp works out a
/// destination's chunks a lane each (`A2avLines::warp_chunks` in `moe.cu`).
const A2AV_LINES_MAX_EXPERTS: usize = 32;
/// The one-kernel and line forms of the MoE all-to-all-v, a kernel for
/// each kind (`A2av::kind`: 1D, 2D, 2D with offsets), so that none of
/// their steps branches on it.
const A2AV_FUSED: [&str; 3] = ["shmem_a2av_fused_v", "shmem_a2av_fused_2d", "shmem_a2av_fused_2d_offset"];
const A2AV_LINES: [&str; 3] = ["shmem_a2av_lines_v", "shmem_a2av_lines_2d", "shmem_a2av_lines_2d_offset"];

/// Why the kernels are missing from this build, and how to build them.
pub(crate) fn not_built() -> Error {
    Error::BackendUnavailable(
        "shmem was built without its device kernels: run `eval \"$(bash ci/gpu-toolchain.sh)\"` (or set NVCC/CUDA_HOME \
         and NVSHMEM_HOME) and rebuild"
            .into(),
    )
}

/// Where the kernels' state lies after the heap (every PE alike): one
/// synchronisation slot per team slot, the low-latency packets of the
/// world team, and this PE's RMA staging.
#[derive(Clone, Copy)]
pub(crate) struct Layout {
    base: usize,
    n: usize,
}

impl Layout {
    pub(crate) fn new(heap_size: usize, n: usize) -> Layout {
        Layout { base: heap_size, n }
    }
    /// A team's synchronisation slot: the signal arrays and epoch
    /// counters, then the one-kernel MoE all-to-all-v's counters and its
    /// two buffers of splits packets (`A2avPackets` in `moe.cu`).
    fn slot_bytes(&self) -> usize {
        ((3 * MAX_BLOCKS * self.n + 2 * MAX_BLOCKS) * 8).next_multiple_of(256) + 256 + 2 * A2AV_PACKET_WORDS * 16
    }
    fn slot(&self, slot: usize) -> usize {
        self.base + slot * self.slot_bytes()
    }
    fn ll(&self) -> usize {
        self.slot(TEAM_SLOTS)
    }
    /// The push all-reduce's flags and staging (`push_flags` in
    /// `reduce.cuh`), for worlds of up to `PUSH_MAX_TEAM` PEs.
    fn push(&self) -> usize {
        self.ll() + 2 * self.n * low_latency_buffer_bytes(self.n)
    }
    fn push_bytes(&self) -> usize {
        if self.n > PUSH_MAX_TEAM {
            return 0;
        }
        (self.n * MAX_BLOCKS * 8).next_multiple_of(256) + 2 * self.n * PUSH_MAX_BYTES
    }
    fn temp(&self) -> usize {
        self.push() + self.push_bytes()
    }
    /// This PE's staging of the MoE all-to-all-v (`A2avTable` in `moe.cu`).
    fn a2av(&self) -> usize {
        self.temp() + RMA_BLOCKS * self.n * RMA_CHUNK
    }
    /// Bytes of all the kernels' state.
    pub(crate) fn bytes(&self) -> usize {
        self.a2av() + A2AV_TABLE_WORDS * 8 - self.base
    }
}

/// Which of the low-latency and push kernels a collective may take, and
/// their grids: the world team's collectives, with [`Tuning`] resolved
/// against the defaults. The same on every PE (the settings must be).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Protocols {
    world: bool,
    tuning: Tuning,
    push_blocks: usize,
}

impl Protocols {
    pub(crate) fn new(world: bool, tuning: &Tuning) -> Protocols {
        Protocols {
            world,
            tuning: *tuning,
            push_blocks: tuning.push_blocks.map_or(PUSH_BLOCKS, |b| (b as usize).clamp(1, MAX_BLOCKS)),
        }
    }

    /// Whether the low-latency kernels take `bytes` per peer on this team.
    fn low_latency(&self, t: &TeamSync, bytes: usize) -> bool {
        // The limit is within the packets' room already.
        self.world && t.rma == 0 && bytes <= crate::algo::low_latency_max_bytes(t.n as usize, &self.tuning)
    }

    /// Whether the low-latency kernels move `bytes` per peer in lines.
    fn lines(&self, bytes: usize) -> bool {
        bytes >= crate::algo::low_latency_lines_min_bytes(&self.tuning)
    }

    /// The low-latency kernels' grid for `bytes` per peer, in lines of
    /// `line_bytes` data bytes or in packets.
    fn ll_grid(&self, bytes: usize, line_bytes: Option<usize>) -> Grid {
        let blocks = crate::algo::low_latency_blocks(bytes, &self.tuning);
        Grid {
            blocks: blocks as usize,
            threads: crate::algo::low_latency_threads(bytes, blocks, line_bytes, &self.tuning),
        }
    }

    /// The low-latency kernels' name suffix and grid for `bytes` per peer:
    /// `_ll128` (128-byte lines of `line_bytes` data bytes) from the tuned
    /// size, else `_ll` (8-byte packets).
    fn ll(&self, bytes: usize, line_bytes: usize) -> (&'static str, Grid) {
        let lines = self.lines(bytes);
        (if lines { "_ll128" } else { "_ll" }, self.ll_grid(bytes, lines.then_some(line_bytes)))
    }

    /// Whether the line (LL128) kernels may take `bytes` per peer on this
    /// team when asked for: the low-latency packets' room, which their
    /// lines share.
    fn lines_fit(&self, t: &TeamSync, bytes: usize) -> bool {
        self.world && t.rma == 0 && bytes <= low_latency_room_bytes(t.n as usize)
    }

    /// Whether the push kernels take `bytes` per peer on this team.
    fn push(&self, t: &TeamSync, bytes: usize) -> bool {
        self.world && t.rma == 0 && t.n as usize <= PUSH_MAX_TEAM && bytes <= PUSH_MAX_BYTES
    }
}

/// A launch's blocks and threads a block.
#[derive(Clone, Copy, Debug)]
struct Grid {
    blocks: usize,
    threads: u32,
}

impl Grid {
    /// `blocks` blocks of [`THREADS`].
    fn of(blocks: usize) -> Grid {
        Grid { blocks, threads: THREADS }
    }
}

/// `shmem::k::TeamSync` of `common.cuh`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct TeamSync {
    peer_heap: u64,
    pes: u64,
    heap: u64,
    sync_offset: u64,
    ll_offset: u64,
    temp_offset: u64,
    rank: i32,
    n: i32,
    rma: i32,
    _pad: i32,
}

/// `A2av` of `moe.cu`: one MoE all-to-all-v, passed by value.
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
    /// Set by [`Kernels::all_to_all_v`].
    table: u64,
    error: u64,
    /// Set by [`Kernels::all_to_all_v`].
    block_bytes: u64,
    /// 0: 1D, 1: 2D dispatch, 2: 2D combine.
    pub kind: i32,
    /// Experts per PE (1 for 1D).
    pub ne: i32,
    pub major_align: i32,
    /// Set by [`Kernels::all_to_all_v`].
    shared_splits: i32,
    blocks: i32,
    /// Set by [`Kernels::all_to_all_v`].
    local_blocks: i32,
}

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
        }
    }
}

/// What a MoE all-to-all-v's device-side check found (`A2avError` of
/// `moe.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceCheckFailure {
    /// The operation (the `kind` of [`A2av`]).
    pub kind: i32,
    /// 1 negative split, 2 negative offset, 3 offset before the previous
    /// chunk's end, 4 chunk past the input, 5 output too small.
    pub class: u32,
    /// The PE whose splits (classes 1–4) or output (5) are wrong.
    pub pe: usize,
    /// The entry of its splits (classes 1–4).
    pub index: usize,
    /// The offending split, offset or received rows.
    pub value: i64,
    /// The input's (classes 1–4) or output's (5) rows.
    pub limit: u64,
    /// Failed operations since the last look.
    pub count: u64,
}

/// The error record the MoE kernels write on a failed check: pinned host
/// memory mapped into the device (not managed memory), so the host reads it
/// without synchronising with the stream.
struct HostRecord {
    ptr: *mut u64,
    /// `ptr` in the device's address space.
    device: u64,
}

impl HostRecord {
    const WORDS: usize = 4;

    fn new() -> Result<HostRecord> {
        // SAFETY: a plain pinned allocation; CU_MEMHOSTALLOC_DEVICEMAP maps
        // it into the device's address space (with unified addressing at the
        // same address).
        let ptr = unsafe {
            cudarc::driver::result::malloc_host(Self::WORDS * 8, cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP)
        }?
        .cast::<u64>();
        let mut device = 0;
        // SAFETY: `ptr` came from cuMemHostAlloc with DEVICEMAP.
        let mapped = unsafe { cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut device, ptr.cast(), 0) };
        let record = HostRecord { ptr, device };
        mapped.result()?;
        for w in 0..Self::WORDS {
            record.store(w, 0);
        }
        Ok(record)
    }

    fn load(&self, w: usize) -> u64 {
        // SAFETY: `w < WORDS`; volatile, as the device writes it.
        unsafe { self.ptr.add(w).read_volatile() }
    }

    fn store(&self, w: usize, v: u64) {
        // SAFETY: as in `load`.
        unsafe { self.ptr.add(w).write_volatile(v) }
    }

    /// The recorded failure, cleared; `None` if nothing failed since the last look.
    fn take(&self) -> Option<DeviceCheckFailure> {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let count = self.load(2);
        if count == 0 {
            return None;
        }
        let (code, value, limit) = (self.load(0), self.load(1) as i64, self.load(3));
        self.store(2, 0);
        Some(DeviceCheckFailure {
            kind: ((code >> 52) & 0xf) as i32,
            class: (code >> 56) as u32,
            pe: ((code >> 32) & 0xfffff) as usize,
            index: (code & 0xffff_ffff) as usize,
            value,
            limit,
            count,
        })
    }
}

impl Drop for HostRecord {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once; an error (a dead
        // context) leaves nothing to free.
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr.cast()) };
    }
}

/// A team's view for the kernels: its members' heap bases (0 where RMA)
/// and PE numbers on the device, and the slot of its synchronisation state.
struct View {
    members: Vec<usize>,
    _heap: CudaSlice<u64>,
    _pes: CudaSlice<i32>,
    sync: TeamSync,
}

/// The loaded module.
pub(crate) struct Kernels {
    module: CUmodule,
    functions: Mutex<HashMap<String, usize>>,
    layout: Layout,
    /// Views by (team slot, RMA forced).
    views: Mutex<HashMap<(usize, bool), View>>,
    /// Where the MoE kernels record a failed check.
    a2av_error: HostRecord,
    /// Blocks of a kernel (of 512 threads, one an SM) resident at once on
    /// every PE's GPU, agreed when the kernels are loaded
    /// ([`Kernels::set_resident_blocks`]): the MoE line kernel's grid
    /// stays within them (`Kernels::all_to_all_v`). Before, this PE's SMs.
    resident_blocks: usize,
}

/// How a reduction runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reduction {
    LowLatency,
    LowLatency128,
    Push,
    OneShot,
    TwoShot,
    TwoShotStores,
    ReduceScatter,
    ReduceScatterLowLatency,
    ReduceScatterPush,
}

impl Kernels {
    /// Loads the cubin, registers it with NVSHMEM, checks that it sees this
    /// PE, and makes the world's and node's views. The state (`layout`) is
    /// zeroed on every PE.
    pub(crate) fn load(g: &GpuWorld, me: usize, n: usize, layout: Layout, node: &[usize]) -> Result<Kernels> {
        let cubin = CUBIN.ok_or_else(not_built)?;
        let (a, b, c) = g.version;
        let runtime = format!("{a}.{b}.{c}");
        if BUILT_WITH != runtime {
            return Err(Error::BackendUnavailable(format!(
                "the kernels were linked with NVSHMEM {BUILT_WITH}'s device library, but the host library is {runtime}: \
                 rebuild against {runtime}"
            )));
        }
        g.cuda.bind_to_thread()?;
        // cuModuleLoadData wants the image aligned; copy it into an owned,
        // 8-byte aligned buffer.
        let mut image = vec![0u64; cubin.len().div_ceil(8)];
        // SAFETY: `image` holds at least cubin.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(cubin.as_ptr(), image.as_mut_ptr().cast::<u8>(), cubin.len()) };
        // SAFETY: a complete, linked cubin (or fat binary of cubins) built for
        // this crate's architectures.
        let module = unsafe { cudarc::driver::result::module::load_data(image.as_ptr().cast()) }?;
        // SAFETY: a module loaded in this PE's context, NVSHMEM initialised.
        let rc = unsafe { cumodule_init(g.nv, module) }?;
        check("nvshmemx_cumodule_init", rc)?;
        let k = Kernels {
            module,
            functions: Mutex::new(HashMap::new()),
            layout,
            views: Mutex::new(HashMap::new()),
            a2av_error: HostRecord::new()?,
            resident_blocks: g.cuda.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1)
                as usize,
        };
        k.selfcheck(g, me, n)?;
        let world: Vec<usize> = (0..n).collect();
        for force in [false, true] {
            k.add_view(g, 0, &world, me, force)?;
            k.add_view(g, 1, node, me, force)?;
        }
        Ok(k)
    }

    /// The blocks resident at once: this PE's GPU's SMs (under CUDA MPS,
    /// its share) until [`Kernels::set_resident_blocks`].
    pub(crate) fn resident_blocks(&self) -> usize {
        self.resident_blocks
    }

    /// The blocks resident at once on every PE's GPU, agreed by every PE:
    /// the fewest of each PE's SMs, less an eighth where PEs share a GPU
    /// (under MPS their grids must fit it together: at 2 PEs sharing an
    /// H200, 66 SMs each, the MoE line kernel took 128 tokens in 9 µs on
    /// grids of 56 blocks, in 13 on 66).
    pub(crate) fn set_resident_blocks(&mut self, blocks: usize) {
        self.resident_blocks = blocks.max(1);
    }

    /// Makes the views of a new team on `slot` (both RMA settings) after
    /// zeroing this PE's synchronisation state of the slot. The caller
    /// makes sure every member has done so before any uses the team.
    pub(crate) fn add_team(&self, g: &GpuWorld, slot: usize, members: &[usize], me: usize) -> Result<()> {
        // A dropped team's kernels may still run on a user's stream and
        // write the slot's epoch counters when they end: let them finish.
        g.cuda.synchronize()?;
        g.zero(g.addr(self.layout.slot(slot)), self.layout.slot_bytes(), g.own_stream())?;
        g.own_stream().synchronize()?;
        for force in [false, true] {
            self.add_view(g, slot, members, me, force)?;
        }
        Ok(())
    }

    /// Forgets the views of a team slot.
    pub(crate) fn drop_team(&self, slot: usize) {
        let mut views = self.views.lock().unwrap_or_else(|e| e.into_inner());
        views.remove(&(slot, false));
        views.remove(&(slot, true));
    }

    fn add_view(&self, g: &GpuWorld, slot: usize, members: &[usize], me: usize, force: bool) -> Result<()> {
        let rank = members.iter().position(|&m| m == me).expect("a member");
        let bases: Vec<u64> = members
            .iter()
            .map(|&pe| match g.peer_base[pe] {
                Some(b) if pe == me || !force => b,
                _ => 0,
            })
            .collect();
        let pes: Vec<i32> = members.iter().map(|&pe| pe as i32).collect();
        let s = g.own_stream();
        let heap = s.clone_htod(&bases)?;
        let pes_dev = s.clone_htod(&pes)?;
        s.synchronize()?;
        let (hp, _a) = cudarc::driver::DevicePtr::device_ptr(&heap, s);
        let (pp, _b) = cudarc::driver::DevicePtr::device_ptr(&pes_dev, s);
        let sync = TeamSync {
            peer_heap: hp,
            pes: pp,
            heap: g.heap_base,
            sync_offset: self.layout.slot(slot) as u64,
            ll_offset: self.layout.ll() as u64,
            temp_offset: self.layout.temp() as u64,
            rank: rank as i32,
            n: members.len() as i32,
            rma: bases.contains(&0) as i32,
            _pad: 0,
        };
        drop((_a, _b));
        let view = View { members: members.to_vec(), _heap: heap, _pes: pes_dev, sync };
        self.views.lock().unwrap_or_else(|e| e.into_inner()).insert((slot, force), view);
        Ok(())
    }

    /// The kernels' view of the team on `slot` with these members.
    pub(crate) fn team(&self, slot: usize, members: &[usize], force_rma: bool) -> Result<TeamSync> {
        let views = self.views.lock().unwrap_or_else(|e| e.into_inner());
        match views.get(&(slot, force_rma)) {
            Some(v) if v.members == members => Ok(v.sync),
            _ => Err(Error::Invalid(format!("team slot {slot} has no kernel state for members {members:?}"))),
        }
    }

    fn function(&self, name: &str) -> Result<CUfunction> {
        let mut map = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&f) = map.get(name) {
            return Ok(f as CUfunction);
        }
        let cname = CString::new(name).expect("kernel names have no NUL");
        // SAFETY: the module is loaded; the name is a C string.
        let f =
            unsafe { cudarc::driver::result::module::get_function(self.module, cname) }.cuda("cuModuleGetFunction")?;
        map.insert(name.to_owned(), f as usize);
        Ok(f)
    }

    /// # Safety
    /// `params` point at values of the kernel's parameter types.
    unsafe fn launch(
        &self,
        name: &str,
        blocks: usize,
        threads: u32,
        stream: CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_shared(name, blocks, threads, 0, stream, params) }
    }

    /// Launches a `(TeamSync, A)` kernel of `THREADS` threads a block.
    ///
    /// # Safety
    /// `A` is the `repr(C)` struct the kernel declares as its second
    /// parameter; the launch's reads and writes are the caller's to allow.
    unsafe fn launch_with<A: Copy>(
        &self,
        name: &str,
        blocks: usize,
        shared: u32,
        t: TeamSync,
        arg: A,
        s: CUstream,
    ) -> Result<()> {
        let (mut t, mut arg) = (t, arg);
        let mut params: [*mut c_void; 2] = [(&raw mut t).cast(), (&raw mut arg).cast()];
        // SAFETY: the caller's contract.
        unsafe { self.launch_shared(name, blocks, THREADS, shared, s, &mut params) }
    }

    /// [`Kernels::launch`] with `shared` bytes of dynamic shared memory;
    /// the collectives ([`FOLLOWS_STREAM`]) by programmatic dependent
    /// launch.
    ///
    /// # Safety
    /// As [`Kernels::launch`].
    unsafe fn launch_shared(
        &self,
        name: &str,
        blocks: usize,
        threads: u32,
        shared: u32,
        stream: CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self.function(name)?;
        let grid = (blocks as u32, 1, 1);
        if FOLLOWS_STREAM.iter().any(|p| name.starts_with(p)) {
            // SAFETY: a plain C struct, all zeros a valid value.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: threads,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: shared,
                hStream: stream,
                attrs: &raw mut attr,
                numAttrs: 1,
            };
            // SAFETY: the caller's contract; `config` and `attr` outlive the call.
            unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }.result()?;
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { cudarc::driver::result::launch_kernel(f, grid, (threads, 1, 1), shared, stream, params) }?;
        Ok(())
    }

    fn selfcheck(&self, g: &GpuWorld, me: usize, n: usize) -> Result<()> {
        let s = g.own_stream();
        let mut out = s.alloc_zeros::<i32>(2)?;
        let (ptr, sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut out, s);
        let mut p = ptr;
        // SAFETY: one int* argument, pointing at 2 ints.
        unsafe { self.launch("shmem_selfcheck", 1, 1, s.cu_stream(), &mut [(&raw mut p).cast()])? };
        drop(sync);
        let got = s.clone_dtoh(&out)?;
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
    fn most_blocks(t: &TeamSync) -> usize {
        if t.rma != 0 {
            RMA_BLOCKS
        } else {
            MAX_BLOCKS
        }
    }

    /// Blocks for `units` of 16 bytes spread over threads (the same on every PE).
    fn blocks(t: &TeamSync, units: usize) -> usize {
        units.div_ceil(THREADS as usize).clamp(1, Self::most_blocks(t))
    }

    /// # Safety
    /// `dst` and `src` are heap offsets of checked regions; the launch reads
    /// and writes them on every member as the kernel describes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch4(
        &self,
        name: &str,
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
        unsafe { self.launch(name, grid.blocks, grid.threads, s, &mut params) }
    }

    /// `bytes` from device address `src` to `dst` (either may be a peer's
    /// NVLink mapping) by an SM kernel of `blocks` blocks (`overlap.cu`).
    ///
    /// # Safety
    /// Both ranges are valid for the copy and apart.
    pub(crate) unsafe fn copy_sm(&self, dst: u64, src: u64, bytes: usize, blocks: usize, s: CUstream) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let (mut d, mut f, mut b) = (dst, src, bytes as u64);
        let mut params: [*mut c_void; 3] = [(&raw mut d).cast(), (&raw mut f).cast(), (&raw mut b).cast()];
        // SAFETY: (u64, u64, u64) as the kernel declares; the caller's contract.
        unsafe { self.launch("shmem_copy_sm", blocks.max(1), THREADS, s, &mut params) }
    }

    /// `out[i] = Σ_j slots[j·stride + i]` over `n` slots, in slot order,
    /// for `count` elements of `dtype` (f32, f16, bf16) at device addresses.
    ///
    /// # Safety
    /// `out` holds `count` elements, `slots` `n` slots of `stride` (≥ count).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn sum_slots(
        &self,
        dtype: DType,
        out: u64,
        slots: u64,
        count: usize,
        stride: usize,
        n: usize,
        s: CUstream,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let name = format!("shmem_sum_slots_{}", dtype.name());
        let (mut o, mut sl, mut c, mut st, mut nn) = (out, slots, count as u64, stride as u64, n as i32);
        let mut params: [*mut c_void; 5] = [
            (&raw mut o).cast(),
            (&raw mut sl).cast(),
            (&raw mut c).cast(),
            (&raw mut st).cast(),
            (&raw mut nn).cast(),
        ];
        let blocks = count.div_ceil(THREADS as usize).clamp(1, 4 * MAX_BLOCKS);
        // SAFETY: (u64, u64, u64, u64, int) as the kernel declares; the caller's contract.
        unsafe { self.launch(&name, blocks, THREADS, s, &mut params) }
    }

    /// A barrier of the team on the stream.
    pub(crate) fn barrier(&self, t: TeamSync, s: CUstream) -> Result<()> {
        let mut t = t;
        // SAFETY: (TeamSync) as the kernel declares.
        unsafe { self.launch("shmem_barrier", 1, 32, s, &mut [(&raw mut t).cast()]) }
    }

    /// All-reduce of `count` elements at heap offsets `dst`/`src` (the same
    /// on every member; equal for in place) with the algorithm `algo` asks
    /// for where it applies, else the automatic choice.
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
        let ll = p.low_latency(&t, bytes);
        let push = p.push(&t, bytes);
        let one_shot = dst != src;
        // The two-shot by stores: a pair over NVLink, out of place.
        let stores = t.n == 2 && t.rma == 0 && dst != src;
        let how = match algo {
            AllReduceAlgo::LowLatency if ll => Reduction::LowLatency,
            AllReduceAlgo::LowLatency128 if p.lines_fit(&t, bytes) => Reduction::LowLatency128,
            AllReduceAlgo::Push if push => Reduction::Push,
            AllReduceAlgo::OneShot if one_shot => Reduction::OneShot,
            AllReduceAlgo::TwoShot => Reduction::TwoShot,
            AllReduceAlgo::TwoShotStores if stores => Reduction::TwoShotStores,
            AllReduceAlgo::TwoShotStores => Reduction::TwoShot,
            _ if ll && p.lines(bytes) => Reduction::LowLatency128,
            _ if ll => Reduction::LowLatency,
            _ if push => Reduction::Push,
            _ if one_shot && bytes <= ONE_SHOT_MAX_BYTES => Reduction::OneShot,
            _ if stores && bytes >= TWO_SHOT_STORES_MIN_BYTES => Reduction::TwoShotStores,
            _ => Reduction::TwoShot,
        };
        self.reduce(t, p, how, dtype, op, dst, src, count, s)
    }

    /// Reduce-scatter: `count` elements into each member's `dst` from block
    /// `rank` of every member's `src`.
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
        let how = if p.low_latency(&t, bytes) {
            Reduction::ReduceScatterLowLatency
        } else if p.push(&t, bytes) {
            Reduction::ReduceScatterPush
        } else {
            Reduction::ReduceScatter
        };
        self.reduce(t, p, how, dtype, op, dst, src, count, s)
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        t: TeamSync,
        p: Protocols,
        how: Reduction,
        dtype: DType,
        op: ReduceOp,
        dst: usize,
        src: usize,
        count: usize,
        s: CUstream,
    ) -> Result<()> {
        let (dt, o) = (dtype.name(), op.name());
        let np = if op == ReduceOp::Sum && matches!(t.n, 2 | 4 | 8) { t.n } else { 0 };
        let bytes = count * dtype.size();
        let units = bytes.div_ceil(16);
        let line_bytes = crate::algo::reduce_line_data_bytes(dtype.size());
        let (name, grid) = match how {
            Reduction::LowLatency => (format!("shmem_allreduce_ll_{dt}_{o}"), p.ll_grid(bytes, None)),
            Reduction::LowLatency128 => (format!("shmem_allreduce_ll128_{dt}_{o}"), p.ll_grid(bytes, Some(line_bytes))),
            Reduction::Push => (format!("shmem_allreduce_push_{dt}_{o}_{np}"), Grid::of(p.push_blocks)),
            Reduction::OneShot => (format!("shmem_allreduce_oneshot_{dt}_{o}_{np}"), Grid::of(Self::blocks(&t, units))),
            Reduction::TwoShot => (
                format!("shmem_allreduce_twoshot_{dt}_{o}_{np}"),
                Grid::of(Self::blocks(&t, units.div_ceil(t.n as usize))),
            ),
            Reduction::TwoShotStores => {
                (format!("shmem_allreduce_twoshot2_{dt}_{o}_{np}"), Grid::of(Self::blocks(&t, units.div_ceil(2))))
            }
            Reduction::ReduceScatter => {
                (format!("shmem_reducescatter_{dt}_{o}_{np}"), Grid::of(Self::blocks(&t, units)))
            }
            Reduction::ReduceScatterLowLatency => {
                let (suffix, grid) = p.ll(bytes, line_bytes);
                (format!("shmem_reducescatter{suffix}_{dt}_{o}"), grid)
            }
            Reduction::ReduceScatterPush => {
                (format!("shmem_reducescatter_push_{dt}_{o}_{np}"), Grid::of(p.push_blocks))
            }
        };
        // SAFETY: (TeamSync, dst, src, count) as every reduction kernel
        // declares; regions checked and agreed by the caller.
        unsafe { self.launch4(&name, grid, t, dst as u64, src as u64, count as u64, s) }
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
        self.launch_move("shmem_allgather", t, p, dst, src, bytes, in_place as i32, s)
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
            unsafe { cudarc::driver::result::memcpy_dtod_async(base + mine as u64, from, bytes, s)? };
        }
        if !in_place {
            // SAFETY: checked regions of this PE's heap.
            unsafe { cudarc::driver::result::memcpy_dtod_async(g.addr(mine), from, bytes, s)? };
        }
        self.barrier(t, s)
    }

    /// Broadcast of `bytes` from member `root`'s `src` into every member's `dst`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn broadcast(
        &self,
        t: TeamSync,
        p: Protocols,
        dst: usize,
        src: usize,
        bytes: usize,
        root: usize,
        s: CUstream,
    ) -> Result<()> {
        self.launch_move("shmem_broadcast", t, p, dst, src, bytes, root as i32, s)
    }

    /// Broadcast by pulls (`shmem_broadcast_pull`): every member reads the
    /// root's source through NVLink, and the root waits until all have.
    /// Every member must reach the root over NVLink (`t.rma == 0`).
    pub(crate) fn broadcast_pull(
        &self,
        t: TeamSync,
        dst: usize,
        src: usize,
        bytes: usize,
        root: usize,
        s: CUstream,
    ) -> Result<()> {
        debug_assert_eq!(t.rma, 0, "pulls need every member's NVLink address");
        let grid = Grid::of(Self::blocks(&t, bytes.div_ceil(16)));
        // SAFETY: (TeamSync, dst, src, bytes, root) as the kernel declares;
        // regions checked and agreed by the caller.
        unsafe { self.launch5("shmem_broadcast_pull", grid, t, dst, src, bytes, root as i32, s) }
    }

    /// Launches a (TeamSync, dst, src, bytes, int) kernel of `move.cu`:
    /// `{kernel}_ll` where the low-latency kernels take `bytes`, else `kernel`.
    #[allow(clippy::too_many_arguments)]
    fn launch_move(
        &self,
        kernel: &str,
        t: TeamSync,
        p: Protocols,
        dst: usize,
        src: usize,
        bytes: usize,
        x: i32,
        s: CUstream,
    ) -> Result<()> {
        let (name, grid) = if p.low_latency(&t, bytes) {
            let (suffix, grid) = p.ll(bytes, LINE_DATA_BYTES);
            (format!("{kernel}{suffix}"), grid)
        } else if p.push(&t, bytes) {
            (format!("{kernel}_push"), Grid::of(p.push_blocks))
        } else {
            (kernel.to_owned(), Grid::of(Self::blocks(&t, bytes.div_ceil(16))))
        };
        // SAFETY: (TeamSync, u64, u64, u64, int) as these kernels declare;
        // regions checked and agreed by the caller.
        unsafe { self.launch5(&name, grid, t, dst, src, bytes, x, s) }
    }

    /// Launches a (TeamSync, dst, src, bytes, int) kernel of `move.cu`.
    ///
    /// # Safety
    /// The kernel declares these parameters; `dst` and `src` are heap
    /// offsets of checked regions, read and written as the kernel describes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch5(
        &self,
        name: &str,
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
        unsafe { self.launch(name, grid.blocks, grid.threads, s, &mut params) }
    }

    /// Whether an all-to-all of `bytes` per member may be in place (the
    /// low-latency and push kernels read every block of a chunk before
    /// writing it).
    pub(crate) fn all_to_all_in_place(t: &TeamSync, p: Protocols, bytes: usize) -> bool {
        p.low_latency(t, bytes) || p.push(t, bytes)
    }

    /// All-to-all of `bytes` per member; `src` and `dst` apart unless
    /// [`Kernels::all_to_all_in_place`].
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
        let (name, grid) = if p.low_latency(&t, bytes) {
            let (suffix, grid) = p.ll(bytes, LINE_DATA_BYTES);
            (format!("shmem_alltoall{suffix}"), grid)
        } else if p.push(&t, bytes) {
            ("shmem_alltoall_push".to_owned(), Grid::of(p.push_blocks))
        } else {
            ("shmem_alltoall".to_owned(), Grid::of(Self::blocks(&t, bytes.div_ceil(16))))
        };
        // SAFETY: (TeamSync, dst, src, bytes) as the kernel declares.
        unsafe { self.launch4(&name, grid, t, dst as u64, src as u64, bytes as u64, s) }
    }
}

/// The MoE all-to-all-v.
impl Kernels {
    /// Whether `n` PEs with `ne` experts each fit the staging (`kind` 2
    /// stages offsets too).
    pub(crate) fn a2av_fits(n: usize, ne: usize, kind: i32) -> bool {
        Self::a2av_work_words(n, ne, kind).saturating_add(n.saturating_mul(ne).saturating_mul(4)).saturating_add(2)
            <= A2AV_TABLE_WORDS
    }

    /// Words of every PE's splits and the work arrays (`A2avTable` in `moe.cu`).
    fn a2av_work_words(n: usize, ne: usize, kind: i32) -> usize {
        let m = n.saturating_mul(ne);
        n.saturating_mul(Self::a2av_split_words(n, ne, kind))
            .saturating_add(n.saturating_mul(2).saturating_mul(m.saturating_add(1)))
    }

    /// Words of one PE's splits (and offsets, for the combine: `kind` 2).
    fn a2av_split_words(n: usize, ne: usize, kind: i32) -> usize {
        let m = n.saturating_mul(ne);
        if kind == 2 {
            m.saturating_mul(2)
        } else {
            m
        }
    }

    /// Launches the MoE all-to-all-v: one kernel (`shmem_a2av_fused_*`)
    /// where every peer is reached over NVLink and the splits fit its
    /// packets and shared memory, unless `settings.moe` is
    /// [`MoeKernels::PlanThenMove`]; the line kernel (`shmem_a2av_lines_*`)
    /// instead on the `world` team where [`MoeKernels::Lines`] is asked
    /// for, or the input is within [`Tuning::moe_lines_max_bytes`], and it
    /// fits ([`moe_lines_fit`], 32 experts per PE and shared memory); else
    /// the plan kernel (one block: barrier, every PE's splits checked,
    /// out_splits_offsets and the send plan) and the data kernel. Every PE
    /// makes the same choice (the same team, sizes and settings).
    /// `settings.moe_local_blocks` of the data blocks copy this PE's own
    /// chunks while the others push (0: each pushes, then copies; `None`:
    /// the kernel chooses). A failed check writes nothing but the record
    /// [`Kernels::take_a2av_error`] reads.
    pub(crate) fn all_to_all_v(
        &self,
        t: TeamSync,
        world: bool,
        a: A2av,
        settings: &Collectives,
        s: CUstream,
    ) -> Result<()> {
        let (form, local_blocks) = (settings.moe, settings.moe_local_blocks);
        let mut a = a;
        a.table = self.layout.a2av() as u64;
        a.error = self.a2av_error.device;
        let in_bytes = (a.in_rows * a.row_bytes) as usize;
        let (n, ne) = (t.n as usize, a.ne as usize);
        // The line kernel's tables: every PE's splits, the work arrays, the
        // send plan (4 words a chunk; for the own copy) and the receipts'
        // chunks (3 words each).
        let lines_shared = (Self::a2av_work_words(n, ne, a.kind) + 7 * n * ne) * 8;
        let lines = world
            && t.rma == 0
            && ne <= A2AV_LINES_MAX_EXPERTS
            && lines_shared <= A2AV_SHARED_MAX_BYTES
            && moe_lines_fit(n, ne, a.kind == 2, in_bytes)
            && match form {
                MoeKernels::Lines => true,
                MoeKernels::Auto => moe_lines_max_bytes(&settings.tuning).is_some_and(|max| in_bytes <= max),
                MoeKernels::PlanThenMove => false,
            };
        // The blocks, by what the input can hold (the line kernel: all of
        // them work).
        let tuned = settings.tuning.moe_block_bytes.map(|b| b.max(16));
        if lines {
            // Every block of the line kernel waits for the peers' lines
            // from its start: all of them resident at once on every PE.
            let per = tuned.unwrap_or(A2AV_LINES_BYTES_PER_BLOCK);
            let resident = self.resident_blocks.clamp(1, MAX_BLOCKS);
            a.blocks = in_bytes.div_ceil(per).clamp(1, resident) as i32;
            let name = A2AV_LINES[a.kind as usize];
            // SAFETY: (TeamSync, A2av) as the kernel declares; the regions
            // were checked on the host, the splits are checked on the
            // device, and what a PE sends fits the buffer (`moe_lines_fit`).
            return unsafe { self.launch_with(name, a.blocks as usize, lines_shared as u32, t, a, s) };
        }
        // The other kernels keep as many working as what is sent needs
        // (`a2av_active`; the idle ones skip their channel).
        let per = tuned.unwrap_or(A2AV_BYTES_PER_BLOCK);
        let blocks = in_bytes.div_ceil(per).clamp(1, Self::most_blocks(&t));
        a.block_bytes = per as u64;
        a.blocks = blocks as i32;
        a.local_blocks = local_blocks.map_or(-1, |b| b.min(MAX_BLOCKS as u32) as i32);
        let packets = n * Self::a2av_split_words(n, ne, a.kind);
        let one = (Self::a2av_work_words(n, ne, a.kind) + 4 * n * ne) * 8;
        if form != MoeKernels::PlanThenMove
            && t.rma == 0
            && packets <= A2AV_PACKET_WORDS
            && one <= A2AV_SHARED_MAX_BYTES
        {
            // SAFETY: (TeamSync, A2av) as the kernel declares; the regions
            // were checked on the host, the splits are checked on the device.
            return unsafe { self.launch_with(A2AV_FUSED[a.kind as usize], blocks, one as u32, t, a, s) };
        }
        // Every PE's splits (and offsets) and the work arrays in the plan
        // kernel's shared memory where they fit.
        let staged = Self::a2av_work_words(n, ne, a.kind) * 8;
        let shared = if staged <= A2AV_SHARED_MAX_BYTES { staged } else { 0 };
        a.shared_splits = (shared > 0) as i32;
        // SAFETY: as above.
        unsafe { self.launch_with("shmem_a2av_plan", 1, shared as u32, t, a, s) }?;
        // SAFETY: as above.
        unsafe { self.launch_with("shmem_a2av_move", blocks, 0, t, a, s) }
    }

    /// What the MoE kernels' checks found since the last look (cleared).
    pub(crate) fn take_a2av_error(&self) -> Option<DeviceCheckFailure> {
        self.a2av_error.take()
    }
}

/// `MoeRoute` of `moe_layer.cu`: heap offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct MoeRoute {
    pub ids: u64,
    pub n_tokens: u64,
    pub splits: u64,
    pub slot_rows: u64,
    pub scratch: u64,
    pub tokens: u64,
    pub send: u64,
    pub row_bytes: u64,
    pub max_tokens: i64,
    pub top_k: i32,
    pub experts: i32,
}

/// `MoeCombine` of `moe_layer.cu`: heap offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct MoeCombine {
    pub back: u64,
    pub slot_rows: u64,
    pub weights: u64,
    pub n_tokens: u64,
    pub out: u64,
    pub max_tokens: i64,
    pub hidden: i64,
    pub top_k: i32,
    pub _pad: i32,
}

/// Threads of the route kernel: its scratch is this × experts `u32`s.
pub(crate) const ROUTE_THREADS: usize = THREADS as usize;

/// The MoE layer's own kernels (`moe_layer.cu`): local, on the world's view.
impl Kernels {
    /// The route kernel (one block), then the gather (a block per slot, up to 1024).
    pub(crate) fn moe_route(&self, t: TeamSync, r: MoeRoute, s: CUstream) -> Result<()> {
        let slots = (r.max_tokens as usize).saturating_mul(r.top_k as usize);
        // SAFETY: (TeamSync, MoeRoute) as the kernels declare; regions
        // checked by the layer; counts and ids checked on the device.
        unsafe { self.launch_with("shmem_moe_route", 1, 0, t, r, s) }?;
        // SAFETY: as above.
        unsafe { self.launch_with("shmem_moe_gather", slots.clamp(1, 1024), 0, t, r, s) }
    }

    /// The weighted sum of each token's returned rows.
    pub(crate) fn moe_combine(&self, dtype: DType, t: TeamSync, c: MoeCombine, s: CUstream) -> Result<()> {
        let name = format!("shmem_moe_combine_{}", dtype.name());
        let blocks = (c.max_tokens as usize).clamp(1, 1024);
        // SAFETY: (TeamSync, MoeCombine) as the kernels declare; regions checked by the layer.
        unsafe { self.launch_with(&name, blocks, 0, t, c, s) }
    }
}

/// # Safety
/// `module` is loaded in the current context; NVSHMEM is initialised.
unsafe fn cumodule_init(nv: &Nv, module: CUmodule) -> Result<i32> {
    // SAFETY: the caller's contract.
    Ok(unsafe { call!(nv, nvshmemx_cumodule_init(module as _)) })
}

#[cfg(test)]
mod tests {
    use super::FOLLOWS_STREAM;

    /// Every kernel in `kernels/` that is launched by programmatic
    /// dependent launch waits for the kernel before it as its first step:
    /// one that did not would read its inputs while that kernel still runs.
    /// Kernels launched plainly must not be named by `FOLLOWS_STREAM`
    /// (checked the other way: each prefix names at least one kernel).
    #[test]
    fn dependent_launches_wait_first() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
        let mut checked = vec![0usize; FOLLOWS_STREAM.len()];
        for entry in std::fs::read_dir(&dir).expect("kernels/ is beside the crate") {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            for (at, _) in text.match_indices("__global__") {
                let rest = &text[at..];
                // The kernel's name (a macro's up to its first `##`), then its body's first statement.
                let name = &rest[rest.find("shmem_").unwrap()..];
                let name = &name[..name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap()];
                let body = &rest[rest.find('{').unwrap() + 1..];
                let first = body.split(';').next().unwrap().replace('\\', " ");
                if let Some(i) = FOLLOWS_STREAM.iter().position(|p| name.starts_with(p)) {
                    checked[i] += 1;
                    assert_eq!(
                        first.split_whitespace().collect::<String>(),
                        "shmem::k::follow_stream()",
                        "{}: kernel {name} is launched by dependent launch but does not begin with follow_stream()",
                        path.display()
                    );
                }
            }
        }
        for (p, n) in FOLLOWS_STREAM.iter().zip(checked) {
            assert!(n > 0, "FOLLOWS_STREAM names {p}, which starts no kernel in {}", dir.display());
        }
    }
}
