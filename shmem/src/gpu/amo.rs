//! Host-initiated atomics on the GPU backend.
//!
//! NVSHMEM 3.4's host atomics are stubs ("not implemented" at run time), so
//! a one-thread kernel performs the atomic and returns the old value: on a
//! peer with an NVLink address, with system-scope atomics at that address
//! (compiled once with NVRTC, so that it needs no device kernels); on
//! another node's peer, with NVSHMEM's device atomics (`shmem_amo` of the
//! device kernels).

use super::{CudaCall, GpuWorld};
use crate::dtype::{AtomicElement, AtomicOp};
use crate::error::{Error, Result};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::CompileError;
use std::sync::Mutex;

const SOURCE: &str = r#"
#define AMO(NAME, T)                                                              \
extern "C" __global__ void NAME(T *p, int op, T a, T b, T *old) {                \
    T v;                                                                          \
    switch (op) {                                                                 \
    case 0: v = atomicOr_system(p, (T)0); break;                                  \
    case 1: v = atomicExch_system(p, a); break;                                   \
    case 2: v = atomicCAS_system(p, a, b); break;                                 \
    case 3: v = atomicAdd_system(p, a); break;                                    \
    case 4: v = atomicAnd_system(p, a); break;                                    \
    case 5: v = atomicOr_system(p, a); break;                                     \
    default: v = atomicXor_system(p, a); break;                                   \
    }                                                                             \
    *old = v;                                                                     \
    __threadfence_system();                                                       \
}
AMO(amo32, unsigned int)
AMO(amo64, unsigned long long)
"#;

/// The compiled kernels and the word the old value comes back in.
pub(crate) struct Amo {
    amo32: CudaFunction,
    amo64: CudaFunction,
    old: Mutex<CudaSlice<u64>>,
}

impl Amo {
    fn build(g: &GpuWorld) -> Result<Amo> {
        let ptx = cudarc::nvrtc::compile_ptx(SOURCE).map_err(nvrtc_error)?;
        let module = g.cuda.load_module(ptx).cuda("CudaContext::load_module")?;
        let old = g.own_stream().alloc_zeros::<u64>(1).cuda("CudaStream::alloc_zeros")?;
        Ok(Amo {
            amo32: module.load_function("amo32").cuda("cuModuleGetFunction")?,
            amo64: module.load_function("amo64").cuda("cuModuleGetFunction")?,
            old: Mutex::new(old),
        })
    }
}

/// NVRTC's failure as the crate's error: the step that failed, its code,
/// and the compiler's log where it wrote one.
pub(crate) fn nvrtc_error(e: CompileError) -> Error {
    let (call, code, log) = match e {
        CompileError::CreationError(e) => ("nvrtcCreateProgram", e.0, String::new()),
        CompileError::CompileError { nvrtc, log, .. } => {
            ("nvrtcCompileProgram", nvrtc.0, log.to_string_lossy().into_owned())
        }
        CompileError::GetLogError(e) => ("nvrtcGetProgramLog", e.0, String::new()),
        CompileError::GetPtxError(e) => ("nvrtcGetPTX", e.0, String::new()),
        CompileError::DestroyError(e) => ("nvrtcDestroyProgram", e.0, String::new()),
    };
    Error::Nvrtc { call, code, log }
}

/// The build's failure again, for a later call (errors are not `Clone`).
fn again(e: &Error) -> Error {
    match e {
        Error::Cuda(c) => Error::Cuda(*c),
        Error::Nvrtc { call, code, log } => Error::Nvrtc { call, code: *code, log: log.clone() },
        e => Error::BackendUnavailable(e.to_string()),
    }
}

impl GpuWorld {
    /// Performs `op` on `pe`'s element at heap byte `offset`; returns the old value.
    pub(crate) fn atomic<T: AtomicElement>(
        &self,
        offset: usize,
        op: AtomicOp<T>,
        pe: usize,
        s: &CudaStream,
    ) -> Result<T> {
        let base = self.peer_base[pe];
        let amo = self.amo.get_or_init(|| Amo::build(self)).as_ref().map_err(again)?;
        let bits = |v: T| -> u64 {
            // SAFETY: T is a 4- or 8-byte integer (AtomicElement); the
            // kernel sees the same bits as an unsigned integer.
            unsafe {
                if size_of::<T>() == 4 {
                    std::mem::transmute_copy::<T, u32>(&v) as u64
                } else {
                    std::mem::transmute_copy::<T, u64>(&v)
                }
            }
        };
        let (code, a, b): (i32, u64, u64) = match op {
            AtomicOp::Fetch => (0, 0, 0),
            AtomicOp::Set(v) | AtomicOp::Swap(v) => (1, bits(v), 0),
            AtomicOp::CompareSwap { current, new } => (2, bits(current), bits(new)),
            AtomicOp::FetchAdd(v) => (3, bits(v), 0),
            AtomicOp::FetchAnd(v) => (4, bits(v), 0),
            AtomicOp::FetchOr(v) => (5, bits(v), 0),
            AtomicOp::FetchXor(v) => (6, bits(v), 0),
        };
        let mut old = amo.old.lock().unwrap_or_else(|e| e.into_inner());
        // After the caller's work; the kernel and the copy back run on the
        // context's own stream, which the caller's work cannot overtake.
        s.synchronize().cuda("cuStreamSynchronize")?;
        let s = self.own_stream();
        let bytes = size_of::<T>();
        match base {
            Some(base) => {
                let target = base + offset as u64;
                let f = if bytes == 4 { &amo.amo32 } else { &amo.amo64 };
                let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
                let mut launch = s.launch_builder(f);
                launch.arg(&target).arg(&code);
                let (a32, b32) = (a as u32, b as u32);
                if bytes == 4 {
                    launch.arg(&a32).arg(&b32);
                } else {
                    launch.arg(&a).arg(&b);
                }
                // SAFETY: `target` is an aligned element of `pe`'s heap
                // mapped in this context (nvshmem_ptr); the arguments match
                // the kernel's parameters.
                unsafe { launch.arg(&mut *old).launch(cfg) }.cuda("cuLaunchKernel")?;
            }
            None => {
                let k = self.kernels.as_ref().ok_or_else(|| {
                    Error::BackendUnavailable(format!(
                        "host-initiated atomics on PE {pe}, which has no NVLink address, need the device kernels \
                         (NVSHMEM 3.4 has no host atomics): build them with nvcc and NVSHMEM (see README)"
                    ))
                })?;
                let (out, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut *old, s);
                k.amo(self.addr(offset), code, a, b, bytes, pe, out, s.cu_stream())?;
            }
        }
        let mut v = [0u64];
        s.memcpy_dtoh(&*old, &mut v).cuda("cuMemcpyDtoHAsync")?;
        s.synchronize().cuda("cuStreamSynchronize")?;
        // SAFETY: the low bytes hold the old value of T's size (little endian).
        Ok(unsafe { std::mem::transmute_copy::<u64, T>(&v[0]) })
    }
}
