//! cuBLAS for the overlapped matmuls (`crate::overlap`): one handle per
//! PE, a side stream for the communication, and a pool of events that
//! order the two. Loaded at first use: a program that never multiplies
//! needs no cuBLAS.

use super::{CudaCall, GpuWorld};
use crate::dtype::DType;
use crate::error::{Error, Result};
use cudarc::cublas::result::CublasError;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasHandle_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaEvent, CudaStream};
use std::ffi::c_void;
use std::sync::Arc;

/// What the overlapped matmuls keep between calls.
pub(crate) struct Blas {
    handle: cublasHandle_t,
    /// Where the copies beside the GEMMs run.
    pub(crate) comm: Arc<CudaStream>,
    events: Vec<CudaEvent>,
}

// SAFETY: a cuBLAS handle may be used from any thread, one at a time (the
// Mutex in GpuWorld sees to that).
unsafe impl Send for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and used by no one else now.
        let _ = unsafe { cudarc::cublas::result::destroy_handle(self.handle) };
    }
}

impl Blas {
    pub(crate) fn new(g: &GpuWorld) -> Result<Blas> {
        // SAFETY: only asks the loader whether a library exists.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::BackendUnavailable(
                "the overlapped matmuls need cuBLAS (libcublas.so.13), which was not found: add the CUDA \
                 toolkit's lib64 (or the nvidia-cublas wheel's lib) to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        g.cuda.bind_to_thread().cuda("cuCtxSetCurrent")?;
        let handle = cudarc::cublas::result::create_handle().map_err(|e| cublas_error("cublasCreate", e))?;
        let comm = g.new_stream()?;
        Ok(Blas { handle, comm, events: Vec::new() })
    }

    /// At least `n` events, for one call.
    pub(crate) fn events(&mut self, g: &GpuWorld, n: usize) -> Result<&[CudaEvent]> {
        while self.events.len() < n {
            self.events.push(g.cuda.new_event(None).cuda("cuEventCreate")?);
        }
        Ok(&self.events[..n])
    }

    /// `c = a · b` on `s`, row-major: `a` is `rows × k`, `b` is `k × n`,
    /// `c` is `rows × n`, all of `dtype` (f32, f16 or bf16), accumulated in
    /// f32 (no TF32 for f32: cuBLAS's default math mode).
    ///
    /// # Safety
    /// The three addresses hold those many elements on this PE's GPU.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gemm(
        &self,
        dtype: DType,
        a: u64,
        b: u64,
        c: u64,
        rows: usize,
        k: usize,
        n: usize,
        s: &CudaStream,
    ) -> Result<()> {
        if rows == 0 || n == 0 {
            return Ok(());
        }
        let ty = match dtype {
            DType::F32 => cudaDataType::CUDA_R_32F,
            DType::F16 => cudaDataType::CUDA_R_16F,
            DType::BF16 => cudaDataType::CUDA_R_16BF,
            other => return Err(Error::Invalid(format!("matmul of {other}: only f32, f16 and bf16"))),
        };
        let dim = |x: usize, what: &str| {
            i32::try_from(x).map_err(|_| Error::Invalid(format!("matmul: {what} = {x} is more than cuBLAS takes")))
        };
        let (m, nn, kk) = (dim(rows, "rows")?, dim(n, "n")?, dim(k, "k")?);
        // beta = 0 ignores c's old contents (even NaN), so k = 0 gives zeros.
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the handle is ours; the stream is this PE's.
        unsafe { cudarc::cublas::result::set_stream(self.handle, s.cu_stream() as _) }
            .map_err(|e| cublas_error("cublasSetStream", e))?;
        // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS's (m, n, k)
        // are our (n, rows, k), with B first.
        // SAFETY: the caller's contract; leading dimensions as the shapes say.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                self.handle,
                cublasOperation_t::CUBLAS_OP_N,
                cublasOperation_t::CUBLAS_OP_N,
                nn,
                m,
                kk,
                (&raw const alpha).cast::<c_void>(),
                b as *const c_void,
                ty,
                nn,
                a as *const c_void,
                ty,
                kk,
                (&raw const beta).cast::<c_void>(),
                c as *mut c_void,
                ty,
                nn,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| cublas_error("cublasGemmEx", e))
    }
}

/// A failed cuBLAS call as the crate's error.
fn cublas_error(call: &'static str, e: CublasError) -> Error {
    Error::Cublas { call, code: e.0 }
}
