//! The GPU backend: NVSHMEM's host library (through `shmem-sys`) and CUDA
//! (through cudarc).
//!
//! The whole symmetric heap is one `nvshmem_malloc` made at init; buffers
//! are carved from it by the same deterministic allocator as the host
//! backend's, so a buffer's offset is the same on every PE and its
//! symmetric address is `heap_base + offset`. Host-initiated operations use
//! NVSHMEM's `*_on_stream` calls on the caller's stream. The host control
//! area of the host backend (with an empty heap) still carries argument
//! checks, team slots and the liveness of the PEs of a node.

use crate::bootstrap::Bootstrap;
use crate::control::topology::Topology;
use crate::error::{CudaError, Error, Result};
use cudarc::driver::{CudaContext, CudaStream};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

pub(crate) use cudarc::driver::sys::CUstream;
pub(crate) type Nv = shmem_sys::Nvshmem;

/// Calls NVSHMEM function `f` of the loaded library, or returns an error
/// naming it when the library lacks it. Must be used in an `unsafe` context
/// (the call is an FFI call) inside a function returning `Result`.
macro_rules! call {
    ($nv:expr, $f:ident($($a:expr),* $(,)?)) => {
        match $nv.$f.as_ref() {
            Ok(f) => f($($a),*),
            Err(_) => {
                return Err($crate::error::Error::BackendUnavailable(format!(
                    "the loaded NVSHMEM library has no {}",
                    stringify!($f)
                )))
            }
        }
    };
}
pub(crate) mod a2av;
pub(crate) mod abi;
pub(crate) mod amo;
pub(crate) mod blas;
pub(crate) mod coll;
mod collectives;
pub(crate) mod dispatch;
mod kernel_id;
pub(crate) mod kernels;
mod layout;
mod module;
mod moe_layer;
mod overlap;
mod record;
mod teams;

pub(crate) use collectives::Protocols;

/// A failed driver call as the crate's error, noting a failure that leaves
/// the context unusable ([`sticky`]).
pub(crate) fn cuda_error(call: &'static str, e: cudarc::driver::DriverError) -> Error {
    if sticky(&e) {
        crate::control::note_fault();
    }
    Error::Cuda(CudaError { call, code: e.0 })
}

/// A driver call whose caller did not name it (`?` on a cudarc result).
impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        cuda_error(CudaError::UNNAMED, e)
    }
}

/// Names the driver call behind a cudarc result: `.cuda("cuMemcpyHtoDAsync")?`.
pub(crate) trait CudaCall<T> {
    fn cuda(self, call: &'static str) -> Result<T>;
}

impl<T> CudaCall<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn cuda(self, call: &'static str) -> Result<T> {
        self.map_err(|e| cuda_error(call, e))
    }
}

/// Whether `e` leaves the CUDA context unusable (a kernel trapped or
/// faulted): every later call fails the same way.
pub(crate) fn sticky(e: &cudarc::driver::DriverError) -> bool {
    use cudarc::driver::sys::CUresult::*;
    matches!(
        e.0,
        CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_LAUNCH_TIMEOUT
    )
}

/// Registered with glibc's `on_exit` at GPU start-up, so it runs before
/// the exit handlers NVSHMEM, NCCL and CUDA registered when they loaded.
/// After a fault their teardown talks to the dead peer or a failed context
/// and can end the process by a signal instead of the status it asked for
/// (survivors of a SIGKILLed PE can exit by a signal after reporting the
/// death). A faulted process so leaves at once, with its own status; the
/// OS frees its GPU memory and mappings.
extern "C" fn exit_without_teardown(status: c_int, _: *mut c_void) {
    if crate::control::faulted() {
        // SAFETY: flushing C stdio and leaving; nothing runs after.
        unsafe {
            libc::fflush(std::ptr::null_mut());
            libc::_exit(status);
        }
    }
}

