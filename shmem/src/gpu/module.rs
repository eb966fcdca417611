//! The cubin of shmem's kernels (`../kernels/*.cu`), built by `build.rs`
//! and embedded here: loaded with `cuModuleLoadData`, registered with
//! `nvshmemx_cumodule_init`, its functions looked up on first launch into a
//! table indexed by [`KernelId`], and launched.

use super::abi::THREADS;
use super::kernel_id::KernelId;
use super::{check, CUstream, CudaCall, GpuWorld, Nv};
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUfunction, CUmodule};
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

#[cfg(shmem_kernels)]
pub(super) const CUBIN: Option<&[u8]> = Some(include_bytes!(env!("SHMEM_KERNELS_CUBIN")));
#[cfg(not(shmem_kernels))]
pub(super) const CUBIN: Option<&[u8]> = None;
#[cfg(shmem_kernels)]
const BUILT_WITH: &str = env!("SHMEM_KERNELS_NVSHMEM_VERSION");
#[cfg(not(shmem_kernels))]
const BUILT_WITH: &str = "";

/// Why the kernels are missing from this build, and how to build them.
pub(crate) fn not_built() -> Error {
    Error::BackendUnavailable(
        "shmem was built without its device kernels: run `eval \"$(bash ci/gpu-toolchain.sh)\"` (or set NVCC/CUDA_HOME \
         and NVSHMEM_HOME) and rebuild"
            .into(),
    )
}

/// A launch's blocks and threads a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Grid {
    pub(super) blocks: usize,
    pub(super) threads: u32,
}

impl Grid {
    /// `blocks` blocks of [`THREADS`].
    pub(super) fn of(blocks: usize) -> Grid {
        Grid { blocks, threads: THREADS }
    }
}

/// The loaded cubin and the functions looked up so far.
pub(super) struct Module {
    module: CUmodule,
    /// `CUfunction`s by [`KernelId::index`]; 0 until first looked up.
    functions: Box<[AtomicUsize]>,
}

impl Module {
    /// Loads the cubin into this PE's context and registers it with
    /// NVSHMEM (initialised).
    pub(super) fn load(g: &GpuWorld) -> Result<Module> {
        let cubin = CUBIN.ok_or_else(not_built)?;
        let (a, b, c) = g.version;
        let runtime = format!("{a}.{b}.{c}");
        if BUILT_WITH != runtime {
            return Err(Error::BackendUnavailable(format!(
                "the kernels were linked with NVSHMEM {BUILT_WITH}'s device library, but the host library is {runtime}: \
                 rebuild against {runtime}"
            )));
        }
        g.cuda.bind_to_thread().cuda("cuCtxSetCurrent")?;
        // cuModuleLoadData wants the image aligned; copy it into an owned,
        // 8-byte aligned buffer.
        let mut image = vec![0u64; cubin.len().div_ceil(8)];
        // SAFETY: `image` holds at least cubin.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(cubin.as_ptr(), image.as_mut_ptr().cast::<u8>(), cubin.len()) };
        // SAFETY: a complete, linked cubin (or fat binary of cubins) built for
        // this crate's architectures.
        let module =
            unsafe { cudarc::driver::result::module::load_data(image.as_ptr().cast()) }.cuda("cuModuleLoadData")?;
        // SAFETY: a module loaded in this PE's context, NVSHMEM initialised.
        let rc = unsafe { cumodule_init(g.nv, module) }?;
        check("nvshmemx_cumodule_init", rc)?;
        let functions = (0..KernelId::COUNT).map(|_| AtomicUsize::new(0)).collect();
        Ok(Module { module, functions })
    }

    /// Stores `value` in the module's 8-byte global variable `name` (a
    /// pointer, say), synchronously (`cuMemcpyHtoD`), as the module loads.
    pub(super) fn set_global_u64(&self, name: &str, value: u64) -> Result<()> {
        let cname = CString::new(name).expect("global names have no NUL");
        let (mut ptr, mut bytes) = (0, 0);
        // SAFETY: the module is loaded; the out-pointers are valid.
        unsafe { sys::cuModuleGetGlobal_v2(&mut ptr, &mut bytes, self.module, cname.as_ptr()) }
            .result()
            .cuda("cuModuleGetGlobal")?;
        if bytes != 8 {
            return Err(Error::BackendUnavailable(format!("the kernels' global {name} has {bytes} bytes, expected 8")));
        }
        // SAFETY: `ptr` is the global's 8 bytes of device memory.
        unsafe { sys::cuMemcpyHtoD_v2(ptr, (&raw const value).cast(), 8) }.result().cuda("cuMemcpyHtoD")
    }

