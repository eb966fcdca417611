//! # shmem
//!
//! A PGAS runtime in the style of NVSHMEM and PyTorch Symmetric Memory.
//! Every process (a *PE*) allocates the same *symmetric* buffers; any PE
//! reads and writes any other PE's copy with one-sided puts, gets, signals
//! and atomics, and teams of PEs run collectives over them.
//!
//! ```no_run
//! # fn main() -> shmem::Result<()> {
//! let ctx = shmem::init()?;
//! let (me, n) = (ctx.my_pe(), ctx.n_pes());
//! let s = ctx.stream();
//! let x = ctx.alloc::<f32>(1024)?; // collective: same size on every PE
//! x.fill(me as f32, &s)?;
//! ctx.all_reduce(&x, &x, shmem::ReduceOp::Sum, &s)?;
//! assert_eq!(x.copy_to_host(&s)?[0], (n * (n - 1) / 2) as f32);
//! ctx.finalize()
//! # }
//! ```
//!
//! Programs run as `shmemrun -n 4 prog`, under `mpirun` (feature `mpi`),
//! or alone as a world of one PE. See the README for the backends.

pub mod algo;
mod backend;
pub mod bootstrap;
mod buffer;
mod coll;
pub mod config;
mod context;
mod control;
mod desc;
mod dtype;
mod error;
pub mod fp8;
/// Internals for the fuzz targets in `fuzz/`: not API (hidden, unstable).
#[doc(hidden)]
pub mod fuzzing;
mod gpu;
mod handle;
mod interop;
pub use interop::CudaView;
mod heap;
mod host;
pub mod launch;
pub mod moe;
pub mod net;
pub mod overlap;
pub mod quant;
mod rma;
mod shm;
mod team;
mod traffic;

pub use algo::{AcrossNodes, AllGatherAlgo, AllReduceAlgo, CollImpl, Collectives, MoeKernels, ReduceOrder, Tuning};
pub use buffer::{SymSlice, SymmetricBuffer};
pub use config::{BackendKind, Config};
pub use context::{Context, Stream};
pub use dtype::{AtomicElement, DType, Element, ReduceOp};
pub use error::{CudaError, Error, Result, RoutingFault};
pub use fp8::{fp8_e4m3, fp8_e5m2};
pub use half::{bf16, f16};
pub use handle::{compile_with_device_header, DevicePeerHandle, PeerHandle, DEVICE_HEADER, SIGNAL_PAD_WORDS_PER_PEER};
pub use moe::{
    Arrivals, CombineElement, DeviceMoeArrivals, Fp8DeviceTokens, Fp8Out, Fp8Tokens, Fp8View, Layout, MoeAllToAll,
    MoeConfig, WireFormat,
};
pub use net::NetTraffic;
pub use overlap::{Overlap, OverlapComm};
pub use rma::{Cmp, SignalOp};
pub use team::Team;

/// Starts shmem with [`Config::new`] (the environment's settings).
///
/// # Collective
/// Every PE of the job calls it.
pub fn init() -> Result<Context> {
    Config::new().init()
}