/// Registers [`exit_without_teardown`] once per process.
fn guard_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // `on_exit` is glibc's (the libc crate does not bind it): `atexit`
    // would not pass the status on.
    extern "C" {
        fn on_exit(f: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
    }
    // SAFETY: registers a handler that only reads an atomic and exits.
    ONCE.call_once(|| unsafe {
        on_exit(exit_without_teardown, std::ptr::null_mut());
    });
}

/// NVSHMEM's handle of the world team.
pub(crate) const TEAM_WORLD: i32 = 0;
/// NVSHMEM's handle of the node team (`NVSHMEMX_TEAM_NODE`).
pub(crate) const TEAM_NODE: i32 = 2;
/// `NVSHMEM_TEAM_INVALID`.
pub(crate) const TEAM_INVALID: i32 = -1;
/// `NVSHMEM_SIGNAL_SET` / `NVSHMEM_SIGNAL_ADD`.
pub(crate) const SIGNAL_SET: i32 = 9;
pub(crate) const SIGNAL_ADD: i32 = 10;

/// Symmetric memory NVSHMEM gets beyond our heap, for its own collectives'
/// buffers and internal state.
const NVSHMEM_RESERVE: usize = 256 << 20;

/// Whether this process can run the GPU backend: a CUDA driver with a
/// device, and an NVSHMEM host library.
pub(crate) fn available() -> std::result::Result<(), String> {
    // SAFETY: only tries to open the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda.so.1) found".into());
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => return Err("the CUDA driver sees no GPU".into()),
        Err(e) => return Err(format!("the CUDA driver failed to count GPUs: {e:?}")),
    }
    shmem_sys::nvshmem().map(drop).map_err(|e| e.to_string())
}

/// This PE's GPU and its share of NVSHMEM.
pub(crate) struct GpuWorld {
    pub(crate) nv: &'static Nv,
    pub(crate) cuda: Arc<CudaContext>,
    /// Symmetric address of this PE's heap (the same on every PE).
    pub(crate) heap_base: u64,
    /// `nvshmem_ptr` of each PE's heap where loads and stores reach it
    /// (NVLink): the PEs of this node. Another node's PEs are reached
    /// through NVSHMEM's RMA, even when NVSHMEM maps them (emulated nodes
    /// of one machine).
    pub(crate) peer_base: Vec<Option<u64>>,
    /// Each world PE's node (the kernels count their traffic with PEs of
    /// other nodes: `TeamSync::remote`).
    pub(crate) node_of: Vec<usize>,
    /// NVSHMEM's team of this node's PEs: `TEAM_NODE` on a job of one
    /// node, a split of the world where nodes are consecutive ranks, else
    /// `TEAM_INVALID` (shmem's kernels only).
    pub(crate) node_team: i32,
    /// The library's version, and this PE's CUDA device.
    pub(crate) version: (i32, i32, i32),
    pub(crate) device: usize,
    /// NVSHMEM's reduce scratch per team, in bytes
    /// ([`nvshmem_reduce_scratch`]), which bounds its reduce-scatter.
    pub(crate) nv_reduce_scratch: usize,
    /// For operations given a host stream.
    own: Arc<CudaStream>,
    /// shmem's own device kernels, when built in and every peer is on NVLink.
    pub(crate) kernels: Option<kernels::Kernels>,
    /// The host-initiated atomics' kernel, built on first use.
    amo: std::sync::OnceLock<Result<amo::Amo>>,
    /// cuBLAS and the side stream of the overlapped matmuls, made on first use.
    pub(crate) blas: std::sync::Mutex<Option<blas::Blas>>,
}

// SAFETY: NVSHMEM's host API may be called from any thread once initialised;
// the raw addresses are plain numbers.
unsafe impl Send for GpuWorld {}
// SAFETY: as above.
unsafe impl Sync for GpuWorld {}