    /// The kernel's function, looked up on its first use.
    fn function(&self, id: KernelId) -> Result<CUfunction> {
        let slot = &self.functions[id.index()];
        // Acquire: pairs with the Release below. A handle is the same
        // whichever thread looks it up first, so two may race to store it.
        let f = slot.load(Ordering::Acquire);
        if f != 0 {
            return Ok(f as CUfunction);
        }
        let name = CString::new(id.symbol()).expect("kernel names have no NUL");
        // SAFETY: the module is loaded; the name is a C string.
        let f =
            unsafe { cudarc::driver::result::module::get_function(self.module, name) }.cuda("cuModuleGetFunction")?;
        slot.store(f as usize, Ordering::Release);
        Ok(f)
    }

    /// Launches `id` on `grid` with `shared` bytes of dynamic shared
    /// memory; the kernels that follow the stream
    /// ([`KernelId::follows_stream`]) by programmatic dependent launch.
    ///
    /// # Safety
    /// `params` point at values of the kernel's parameter types; the
    /// launch's reads and writes are the caller's to allow.
    pub(super) unsafe fn launch(
        &self,
        id: KernelId,
        grid: Grid,
        shared: u32,
        stream: CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self.function(id)?;
        let blocks = grid.blocks as u32;
        if id.follows_stream() {
            // SAFETY: a plain C struct, all zeros a valid value.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: blocks,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: grid.threads,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: shared,
                hStream: stream,
                attrs: &raw mut attr,
                numAttrs: 1,
            };
            // SAFETY: the caller's contract; `config` and `attr` outlive the call.
            return unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }
                .result()
                .cuda("cuLaunchKernelEx");
        }
        // SAFETY: the caller's contract.
        unsafe {
            cudarc::driver::result::launch_kernel(f, (blocks, 1, 1), (grid.threads, 1, 1), shared, stream, params)
        }
        .cuda("cuLaunchKernel")
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
    /// The most stack a kernel of a fixed-size team may take: a kernel
    /// that takes its `TeamSync` parameter's address (a reference to it
    /// passed to an out-of-line function) copies all 160 bytes of it to
    /// its stack in every thread at its start, which cost the
    /// low-latency collectives up to a third of their time.
    #[cfg(shmem_kernels)]
    const MOST_STACK: u64 = 64;

    /// Kernels whose stack holds per-peer arrays by design: those for a
    /// team of any size (`_0`) and the node-aware reductions.
    #[cfg(shmem_kernels)]
    fn may_take_more(name: &str) -> bool {
        name.ends_with("_0") || name.contains("_nodes_") || name.contains("_grouped_")
    }

    #[test]
    fn kernels_keep_their_parameters_off_the_stack() {
        #[cfg(not(shmem_kernels))]
        eprintln!("skipped: this build has no device kernels (nvcc and NVSHMEM were not found when it was built)");
        #[cfg(shmem_kernels)]
        {
            let report = include_str!(env!("SHMEM_KERNELS_STACK_FRAMES"));
            let frames: Vec<(&str, &str, u64)> = report
                .lines()
                .map(|l| {
                    let f: Vec<&str> = l.split(' ').collect();
                    (f[0], f[1], f[2].parse().expect("a byte count"))
                })
                .collect();
            // Every kernel of the cubin is in the report.
            for name in ["shmem_allreduce_ll_bf16_sum", "shmem_allgather_ll", "shmem_a2av_lines_v", "shmem_moe_route"] {
                assert!(frames.iter().any(|f| f.1 == name), "{name} is missing from ptxas's report");
            }
            let over: Vec<String> = frames
                .iter()
                .filter(|(_, name, bytes)| *bytes > MOST_STACK && !may_take_more(name))
                .map(|(arch, name, bytes)| format!("{name} ({arch}): {bytes} bytes"))
                .collect();
            assert!(over.is_empty(), "kernels with more than {MOST_STACK} bytes of stack: {over:?}");
        }
    }
}
