//! The runtime's error type.

use cudarc::cublas::sys::cublasStatus_t;
use cudarc::driver::sys::CUresult;
use cudarc::nvrtc::sys::nvrtcResult;
use std::fmt;

/// What went wrong, as seen by this PE.
///
/// Every misuse of the API is reported as one of these on every PE involved,
/// before anything is written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `init` was called while a context is still alive in this process.
    #[error("shmem is already initialised in this process (drop or finalize the existing Context first)")]
    AlreadyInitialized,
    /// The configuration or environment is not usable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The requested backend cannot run here.
    #[error("backend unavailable: {0}")]
    BackendUnavailable(String),
    /// Starting up or exchanging data with the other PEs failed.
    #[error("bootstrap failed: {0}")]
    Bootstrap(String),
    /// A PE index outside the team.
    #[error("PE {pe} is out of range for a team of {n_pes} PEs")]
    PeOutOfRange { pe: usize, n_pes: usize },
    /// An element range outside a buffer.
    #[error("range {start}..{end} is out of bounds for a symmetric buffer of {len} elements")]
    OutOfBounds { start: usize, end: usize, len: usize },
    /// Source and destination (or a count) do not agree.
    #[error("length mismatch: {0}")]
    LengthMismatch(String),
    /// Arguments that make no sense together (overlapping buffers, a zero size …).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A Mixture-of-Experts routing that [`crate::MoeAllToAll`] refuses:
    /// the fault, and where it lies.
    #[error("bad MoE routing: {detail}")]
    BadRouting { fault: RoutingFault, detail: String },
    /// An element index outside a buffer.
    #[error("index {index} is out of bounds for a symmetric buffer of {len} elements")]
    IndexOutOfBounds { index: usize, len: usize },
    /// A buffer or team that belongs to another (older) context.
    #[error("{0} belongs to another shmem context")]
    Foreign(&'static str),
    /// A buffer or team used after its context was finalized.
    #[error("{0} used after its shmem context was finalized")]
    Finalized(&'static str),
    /// The symmetric heap cannot satisfy an allocation.
    #[error("symmetric heap exhausted: {requested} bytes requested, largest free block is {largest_free} bytes of a {heap_size}-byte heap (raise Config::heap_size or SHMEM_HEAP_SIZE)")]
    HeapExhausted { requested: usize, largest_free: usize, heap_size: usize },
    /// PEs disagree on the arguments of a collective operation.
    #[error("collective mismatch: {0}")]
    CollectiveMismatch(String),
    /// A reduction that the element type does not support.
    #[error("reduction {op} is not defined for {dtype}")]
    UnsupportedOp { op: &'static str, dtype: &'static str },
    /// Too many teams are alive.
    #[error("no free team slot: at most {max} teams may exist at once")]
    TeamsExhausted { max: usize },
    /// A PE died or left while this PE needed it.
    #[error("PE {pe} {what}")]
    PeerLost { pe: usize, what: String },
    /// A wait exceeded its time limit.
    #[error("timed out after {secs:.1} s {what}")]
    Timeout { secs: f64, what: String },
    /// A CUDA driver call failed: the call and the driver's result code.
    #[error("CUDA {0}")]
    Cuda(CudaError),
    /// A cuBLAS call failed.
    #[error("cuBLAS {call} failed: {code:?}")]
    Cublas { call: &'static str, code: cublasStatus_t },
    /// NVRTC failed to compile a kernel: the call, its result code and the
    /// compiler's log (empty when there was none).
    #[error("NVRTC {call} failed: {code:?}{}", on_lines(.log))]
    Nvrtc { call: &'static str, code: nvrtcResult, log: String },
    /// An NVSHMEM call returned an error status.
    #[error("NVSHMEM {call} returned {code}")]
    Nvshmem { call: &'static str, code: i32 },
    /// An operating-system call failed.
    #[error("{call} failed: {source}")]
    Os {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// What is wrong with a routing that [`crate::MoeAllToAll::dispatch`]
/// refuses; the PEs that did not make the mistake learn which one it was
/// (and which PE made it) through their collective mismatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RoutingFault {
    /// A global expert id outside `0..n_pes × experts_per_pe`.
    ExpertOutOfRange,
    /// One expert twice among a token's top-k.
    RepeatedExpert,
    /// More tokens than the configuration's `max_tokens`.
    TooManyTokens,
    /// A routing weight that is NaN or infinite.
    NonFiniteWeight,
}

impl RoutingFault {
    pub(crate) const ALL: [RoutingFault; 4] = [
        RoutingFault::ExpertOutOfRange,
        RoutingFault::RepeatedExpert,
        RoutingFault::TooManyTokens,
        RoutingFault::NonFiniteWeight,
    ];

    /// The fault in a few words.
    pub fn describe(self) -> &'static str {
        match self {
            RoutingFault::ExpertOutOfRange => "an MoE expert id out of range",
            RoutingFault::RepeatedExpert => "an MoE expert repeated in a token's top-k",
            RoutingFault::TooManyTokens => "more MoE tokens than max_tokens",
            RoutingFault::NonFiniteWeight => "an MoE routing weight that is NaN or infinite",
        }
    }
}

/// The result type of every fallible shmem call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn os(call: &'static str) -> Self {
        Error::Os { call, source: std::io::Error::last_os_error() }
    }

    pub(crate) fn config(msg: impl fmt::Display) -> Self {
        Error::Config(msg.to_string())
    }

    pub(crate) fn bootstrap(msg: impl fmt::Display) -> Self {
        Error::Bootstrap(msg.to_string())
    }
}

/// `text` on the lines after a message, if any.
fn on_lines(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!("\n{text}")
    }
}

/// A failed CUDA driver call: which call, and the `CUresult` it returned.
///
/// Displayed as the call, the code's name and the driver's description of
/// it: `cuStreamSynchronize failed: CUDA_ERROR_LAUNCH_FAILED (unspecified
/// launch failure)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaError {
    /// The driver function (or the cudarc method) that failed, or
    /// [`CudaError::UNNAMED`].
    pub call: &'static str,
    /// The driver's result code.
    pub code: CUresult,
}

