//! The seam between the public layer and the data plane.
//!
//! A public call checks its arguments, agrees through the control plane
//! (or leaves the agreement to the device) and hands its backend what to
//! move: heap offsets, byte counts, PEs, a stream. Each backend runs it in
//! its own folder: [`crate::host`] copies between mapped heaps, and
//! [`crate::gpu`] issues NVSHMEM calls and shmem's kernels on the stream.
//! A backend is one variant here and one arm in each method below.
//!
//! Through it go the backends' start and end, the one-sided operations,
//! the copies between host memory and a PE's own heap, the pointers users'
//! code reads, a team's data-plane state, the sequential matmuls' GEMM and
//! the device's failure records. A team's collectives and MoE all-to-all-v
//! take a view of the team on one backend (`Team::host`, `Team::on_gpu`:
//! [`crate::host::team::HostTeam`], [`crate::gpu::coll::GpuTeam`]) with
//! their descriptor ([`crate::desc`]). What still reaches a backend's world
//! directly ([`Backend::gpu`]): `MoeAllToAll`'s device forms
//! (`moe/device.rs`, `moe/layer.rs`, `moe/nodes.rs`), the fused overlapped
//! matmuls, the peer handles and the context's GPU accessors.

use crate::bootstrap::Bootstrap;
use crate::config::BackendKind;
use crate::control::topology::Topology;
use crate::control::Control;
use crate::desc::{On, Signal, Transfer};
use crate::dtype::{AtomicElement, AtomicOp, Element};
use crate::error::Result;
use crate::gpu::kernels::{AgreementFailure, DeviceCheckFailure};
use crate::gpu::{GpuWorld, TEAM_INVALID};
use crate::heap::asan::HeapMarks;
use crate::host::HostHeap;
use cudarc::driver::CudaStream;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

/// The data plane of a context.
pub(crate) enum Backend {
    /// Processes of one machine, every heap mapped by every PE.
    Host(HostHeap),
    /// NVSHMEM's symmetric heap and shmem's kernels on CUDA streams.
    Gpu(Box<GpuWorld>),
}

/// Every method takes offsets and PEs that the public layer checked:
/// regions inside the heap, elements aligned for their type, PEs in range.
impl Backend {
    /// The host backend of a job of `n` PEs (see [`HostHeap::start`]).
    ///
    /// # Collective
    pub(crate) fn start_host(
        boot: &mut Bootstrap,
        me: usize,
        n: usize,
        heap_size: usize,
        owner: (u32, u64),
    ) -> Result<Backend> {
        Ok(Backend::Host(HostHeap::start(boot, me, n, heap_size, owner)?))
    }

    /// The gpu backend: NVSHMEM and shmem's kernels (see [`GpuWorld::start`]).
    ///
    /// # Collective
    pub(crate) fn start_gpu(
        boot: &mut Bootstrap,
        topo: &Topology,
        pes_per_gpu: usize,
        heap_size: usize,
    ) -> Result<Backend> {
        Ok(Backend::Gpu(Box::new(GpuWorld::start(boot, topo, pes_per_gpu, heap_size)?)))
    }

    /// AddressSanitizer's marks of the host heaps, in ASan builds of the
    /// host backend.
    pub(crate) fn heap_marks(&self) -> Option<HeapMarks> {
        self.host().and_then(HostHeap::marks)
    }

    /// Whether `s` is being captured into a CUDA graph (never on the host).
    pub(crate) fn capturing(&self, s: On<'_>) -> bool {
        self.gpu().is_some_and(|g| crate::gpu::capturing(g.stream(s)))
    }

    /// Whether shmem's device kernels run here (the gpu backend with its
    /// cubin loaded).
    pub(crate) fn has_kernels(&self) -> bool {
        self.gpu().is_some_and(|g| g.kernels.is_some())
    }

    /// The kernels' records of failures found on the device, each taken
    /// (cleared) as it is read: the MoE exchange's check first, then the
    /// agreement's. No CUDA call, no synchronisation; never on the host
    /// backend, which checks before it writes.
    pub(crate) fn take_a2av_failure(&self) -> Option<DeviceCheckFailure> {
        self.gpu()?.kernels.as_ref()?.take_a2av_error()
    }