impl GpuWorld {
    /// Initialises CUDA on the GPU of this PE's rank among the PEs of its
    /// machine (divided by `pes_per_gpu`, `SHMEM_PES_PER_GPU`: emulated
    /// nodes share the machine's GPUs) and NVSHMEM with the unique-id
    /// bootstrap; allocates the symmetric heap.
    ///
    /// PEs sharing a GPU are NVSHMEM's "multiple processes per GPU": their
    /// kernels wait on each other, so they must run at once, which takes
    /// CUDA MPS (without it the GPU time-slices between the processes and a
    /// wait lasts a slice). It is for testing the protocols on a machine
    /// with fewer GPUs than PEs, not for speed.
    ///
    /// # Collective
    /// Every PE calls it after the host control area exists; every step's
    /// failure on any PE fails it on every PE.
    pub(crate) fn start(
        boot: &mut Bootstrap,
        topo: &Topology,
        pes_per_gpu: usize,
        heap_size: usize,
    ) -> Result<GpuWorld> {
        let (me, n, node) = (boot.rank(), boot.size(), topo.my_members());
        // Library and device, checked everywhere before anyone initialises.
        let nv = shmem_sys::nvshmem().map_err(|e| Error::BackendUnavailable(e.to_string()));
        let device = nv.as_ref().map_err(clone_err).and_then(|_| {
            let count = CudaContext::device_count().cuda("cuDeviceGetCount")? as usize;
            let gpu = topo.host_rank / pes_per_gpu.max(1);
            if gpu >= count {
                let most = count * pes_per_gpu.max(1);
                let node = match topo.nodes.len() {
                    1 => String::new(),
                    _ => format!(" (node {})", topo.my_node_name()),
                };
                return Err(Error::BackendUnavailable(format!(
                    "PE {me}{node} is PE {} of machine {}, which has only {count} GPU(s) for {pes_per_gpu} PE(s) \
                     each (SHMEM_PES_PER_GPU): start at most {most} PEs per machine",
                    topo.host_rank, topo.machine
                )));
            }
            let cuda = CudaContext::new(gpu).cuda("CudaContext::new")?;
            cuda.bind_to_thread().cuda("cuCtxSetCurrent")?;
            let (free, total) = cudarc::driver::result::mem_get_info().cuda("cuMemGetInfo")?;
            if heap_size.saturating_add(NVSHMEM_RESERVE) > free {
                return Err(Error::BackendUnavailable(format!(
                    "a {heap_size}-byte symmetric heap (plus {NVSHMEM_RESERVE} for NVSHMEM) does not fit on \
                     GPU {gpu} of PE {me}: {free} of its {total} bytes are free; lower SHMEM_HEAP_SIZE"
                )));
            }
            Ok((gpu, cuda))
        });
        let version = nv.as_ref().map_err(clone_err).and_then(|nv| library_version(nv));
        let step = device.as_ref().map(drop).map_err(clone_err).and(version.as_ref().map(drop).map_err(clone_err));
        boot.agree_ok(step.map(|_| Vec::new()), "finding a GPU and NVSHMEM")?;
        let (nv, (device, cuda), version) = (nv?, device?, version?);
        cuda.bind_to_thread().cuda("cuCtxSetCurrent")?;

        // NVSHMEM reads its settings from the environment at init. The heap
        // is ours to carve, plus room for NVSHMEM's own collectives.
        set_default_env("NVSHMEM_SYMMETRIC_SIZE", &(heap_size + NVSHMEM_RESERVE).to_string());
        // NVLink multicast stays off: never turned on here.
        std::env::set_var("NVSHMEM_DISABLE_NVLS", "1");
        let nv_reduce_scratch = nvshmem_reduce_scratch(std::env::var("NVSHMEM_REDUCE_SCRATCH_SIZE").ok().as_deref());

        let uid = if me == 0 { unique_id(nv) } else { Ok(Vec::new()) };
        let uids = boot.agree_ok(uid, "making NVSHMEM's unique id")?;
        let init = init_with_unique_id(nv, version, &uids[0], me, n, device);
        boot.agree_ok(init.map(|_| Vec::new()), "initialising NVSHMEM")?;
        guard_exit();

        // SAFETY: NVSHMEM is initialised; nvshmem_malloc is collective and
        // every PE asks for the same size.
        // Our heap, then the kernels' synchronisation state.
        let layout = kernels::Layout::new(heap_size, n, topo.nodes.len());
        let heap = unsafe { symmetric_malloc(nv, heap_size + layout.bytes()) };
        let got = heap.and_then(|p| {
            if p == 0 {
                Err(Error::BackendUnavailable(format!(
                    "nvshmem_malloc of a {heap_size}-byte heap failed (more than the GPU has free? lower SHMEM_HEAP_SIZE)"
                )))
            } else {
                Ok(p)
            }
        });
        boot.agree_ok(got.as_ref().map(|_| Vec::new()).map_err(clone_err), "allocating the symmetric heap")?;
        let heap_base = got?;
        let peer_base = (0..n)
            .map(|pe| {
                if topo.node_of[pe] != topo.my_node {
                    return None;
                }
                // SAFETY: `heap_base` is a symmetric address; pe < n.
                let p = unsafe { peer_ptr(nv, heap_base, pe) };
                p.ok().filter(|&p| p != 0)
            })
            .collect();
        let own = cuda.new_stream().cuda("cuStreamCreate")?;
        let mut world = GpuWorld {
            nv,
            cuda,
            heap_base,
            peer_base,
            node_of: topo.node_of.clone(),
            node_team: TEAM_NODE,
            version,
            device,
            nv_reduce_scratch,
            own,
            kernels: None,
            amo: Default::default(),
            blas: Default::default(),
        };
        // Zero the synchronisation state everywhere before any kernel runs.
        world.zero(world.addr(heap_size), layout.bytes(), &world.own)?;
        world.own.synchronize().cuda("cuStreamSynchronize")?;
        // SAFETY: NVSHMEM is initialised; every PE calls it here.
        unsafe { call!(world.nv, nvshmem_barrier_all()) };
        let node_team = world.split_node_team(topo);
        boot.agree_ok(node_team.as_ref().map(|_| Vec::new()).map_err(clone_err), "making the node's NVSHMEM team")?;
        world.node_team = node_team?;
        let loaded = match kernels::Kernels::load(&world, me, n, layout, node) {
            Err(Error::BackendUnavailable(m)) if m.contains("built without") => Ok(None),
            other => other.map(Some),
        };
        // Whether this PE has the kernels, the blocks its GPU holds at once
        // (`Kernels::set_resident_blocks`) and whether it shares its GPU
        // (`Kernels::set_shared_gpu`).
        let (mine, loaded) = match loaded {
            Ok(k) => {
                let sms = k.as_ref().map_or(0, |k| k.resident_blocks());
                let resident = if pes_per_gpu > 1 { sms - sms / 8 } else { sms };
                let mut word = vec![k.is_some() as u8];
                word.extend((resident as u32).to_le_bytes());
                word.push((pes_per_gpu > 1) as u8);
                (Ok(word), k)
            }
            Err(e) => (Err(e), None),
        };
        let usable = boot.agree_ok(mine, "loading the device kernels")?;
        // Every PE runs the kernels, or none does, with the same grids.
        let resident = usable.iter().filter_map(|u| Some(u32::from_le_bytes(u.get(1..5)?.try_into().ok()?))).min();
        let shared = usable.iter().any(|u| u.get(5) == Some(&1));
        world.kernels = loaded.filter(|_| usable.iter().all(|u| u.first() == Some(&1))).map(|mut k| {
            k.set_resident_blocks(resident.unwrap_or(1) as usize);
            if shared {
                k.set_shared_gpu();
            }
            k
        });
        Ok(world)
    }