impl CudaError {
    /// The `call` of a failure whose call site did not name the call.
    pub const UNNAMED: &'static str = "driver call";

    /// The code's name (`CUDA_ERROR_ILLEGAL_ADDRESS`).
    pub fn name(&self) -> String {
        format!("{:?}", self.code)
    }

    /// The driver's description of the code (`cuGetErrorString`), where a
    /// driver is loaded and knows the code.
    pub fn description(&self) -> Option<String> {
        // SAFETY: only asks the loader whether the driver library exists.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return None;
        }
        let e = cudarc::driver::DriverError(self.code);
        e.error_string().ok().map(|s| s.to_string_lossy().into_owned())
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.call, self.name())?;
        match self.description() {
            Some(d) => write!(f, " ({d})"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for CudaError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cuda_error_names_the_call_and_the_code() {
        let e = Error::Cuda(CudaError { call: "cuStreamSynchronize", code: CUresult::CUDA_ERROR_LAUNCH_FAILED });
        let text = e.to_string();
        assert!(text.starts_with("CUDA cuStreamSynchronize failed: CUDA_ERROR_LAUNCH_FAILED"), "{text}");
        let e =
            Error::Nvrtc { call: "nvrtcCompileProgram", code: nvrtcResult::NVRTC_ERROR_COMPILATION, log: "x".into() };
        assert_eq!(e.to_string(), "NVRTC nvrtcCompileProgram failed: NVRTC_ERROR_COMPILATION\nx");
        let e = Error::Cublas { call: "cublasCreate", code: cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED };
        assert_eq!(e.to_string(), "cuBLAS cublasCreate failed: CUBLAS_STATUS_NOT_INITIALIZED");
    }
}