    /// See [`Backend::take_a2av_failure`].
    pub(crate) fn take_agreement_failure(&self) -> Option<AgreementFailure> {
        self.gpu()?.kernels.as_ref()?.take_agreement_failure()
    }

    /// Tells the device's waits that a peer died, so that they give up.
    pub(crate) fn peer_died(&self) {
        if let Some(k) = self.gpu().and_then(|g| g.kernels.as_ref()) {
            k.peer_died();
        }
    }

    /// Which backend this is.
    pub(crate) fn kind(&self) -> BackendKind {
        match self {
            Backend::Host(_) => BackendKind::Host,
            Backend::Gpu(_) => BackendKind::Gpu,
        }
    }

    /// A new CUDA stream of this PE's GPU (`None` on the host backend, or
    /// where one cannot be made: operations then go on the context's own
    /// stream, which is as ordered).
    pub(crate) fn new_stream(&self) -> Option<Arc<CudaStream>> {
        self.gpu().and_then(|g| g.new_stream().ok())
    }

    /// Ends the data plane's part (NVSHMEM's, on the gpu backend).
    pub(crate) fn finalize(&self) -> Result<()> {
        self.gpu().map_or(Ok(()), GpuWorld::finalize)
    }

    /// The gpu backend, for the paths not yet behind the seam.
    pub(crate) fn gpu(&self) -> Option<&GpuWorld> {
        match self {
            Backend::Gpu(g) => Some(g.as_ref()),
            Backend::Host(_) => None,
        }
    }

    /// The host backend's heaps, for the paths not yet behind the seam.
    pub(crate) fn host(&self) -> Option<&HostHeap> {
        match self {
            Backend::Host(h) => Some(h),
            Backend::Gpu(_) => None,
        }
    }

    /// Readies the data plane's state of team slot `slot` for a new team
    /// of `members` (world PEs) on member `me`: the gpu backend zeroes its
    /// kernels' state of the slot. Every member calls it before the team
    /// is used.
    pub(crate) fn add_team(&self, slot: usize, members: &[usize], me: usize) -> Result<()> {
        match self {
            Backend::Host(_) => Ok(()),
            Backend::Gpu(g) => g.kernels.as_ref().map_or(Ok(()), |k| k.add_team(g, slot, members, me)),
        }
    }

    /// NVSHMEM's team of PEs `start, start + stride, …` (`size` of them) of
    /// NVSHMEM's team `parent`, on the gpu backend where the parent has one;
    /// else [`TEAM_INVALID`]. Collective over the parent.
    pub(crate) fn split_team(&self, parent: i32, start: usize, stride: usize, size: usize) -> Result<i32> {
        match self {
            Backend::Gpu(g) if parent != TEAM_INVALID => g.split_team(parent, start, stride, size),
            _ => Ok(TEAM_INVALID),
        }
    }

    /// Frees what [`Backend::add_team`] and [`Backend::split_team`] made
    /// for the team of slot `slot` (NVSHMEM's team `nv_team`). Members drop
    /// their teams in the same order, as they made them.
    pub(crate) fn drop_team(&self, slot: usize, nv_team: i32) {
        if let Backend::Gpu(g) = self {
            let _ = g.destroy_team(nv_team);
            if let Some(k) = &g.kernels {
                k.drop_team(slot);
            }
        }
    }

    /// A put or get ([`Transfer`]); on the gpu backend it is issued on the
    /// stream, on the host backend it is done when this returns.
    pub(crate) fn transfer(&self, me: usize, t: Transfer, pool: &rayon::ThreadPool, s: On<'_>) -> Result<()> {
        match self {
            Backend::Host(h) => {
                let (dst, src) = t.ends(me);
                h.copy(pool, dst, src, t.bytes);
                Ok(())
            }
            Backend::Gpu(g) => g.transfer(t.put, g.addr(t.dst), g.addr(t.src), t.bytes, t.pe, g.stream(s)),
        }
    }

    /// A put ([`Transfer`] with `put`) and then a signal update at its
    /// destination PE: a PE that sees the signal sees the data.
    pub(crate) fn put_signal(
        &self,
        me: usize,
        t: Transfer,
        sig: Signal,
        pool: &rayon::ThreadPool,
        s: On<'_>,
    ) -> Result<()> {
        match self {
            Backend::Host(_) => {
                self.transfer(me, t, pool, s)?;
                // The signal's SeqCst store or add (a release at least)
                // makes the data copied above visible to any acquire load
                // that sees the new value.
                self.signal(sig, s)
            }
            Backend::Gpu(g) => {
                let (dst, src, at) = (g.addr(t.dst), g.addr(t.src), g.addr(sig.offset));
                g.put_signal(dst, src, t.bytes, at, sig.value, sig.add, t.pe, g.stream(s))
            }
        }
    }