    /// Symmetric address of byte `offset` of the heap.
    pub(crate) fn addr(&self, offset: usize) -> u64 {
        self.heap_base + offset as u64
    }

    /// A new stream on this PE's GPU.
    pub(crate) fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.cuda.bind_to_thread().cuda("cuCtxSetCurrent")?;
        self.cuda.new_stream().cuda("cuStreamCreate")
    }

    /// Frees the heap and finalizes NVSHMEM.
    ///
    /// # Collective
    pub(crate) fn finalize(&self) -> Result<()> {
        self.cuda.bind_to_thread().cuda("cuCtxSetCurrent")?;
        // SAFETY: collective, after a barrier of every PE; nothing uses the
        // heap afterwards (buffers refuse, the context being finalized).
        unsafe {
            call!(self.nv, nvshmem_free(self.heap_base as _));
            call!(self.nv, nvshmemx_hostlib_finalize());
        }
        Ok(())
    }
}

/// The same failure again, for a second use (errors are not `Clone`).
fn clone_err(e: &Error) -> Error {
    match e {
        Error::BackendUnavailable(m) => Error::BackendUnavailable(m.clone()),
        e => Error::BackendUnavailable(e.to_string()),
    }
}

/// NVSHMEM's default `NVSHMEM_REDUCE_SCRATCH_SIZE`.
const NVSHMEM_REDUCE_SCRATCH_DEFAULT: usize = 512 << 10;

