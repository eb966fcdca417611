//! Handles for users' own kernels: every PE's address of a symmetric
//! buffer, and a signal pad per PE to synchronise through — PyTorch
//! SymmMem's `buffer_ptrs_dev` / `signal_pad_ptrs_dev`.

use crate::buffer::SymmetricBuffer;
use crate::context::Context;
use crate::dtype::Element;
use crate::error::Result;
use crate::team::Team;

/// `u32` words of signal pad per PE for each peer (one word per block or
/// channel that synchronises with that peer): `kPadWordsPerPeer` of
/// [`DEVICE_HEADER`].
pub const SIGNAL_PAD_WORDS_PER_PEER: usize = 32;

/// The CUDA C++ header for users' own kernels, `shmem_device.cuh`: the
/// device side of a [`PeerHandle`] (peer pointers, put and put-with-signal
/// over NVLink, bounded waits on the signal pads, a barrier), and of
/// [`MoeAllToAll::arrivals`](crate::MoeAllToAll::arrivals) (`MoeArrivals`,
/// `moe_wait_arrival`). Its comments are its documentation, the signal
/// pads' layout included.
///
/// It compiles with nvcc and with NVRTC; [`compile_with_device_header`]
/// compiles a kernel that includes it:
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cuda = cudarc::driver::CudaContext::new(0)?;
/// let src = r#"
/// #include "shmem_device.cuh"
/// extern "C" __global__ void hello(shmem::PeerHandle h) { shmem::barrier(h, 0, 1); }
/// "#;
/// let ptx = shmem::compile_with_device_header(&cuda, src)?;
/// let module = cuda.load_module(ptx)?;
/// # Ok(())
/// # }
/// ```
///
/// Launch the kernel with [`PeerHandle::device_arg`] as its
/// `shmem::PeerHandle` argument; `examples/device_kernel.rs` is a whole
/// program. With nvcc, write the file into a folder and pass `-I`.
///
/// (The file lives in the repository's `kernels/`, outside this crate's
/// folder: a packaged crate would have to carry a copy of it.)
pub const DEVICE_HEADER: &str = include_str!("../../kernels/shmem_device.cuh");

/// Compiles `source`, CUDA C++ that may `#include "shmem_device.cuh"`
/// ([`DEVICE_HEADER`]), to PTX for the GPU of `cuda` with NVRTC (C++17):
/// the header goes into a temporary include folder for the compilation.
/// A failed compilation returns [`Error::Nvrtc`](crate::Error::Nvrtc)
/// with the compiler's log.
pub fn compile_with_device_header(cuda: &cudarc::driver::CudaContext, source: &str) -> Result<cudarc::nvrtc::Ptx> {
    use crate::gpu::CudaCall;
    use std::sync::atomic::{AtomicU64, Ordering};
    // One folder a call: several threads may compile at once.
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let (major, minor) = cuda.compute_capability().cuda("cuDeviceGetAttribute")?;
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("shmem-device-{}-{call}", std::process::id()));
    let os = |call| move |source| crate::Error::Os { call, source };
    std::fs::create_dir_all(&dir).map_err(os("creating the device header's folder"))?;
    let written = std::fs::write(dir.join("shmem_device.cuh"), DEVICE_HEADER);
    let ptx = written.map_err(os("writing the device header")).and_then(|()| {
        let opts = cudarc::nvrtc::CompileOptions {
            include_paths: vec![dir.display().to_string()],
            options: vec![format!("--gpu-architecture=compute_{major}{minor}"), "-std=c++17".into()],
            ..Default::default()
        };
        cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(crate::gpu::amo::nvrtc_error)
    });
    let _ = std::fs::remove_dir_all(&dir);
    ptx
}

/// Where every PE's copy of a buffer, and its signal pad, can be reached
/// by loads and stores from this PE.
///
/// On the GPU backend the `*_dev` arrays are device memory (pass them to a
/// kernel); on the host backend they are host arrays of host addresses.
/// An address is 0 where this PE cannot load and store that PE's memory
/// (no NVLink path): use NVSHMEM's RMA for those peers.
pub struct PeerHandle<T: Element> {
    /// This PE's rank and the number of PEs.
    pub rank: usize,
    pub world_size: usize,
    /// Each PE's copy of the buffer.
    pub buffer_ptrs: Vec<u64>,
    /// Each PE's signal pad: `world_size × SIGNAL_PAD_WORDS_PER_PEER`
    /// zeroed `u32` words.
    pub signal_pad_ptrs: Vec<u64>,
    /// Address of an array of `world_size` buffer addresses.
    pub buffer_ptrs_dev: u64,
    /// Address of an array of `world_size` signal pad addresses.
    pub signal_pad_ptrs_dev: u64,
    pad: SymmetricBuffer<u32>,
    arrays: Arrays,
    _buf: std::marker::PhantomData<T>,
}