    /// A signal update with no data.
    pub(crate) fn signal(&self, sig: Signal, s: On<'_>) -> Result<()> {
        match self {
            Backend::Host(h) => {
                let cell = h.signal(sig.pe, sig.offset);
                if sig.add {
                    cell.fetch_add(sig.value, Ordering::SeqCst);
                } else {
                    cell.store(sig.value, Ordering::SeqCst);
                }
                Ok(())
            }
            Backend::Gpu(g) => g.signal_op(g.addr(sig.offset), sig.value, sig.add, sig.pe, g.stream(s)),
        }
    }

    /// This PE's signal at heap offset `offset`, read once the stream's
    /// work is done (acquire: the data put before it is visible).
    pub(crate) fn signal_fetch(&self, me: usize, offset: usize, s: On<'_>) -> Result<u64> {
        match self {
            Backend::Host(h) => Ok(h.signal(me, offset).load(Ordering::Acquire)),
            Backend::Gpu(g) => {
                let mut v = [0u64];
                g.dtoh(&mut v, g.addr(offset), g.stream(s))?;
                Ok(v[0])
            }
        }
    }

    /// Waits until `holds` says yes to this PE's signal at heap offset
    /// `offset`, polled from the host (so that a dead peer ends the wait,
    /// through `ctl`); returns the value it said yes to.
    pub(crate) fn signal_wait(
        &self,
        ctl: &Control,
        me: usize,
        offset: usize,
        holds: impl Fn(u64) -> bool,
        what: &dyn Fn() -> String,
        s: On<'_>,
    ) -> Result<u64> {
        let (mut seen, mut failed) = (0, None);
        match self {
            Backend::Host(h) => {
                let cell = h.signal(me, offset);
                ctl.wait_for_anyone(
                    || {
                        // Acquire: pairs with the release of the signalling put.
                        seen = cell.load(Ordering::Acquire);
                        holds(seen)
                    },
                    what,
                )?;
            }
            Backend::Gpu(g) => {
                let st = g.stream(s);
                st.synchronize()?;
                let poll = || {
                    let mut v = [0u64];
                    match g.dtoh(&mut v, g.addr(offset), st) {
                        Ok(()) => {
                            seen = v[0];
                            holds(seen)
                        }
                        Err(e) => {
                            failed = Some(e);
                            true
                        }
                    }
                };
                ctl.wait_for_anyone(poll, what)?;
            }
        }
        failed.map_or(Ok(seen), Err)
    }

    /// Writes one element into `pe`'s heap at `offset` (NVSHMEM's `p`).
    pub(crate) fn store<T: Element>(&self, pe: usize, offset: usize, value: T, s: On<'_>) -> Result<()> {
        match self {
            Backend::Host(h) => {
                h.store(pe, offset, value);
                Ok(())
            }
            // SAFETY: a checked element of the symmetric heap.
            Backend::Gpu(g) => unsafe {
                crate::gpu::dispatch::p(g.nv, g.addr(offset), value, pe as i32, g.stream(s).cu_stream())
            },
        }
    }

    /// Reads one element of `pe`'s heap at `offset` (NVSHMEM's `g`), once
    /// the stream's work is done.
    pub(crate) fn load<T: Element>(&self, pe: usize, offset: usize, s: On<'_>) -> Result<T> {
        match self {
            Backend::Host(h) => Ok(h.load(pe, offset)),
            Backend::Gpu(g) => {
                let st = g.stream(s);
                // SAFETY: a checked element of the symmetric heap.
                let v = unsafe { crate::gpu::dispatch::g(g.nv, g.addr(offset), pe as i32, st.cu_stream())? };
                st.synchronize()?;
                Ok(v)
            }
        }
    }

