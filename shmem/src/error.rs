//! The runtime's error type.

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
    /// A CUDA driver call failed.
    #[error("CUDA: {0}")]
    Cuda(String),
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