/// The reduce scratch NVSHMEM gives each team, from the value of
/// `NVSHMEM_REDUCE_SCRATCH_SIZE` (bytes, with an optional `k`, `m` or `g`
/// suffix of powers of 1024, as NVSHMEM reads its sizes): its default
/// where unset or unreadable. NVSHMEM 3.4's on-stream reduce-scatter
/// (NVLink multicast off) puts every member's whole block into one half
/// of it, and past that half writes beyond the scratch, into the state of
/// the team's other collectives and the next team's (its check is an
/// assertion, which its release builds leave out): shmem refuses such
/// calls ([`crate::CollImpl::Nvshmem`]).
pub(crate) fn nvshmem_reduce_scratch(value: Option<&str>) -> usize {
    let parse = |v: &str| -> Option<usize> {
        let v = v.trim();
        let (digits, shift) = match v.chars().last()?.to_ascii_lowercase() {
            'k' => (&v[..v.len() - 1], 10),
            'm' => (&v[..v.len() - 1], 20),
            'g' => (&v[..v.len() - 1], 30),
            _ => (v, 0),
        };
        digits.parse::<usize>().ok()?.checked_mul(1 << shift)
    };
    value.and_then(parse).unwrap_or(NVSHMEM_REDUCE_SCRATCH_DEFAULT)
}

fn set_default_env(key: &str, value: &str) {
    if std::env::var_os(key).is_none() {
        std::env::set_var(key, value);
    }
}

fn library_version(nv: &Nv) -> Result<(i32, i32, i32)> {
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    // SAFETY: writes three ints; callable before init.
    unsafe { call!(nv, nvshmemx_vendor_get_version_info(&mut major, &mut minor, &mut patch)) };
    shmem_sys::InitAttrLayout::for_version(major, minor).map_err(|e| Error::BackendUnavailable(e.to_string()))?;
    Ok((major, minor, patch))
}

fn unique_id(nv: &Nv) -> Result<Vec<u8>> {
    let mut uid = shmem_sys::NVSHMEMX_UNIQUEID_INITIALIZER;
    // SAFETY: writes the id; callable before init.
    let rc = unsafe { call!(nv, nvshmemx_get_uniqueid(&mut uid)) };
    if rc != 0 {
        return Err(Error::Nvshmem { call: "nvshmemx_get_uniqueid", code: rc });
    }
    // SAFETY: the id is plain bytes of its size.
    Ok(unsafe {
        std::slice::from_raw_parts((&uid as *const shmem_sys::nvshmemx_uniqueid_t).cast::<u8>(), size_of_val(&uid))
    }
    .to_vec())
}