    /// Completes every outstanding one-sided operation of this PE (a fence
    /// too: NVSHMEM has no fence on a stream).
    pub(crate) fn quiet(&self, s: On<'_>) -> Result<()> {
        match self {
            Backend::Host(_) => {
                fence(Ordering::SeqCst);
                Ok(())
            }
            Backend::Gpu(g) => g.quiet(g.stream(s)),
        }
    }

    /// Performs `op` on `pe`'s element at heap offset `offset`, after the
    /// work already on the stream; returns the old value.
    pub(crate) fn atomic<T: AtomicElement>(&self, pe: usize, offset: usize, op: AtomicOp<T>, s: On<'_>) -> Result<T> {
        match self {
            Backend::Host(h) => Ok(h.atomic(pe, offset, op)),
            Backend::Gpu(g) => {
                // NVSHMEM's host atomics are blocking calls: order them
                // after the work already on the stream.
                g.stream(s).synchronize()?;
                g.atomic(offset, op, pe, g.stream(s))
            }
        }
    }

    /// Copies `data` into this PE's heap at `offset`.
    pub(crate) fn write_local<T: Element>(&self, me: usize, offset: usize, data: &[T], s: On<'_>) -> Result<()> {
        match self {
            Backend::Host(h) => {
                h.write(me, offset, data);
                Ok(())
            }
            Backend::Gpu(g) => g.htod(g.addr(offset), data, g.stream(s)),
        }
    }

    /// Copies this PE's heap at `offset` into `out`, once the stream's work
    /// is done.
    pub(crate) fn read_local<T: Element>(&self, me: usize, offset: usize, out: &mut [T], s: On<'_>) -> Result<()> {
        match self {
            Backend::Host(h) => {
                h.read(me, offset, out);
                Ok(())
            }
            Backend::Gpu(g) => g.dtoh(out, g.addr(offset), g.stream(s)),
        }
    }

    /// Zeroes `bytes` of this PE's heap at `offset`; done when it returns.
    pub(crate) fn zero_local(&self, me: usize, offset: usize, bytes: usize, s: On<'_>) -> Result<()> {
        match self {
            Backend::Host(h) => {
                h.zero(me, offset, bytes);
                Ok(())
            }
            Backend::Gpu(g) => g.zero(g.addr(offset), bytes, g.stream(s)),
        }
    }

    /// `c = a · b` on this PE's heap (`a` is `rows × k`, `b` `k × n`, at
    /// heap offsets `a`, `b`, `c`; f32, f16, bf16, accumulated in f32):
    /// cuBLAS on the stream on the gpu backend, the rayon pool on the host.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm<T: Element>(
        &self,
        me: usize,
        (a, b, c): (usize, usize, usize),
        (rows, k, n): (usize, usize, usize),
        pool: &rayon::ThreadPool,
        s: On<'_>,
    ) -> Result<()> {
        match self {
            Backend::Host(h) => {
                h.gemm::<T>(pool, me, (a, b, c), (rows, k, n));
                Ok(())
            }
            Backend::Gpu(g) => {
                let blas = g.blas()?;
                let blas = blas.as_ref().expect("made by blas()");
                // SAFETY: checked regions of this PE's heap.
                unsafe { blas.gemm(T::DTYPE, g.addr(a), g.addr(b), g.addr(c), rows, k, n, g.stream(s)) }
            }
        }
    }

    /// Where `pe`'s heap byte `offset` lies for this PE's loads and stores:
    /// a host address on the host backend, a device address on the gpu
    /// backend (`None` where `pe` is not reachable over NVLink).
    pub(crate) fn peer_ptr(&self, pe: usize, offset: usize) -> Option<*mut u8> {
        match self {
            Backend::Host(h) => Some(h.heap_ptr(pe, offset)),
            Backend::Gpu(g) => g.peer_base[pe].map(|base| (base + offset as u64) as *mut u8),
        }
    }

    /// This PE's heap byte `offset` (host or device address, as above).
    pub(crate) fn local_ptr(&self, me: usize, offset: usize) -> *mut u8 {
        match self {
            Backend::Host(h) => h.heap_ptr(me, offset),
            Backend::Gpu(g) => g.addr(offset) as *mut u8,
        }
    }

    /// The device address of this PE's heap byte `offset`, on the gpu
    /// backend (for users' own kernels).
    pub(crate) fn device_addr(&self, offset: usize) -> Option<u64> {
        self.gpu().map(|g| g.addr(offset))
    }
}
