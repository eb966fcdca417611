//! shmem's own device-initiated kernels (`../kernels/*.cu`), built by
//! `build.rs` into one cubin embedded here, loaded with `cuModuleLoadData`
//! and registered with `nvshmemx_cumodule_init`.

use super::{check, CUstream, GpuWorld, Nv};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use cudarc::driver::sys::{CUfunction, CUmodule};
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

/// Blocks a collective kernel uses at most (signal-pad channels), as in `common.cuh`.
pub(crate) const MAX_BLOCKS: usize = 32;

/// Why the kernels are missing from this build, and how to build them.
pub(crate) fn not_built() -> Error {
    Error::BackendUnavailable(
        "shmem was built without its device kernels: run `eval \"$(bash ci/gpu-toolchain.sh)\"` (or set NVCC/CUDA_HOME \
         and NVSHMEM_HOME) and rebuild"
            .into(),
    )
}

/// Threads of a block of the collective kernels.
const THREADS: u32 = 512;

/// Largest all-reduce (bytes per PE) the one-shot kernel takes; above it
/// NVSHMEM's collective is faster until the two-shot kernel exists.
pub(crate) const ONE_SHOT_MAX_BYTES: usize = 1 << 20;

/// Bytes of a team's synchronisation state: signal pads and epoch counters.
pub(crate) fn sync_bytes(n: usize) -> usize {
    (MAX_BLOCKS * n + MAX_BLOCKS) * size_of::<u32>()
}

/// `shmem::TeamSync` of `common.cuh`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct TeamSync {
    peer_heap: u64,
    sync_offset: u64,
    rank: i32,
    n: i32,
}

/// The loaded module.
pub(crate) struct Kernels {
    module: CUmodule,
    functions: Mutex<HashMap<String, usize>>,
    /// Device array of every PE's heap base (all NVLink-reachable); the
    /// kernels' `TeamSync` points into it.
    _peer_heap: cudarc::driver::CudaSlice<u64>,
    /// The world team's synchronisation state.
    pub(crate) world: TeamSync,
}

// SAFETY: CUDA module and function handles may be used from any thread of
// the context; the map is behind a mutex.
unsafe impl Send for Kernels {}
// SAFETY: as above.
unsafe impl Sync for Kernels {}

impl Kernels {
    /// Loads the cubin, registers it with NVSHMEM and checks that it sees
    /// this PE. `sync_offset` is the heap offset of the world's zeroed
    /// synchronisation state. `Ok(None)` when some peer has no NVLink
    /// address (the kernels' NVLink path needs one for every peer).
    pub(crate) fn load(g: &GpuWorld, me: usize, n: usize, sync_offset: usize) -> Result<Option<Kernels>> {
        let cubin = CUBIN.ok_or_else(not_built)?;
        let (a, b, c) = g.version;
        let runtime = format!("{a}.{b}.{c}");
        if BUILT_WITH != runtime {
            return Err(Error::BackendUnavailable(format!(
                "the kernels were linked with NVSHMEM {BUILT_WITH}'s device library, but the host library is {runtime}: \
                 rebuild against {runtime}"
            )));
        }
        let bases: Option<Vec<u64>> = g.peer_base.iter().copied().collect();
        let Some(bases) = bases else { return Ok(None) };
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
        let s = g.own_stream();
        let peer_heap = s.clone_htod(&bases)?;
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(&peer_heap, s);
        let world = TeamSync { peer_heap: ptr, sync_offset: sync_offset as u64, rank: me as i32, n: n as i32 };
        drop(_sync);
        let k = Kernels { module, functions: Mutex::new(HashMap::new()), _peer_heap: peer_heap, world };
        k.selfcheck(g, me, n)?;
        Ok(Some(k))
    }

    fn function(&self, name: &str) -> Result<CUfunction> {
        let mut map = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&f) = map.get(name) {
            return Ok(f as CUfunction);
        }
        let cname = CString::new(name).expect("kernel names have no NUL");
        // SAFETY: the module is loaded; the name is a C string.
        let f = unsafe { cudarc::driver::result::module::get_function(self.module, cname) }
            .map_err(|e| Error::Cuda(format!("kernel {name}: {e:?}")))?;
        map.insert(name.to_owned(), f as usize);
        Ok(f)
    }

    /// # Safety
    /// `params` point at values of the kernel's parameter types.
    unsafe fn launch(
        &self,
        name: &str,
        blocks: u32,
        threads: u32,
        stream: CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self.function(name)?;
        // SAFETY: the caller's contract.
        unsafe { cudarc::driver::result::launch_kernel(f, (blocks, 1, 1), (threads, 1, 1), 0, stream, params) }?;
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

    /// Whether the one-shot all-reduce kernel exists for `dtype` and `op`.
    pub(crate) fn has_all_reduce(dtype: DType, op: ReduceOp) -> bool {
        match op {
            ReduceOp::Sum | ReduceOp::Min | ReduceOp::Max => true,
            ReduceOp::Prod => matches!(dtype, DType::F32 | DType::F16 | DType::BF16),
            _ => false,
        }
    }

    /// One-shot all-reduce of `count` elements over the world: this PE's
    /// `dst` (device address) from every PE's source at heap `src_offset`.
    pub(crate) fn all_reduce(
        &self,
        dtype: DType,
        op: ReduceOp,
        dst: u64,
        src_offset: usize,
        count: usize,
        stream: CUstream,
    ) -> Result<()> {
        let name = format!("shmem_allreduce_oneshot_{}_{}", dtype.name(), op.name());
        let vectors = (count * dtype.size()).div_ceil(16);
        let blocks = vectors.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32;
        let mut t = self.world;
        let (mut dst, mut off, mut count) = (dst, src_offset as u64, count as u64);
        let mut params: [*mut c_void; 4] =
            [(&raw mut t).cast(), (&raw mut dst).cast(), (&raw mut off).cast(), (&raw mut count).cast()];
        // SAFETY: (TeamSync, T*, u64, u64) as the kernel declares.
        unsafe { self.launch(&name, blocks, THREADS, stream, &mut params) }
    }
}

impl Kernels {
    /// One-shot all-gather over the world: block `p` of this PE's
    /// destination (heap `dst_offset`) from PE `p`'s source (heap
    /// `src_offset`, or block `p` of PE `p`'s destination when `in_place`).
    pub(crate) fn all_gather(
        &self,
        dst_offset: usize,
        src_offset: usize,
        bytes: usize,
        in_place: bool,
        stream: CUstream,
    ) -> Result<()> {
        let blocks =
            (bytes * self.world.n as usize).div_ceil(16).div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32;
        let mut t = self.world;
        let (mut dst, mut src, mut bytes, mut in_place) =
            (dst_offset as u64, src_offset as u64, bytes as u64, in_place as i32);
        let mut params: [*mut c_void; 5] = [
            (&raw mut t).cast(),
            (&raw mut dst).cast(),
            (&raw mut src).cast(),
            (&raw mut bytes).cast(),
            (&raw mut in_place).cast(),
        ];
        // SAFETY: (TeamSync, u64, u64, u64, int) as the kernel declares.
        unsafe { self.launch("shmem_allgather_oneshot", blocks, THREADS, stream, &mut params) }
    }
}

/// # Safety
/// `module` is loaded in the current context; NVSHMEM is initialised.
unsafe fn cumodule_init(nv: &Nv, module: CUmodule) -> Result<i32> {
    // SAFETY: the caller's contract.
    Ok(unsafe { call!(nv, nvshmemx_cumodule_init(module as _)) })
}