fn init_with_unique_id(
    nv: &Nv,
    version: (i32, i32, i32),
    uid: &[u8],
    me: usize,
    n: usize,
    device: usize,
) -> Result<()> {
    let mut id = shmem_sys::NVSHMEMX_UNIQUEID_INITIALIZER;
    if uid.len() != size_of_val(&id) {
        return Err(Error::bootstrap(format!(
            "NVSHMEM unique id of {} bytes, expected {}",
            uid.len(),
            size_of_val(&id)
        )));
    }
    // SAFETY: same size, plain bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            uid.as_ptr(),
            (&mut id as *mut shmem_sys::nvshmemx_uniqueid_t).cast::<u8>(),
            uid.len(),
        )
    };
    let layout = shmem_sys::InitAttrLayout::for_version(version.0, version.1)
        .map_err(|e| Error::BackendUnavailable(e.to_string()))?;
    let mut attr = shmem_sys::InitAttr::new(layout);
    attr.set_uniqueid_args(me as i32, n as i32, &id);
    if let Some(dev) = attr.cuda_device_id_mut() {
        *dev = device as i32;
    }
    // SAFETY: `attr` is laid out for this library's version and points at
    // `id`, which outlives the call; this PE's device is current.
    let rc = unsafe {
        call!(nv, nvshmemx_hostlib_init_attr(shmem_sys::NVSHMEMX_INIT_WITH_UNIQUEID as _, attr.as_mut_ptr()))
    };
    check("nvshmemx_hostlib_init_attr", rc)
}

/// # Safety
/// NVSHMEM is initialised; collective.
unsafe fn symmetric_malloc(nv: &Nv, bytes: usize) -> Result<u64> {
    // SAFETY: the caller's contract.
    Ok(unsafe { call!(nv, nvshmem_malloc(bytes)) } as u64)
}

/// # Safety
/// `addr` is symmetric; `pe` is in range.
unsafe fn peer_ptr(nv: &Nv, addr: u64, pe: usize) -> Result<u64> {
    // SAFETY: the caller's contract.
    Ok(unsafe { call!(nv, nvshmem_ptr(addr as _, pe as i32)) } as u64)
}