/// The memory behind the `*_dev` addresses, owned so they stay valid.
enum Arrays {
    Host(#[allow(dead_code)] Vec<u64>),
    Gpu(#[allow(dead_code)] cudarc::driver::CudaSlice<u64>),
}

impl<T: Element> PeerHandle<T> {
    /// The signal pads (a symmetric buffer, for RMA signalling too).
    pub fn signal_pad(&self) -> &SymmetricBuffer<u32> {
        &self.pad
    }

    /// Whether the device arrays live in GPU memory.
    pub fn on_device(&self) -> bool {
        matches!(self.arrays, Arrays::Gpu(_))
    }

    /// The kernel argument: `shmem::PeerHandle` of [`DEVICE_HEADER`],
    /// passed by value. Its addresses stay valid while `self` lives: keep
    /// the handle until the kernels that got it have finished.
    pub fn device_arg(&self) -> DevicePeerHandle<'_> {
        DevicePeerHandle {
            buffer_ptrs: self.buffer_ptrs_dev,
            signal_pads: self.signal_pad_ptrs_dev,
            rank: self.rank as i32,
            world_size: self.world_size as i32,
            _handle: std::marker::PhantomData,
        }
    }
}

/// The `shmem::PeerHandle` struct of [`DEVICE_HEADER`], field for field:
/// a kernel argument, made by [`PeerHandle::device_arg`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DevicePeerHandle<'a> {
    buffer_ptrs: u64,
    signal_pads: u64,
    rank: i32,
    world_size: i32,
    _handle: std::marker::PhantomData<&'a ()>,
}

const _: () = assert!(std::mem::size_of::<DevicePeerHandle<'static>>() == 24);
const _: () = assert!(std::mem::offset_of!(DevicePeerHandle<'static>, buffer_ptrs) == 0);
const _: () = assert!(std::mem::offset_of!(DevicePeerHandle<'static>, signal_pads) == 8);
const _: () = assert!(std::mem::offset_of!(DevicePeerHandle<'static>, rank) == 16);
const _: () = assert!(std::mem::offset_of!(DevicePeerHandle<'static>, world_size) == 20);

// SAFETY: `#[repr(C)]` plain data laid out as the header's struct (two
// 8-byte addresses, two `int`s, no padding); the marker is zero-sized.
unsafe impl cudarc::driver::DeviceRepr for DevicePeerHandle<'_> {}

impl<T: Element> SymmetricBuffer<T> {
    /// Every PE's address of this buffer and of a fresh signal pad.
    ///
    /// # Collective
    /// Allocates the signal pad: every PE calls it, in the same order as
    /// its other allocations.
    pub fn handle(&self) -> Result<PeerHandle<T>> {
        let ctx = Context { inner: self.ctx.clone() };
        self.handle_on(&ctx.world())
    }

    /// Like [`SymmetricBuffer::handle`], over the PEs of `team`: ranks
    /// and arrays are the team's. With [`crate::Context::node`] every
    /// address is set where the node's GPUs have NVLink, also in a job of
    /// several nodes (whose other nodes' PEs have none).
    ///
    /// # Collective
    /// Every PE of the world calls it (it allocates the signal pad), each
    /// with a team it belongs to; the members of a team pass that team.
    pub fn handle_on(&self, team: &Team) -> Result<PeerHandle<T>> {
        self.check(&self.ctx)?;
        team.check()?;
        let ctx = Context { inner: self.ctx.clone() };
        let (rank, n) = (team.my_pe(), team.n_pes());
        // Sized for the world, so that every PE allocates the same.
        let pad = ctx.alloc_zeroed::<u32>(ctx.n_pes() * SIGNAL_PAD_WORDS_PER_PEER)?;
        let members = (0..n).map(|pe| team.world_pe(pe)).collect::<Result<Vec<usize>>>()?;
        let addr = |p: Option<*mut T>| p.map_or(0, |p| p as u64);
        let buffer_ptrs: Vec<u64> = members.iter().map(|&pe| addr(self.peer_ptr(pe))).collect();
        let signal_pad_ptrs: Vec<u64> = members.iter().map(|&pe| pad.peer_ptr(pe).map_or(0, |p| p as u64)).collect();
        let both: Vec<u64> = buffer_ptrs.iter().chain(&signal_pad_ptrs).copied().collect();
        let (arrays, base) = match self.ctx.backend.gpu() {
            Some(g) => {
                let s = g.own_stream();
                let dev = s.clone_htod(&both)?;
                s.synchronize()?;
                let base = cudarc::driver::DevicePtr::device_ptr(&dev, s).0;
                (Arrays::Gpu(dev), base)
            }
            None => {
                let base = both.as_ptr() as u64;
                (Arrays::Host(both), base)
            }
        };
        Ok(PeerHandle {
            rank,
            world_size: n,
            buffer_ptrs,
            signal_pad_ptrs,
            buffer_ptrs_dev: base,
            signal_pad_ptrs_dev: base + (n * size_of::<u64>()) as u64,
            pad,
            arrays,
            _buf: std::marker::PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_agrees_with_the_rust_side() {
        let words = format!("constexpr int kPadWordsPerPeer = {SIGNAL_PAD_WORDS_PER_PEER};");
        assert!(DEVICE_HEADER.contains(&words), "the header's pad size differs from SIGNAL_PAD_WORDS_PER_PEER");
        assert_eq!(size_of::<DevicePeerHandle>(), 24);
        assert!(DEVICE_HEADER.contains("void *const *buffer_ptrs;"));
        assert!(DEVICE_HEADER.contains("uint32_t *const *signal_pads;"));
    }
}