/// Host-initiated operations on this PE's stream (the caller's, or the
/// context's own when the caller passed a host stream).
impl GpuWorld {
    /// This PE's cuBLAS state, made on first use.
    pub(crate) fn blas(&self) -> Result<std::sync::MutexGuard<'_, Option<blas::Blas>>> {
        let mut guard = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            *guard = Some(blas::Blas::new(self)?);
        }
        Ok(guard)
    }

    /// The context's own stream.
    pub(crate) fn own_stream(&self) -> &Arc<CudaStream> {
        &self.own
    }

    /// The CUDA stream operations on `s` are issued on.
    /// `s` is the public stream's ([`crate::Stream::cuda_stream`]).
    pub(crate) fn stream<'a>(&'a self, s: Option<&'a Arc<CudaStream>>) -> &'a CudaStream {
        s.map_or(&self.own, |s| s)
    }

    /// Copies `data` to device address `dst`; returns when done.
    pub(crate) fn htod<T: crate::Element>(&self, dst: u64, data: &[T], s: &CudaStream) -> Result<()> {
        self.cuda.bind_to_thread().cuda("cuCtxSetCurrent")?;
        // SAFETY: `dst` is a checked region of `data.len()` elements of the
        // heap; the copy completes (synchronize) before `data` is released.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, data, s.cu_stream()) }.cuda("cuMemcpyHtoDAsync")?;
        s.synchronize().cuda("cuStreamSynchronize")
    }

    /// Copies device address `src` into `out`; returns when done.
    pub(crate) fn dtoh<T: crate::Element>(&self, out: &mut [T], src: u64, s: &CudaStream) -> Result<()> {
        self.cuda.bind_to_thread().cuda("cuCtxSetCurrent")?;
        // SAFETY: as in `htod`.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(out, src, s.cu_stream()) }.cuda("cuMemcpyDtoHAsync")?;
        s.synchronize().cuda("cuStreamSynchronize")
    }

    /// The kernels' counts of traffic with other nodes' PEs
    /// (`NetCounters` of `abi.cuh`), all 0 without the kernels. The caller
    /// has synchronised the streams whose kernels it wants counted.
    pub(crate) fn device_net(&self) -> Result<crate::traffic::NetTraffic> {
        let Some(k) = &self.kernels else { return Ok(Default::default()) };
        let mut words = [0u64; abi::NET_COUNTER_WORDS];
        self.dtoh(&mut words, self.addr(k.layout.net()), &self.own)?;
        Ok(crate::traffic::NetTraffic::from_words(words))
    }

    /// Zeroes `bytes` bytes at `dst`; returns when done.
    pub(crate) fn zero(&self, dst: u64, bytes: usize, s: &CudaStream) -> Result<()> {
        self.cuda.bind_to_thread().cuda("cuCtxSetCurrent")?;
        // SAFETY: a checked region of the heap.
        unsafe { cudarc::driver::result::memset_d8_async(dst, 0, bytes, s.cu_stream()) }.cuda("cuMemsetD8Async")?;
        s.synchronize().cuda("cuStreamSynchronize")
    }

    /// `nvshmemx_putmem_on_stream` (or getmem with `put == false`).
    pub(crate) fn transfer(
        &self,
        put: bool,
        dst: u64,
        src: u64,
        bytes: usize,
        pe: usize,
        s: &CudaStream,
    ) -> Result<()> {
        let st = s.cu_stream();
        // SAFETY: symmetric addresses of checked regions; `pe` in range.
        unsafe {
            if put {
                call!(self.nv, nvshmemx_putmem_on_stream(dst as _, src as _, bytes, pe as i32, st as _));
            } else {
                call!(self.nv, nvshmemx_getmem_on_stream(dst as _, src as _, bytes, pe as i32, st as _));
            }
        }
        Ok(())
    }

    /// `nvshmemx_putmem_signal_on_stream`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_signal(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        sig: u64,
        value: u64,
        add: bool,
        pe: usize,
        s: &CudaStream,
    ) -> Result<()> {
        let op = if add { SIGNAL_ADD } else { SIGNAL_SET };
        // SAFETY: symmetric addresses of checked regions; `pe` in range.
        unsafe {
            call!(
                self.nv,
                nvshmemx_putmem_signal_on_stream(
                    dst as _,
                    src as _,
                    bytes,
                    sig as _,
                    value,
                    op,
                    pe as i32,
                    s.cu_stream() as _
                )
            )
        };
        Ok(())
    }

    /// `nvshmemx_signal_op_on_stream`.
    pub(crate) fn signal_op(&self, sig: u64, value: u64, add: bool, pe: usize, s: &CudaStream) -> Result<()> {
        let op = if add { SIGNAL_ADD } else { SIGNAL_SET };
        // SAFETY: a symmetric address of a checked element; `pe` in range.
        unsafe { call!(self.nv, nvshmemx_signal_op_on_stream(sig as _, value, op, pe as i32, s.cu_stream() as _)) };
        Ok(())
    }

    /// `nvshmemx_quiet_on_stream`.
    pub(crate) fn quiet(&self, s: &CudaStream) -> Result<()> {
        // SAFETY: NVSHMEM is initialised.
        unsafe { call!(self.nv, nvshmemx_quiet_on_stream(s.cu_stream() as _)) };
        Ok(())
    }

    /// `nvshmemx_barrier_on_stream` over an NVSHMEM team.
    pub(crate) fn barrier(&self, team: i32, s: &CudaStream) -> Result<()> {
        // SAFETY: `team` is a live NVSHMEM team of this PE.
        let rc = unsafe { call!(self.nv, nvshmemx_barrier_on_stream(team, s.cu_stream() as _)) };
        check("nvshmemx_barrier_on_stream", rc)
    }
}

/// Teams and collectives.
impl GpuWorld {
    /// `nvshmem_team_split_strided`; `TEAM_INVALID` on non-members.
    ///
    /// # Collective
    /// Over `parent`.
    pub(crate) fn split_team(&self, parent: i32, start: usize, stride: usize, size: usize) -> Result<i32> {
        let mut team = TEAM_INVALID;
        // SAFETY: `parent` is a live team of this PE; the arguments were
        // checked and agreed by every member; no configuration is passed.
        let rc = unsafe {
            call!(
                self.nv,
                nvshmem_team_split_strided(
                    parent,
                    start as i32,
                    stride as i32,
                    size as i32,
                    std::ptr::null(),
                    0,
                    &mut team
                )
            )
        };
        check("nvshmem_team_split_strided", rc).map(|_| team)
    }

    /// NVSHMEM's team of this PE's node (see [`GpuWorld::node_team`]).
    /// NVSHMEM's own node team is the machine's PEs, which is not the node
    /// where one machine is split into emulated nodes.
    ///
    /// # Collective
    /// Over the world.
    fn split_node_team(&self, topo: &Topology) -> Result<i32> {
        if topo.nodes.len() == 1 {
            return Ok(TEAM_NODE);
        }
        if !topo.nodes_contiguous() {
            return Ok(TEAM_INVALID);
        }
        // One split per node, in the same order on every PE; each PE keeps
        // its own node's.
        let mut mine = TEAM_INVALID;
        for (k, members) in topo.nodes.iter().enumerate() {
            let team = self.split_team(TEAM_WORLD, members[0], 1, members.len())?;
            if k == topo.my_node {
                mine = team;
            }
        }
        Ok(mine)
    }

    /// `nvshmem_team_destroy` of a team this PE split.
    pub(crate) fn destroy_team(&self, team: i32) -> Result<()> {
        if team > TEAM_NODE {
            // SAFETY: a team made by `split_team`, destroyed once.
            unsafe { call!(self.nv, nvshmem_team_destroy(team)) };
        }
        Ok(())
    }

    /// Copies `bytes` bytes between device addresses on `s`.
    pub(crate) fn copy(&self, dst: u64, src: u64, bytes: usize, s: &CudaStream) -> Result<()> {
        // SAFETY: both are checked regions of the heap.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, s.cu_stream()) }.cuda("cuMemcpyDtoDAsync")
    }
}

/// Whether `s` is being captured into a CUDA graph.
pub(crate) fn capturing(s: &CudaStream) -> bool {
    use cudarc::driver::sys::CUstreamCaptureStatus;
    s.capture_status().is_ok_and(|st| st == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
}

/// An NVSHMEM status code as a result.
pub(crate) fn check(call: &'static str, rc: i32) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Nvshmem { call, code: rc })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvshmem_reduce_scratch_reads_bytes_and_suffixes() {
        assert_eq!(nvshmem_reduce_scratch(None), 512 << 10);
        assert_eq!(nvshmem_reduce_scratch(Some("67108864")), 64 << 20);
        assert_eq!(nvshmem_reduce_scratch(Some("2m")), 2 << 20);
        assert_eq!(nvshmem_reduce_scratch(Some(" 1G ")), 1 << 30);
        assert_eq!(nvshmem_reduce_scratch(Some("768K")), 768 << 10);
        assert_eq!(nvshmem_reduce_scratch(Some("lots")), 512 << 10, "unreadable: NVSHMEM's default");
        assert_eq!(nvshmem_reduce_scratch(Some("")), 512 << 10);
    }
}
