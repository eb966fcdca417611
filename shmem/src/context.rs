//! The context: one per process, the owner of the backend, the heap and the teams.

use crate::algo::Collectives;
use crate::backend::Backend;
use crate::bootstrap::Bootstrap;
use crate::config::{BackendKind, Config};
use crate::control::node::{self, NodeArea};
use crate::control::team::TeamState;
use crate::control::topology::{Hello, Topology};
use crate::control::{Control, PeState};
use crate::error::{Error, Result};
use crate::gpu;
use crate::heap::Allocator;
use crate::shm;
use crate::team::Team;
use crate::traffic::{NetCounters, NetDir};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The id of the context alive (not finalized) in this process, 0 for none,
/// `STARTING` while one starts: `init` twice is an error.
static LIVE: AtomicU64 = AtomicU64::new(0);
const STARTING: u64 = u64::MAX;
/// Ids of the world and node teams (split teams have the top bit set).
const WORLD_UID: u64 = 1;
const NODE_UID: u64 = 2;
/// Distinguishes contexts of one process, so a buffer of an old context is
/// recognised as foreign by a new one.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What every buffer, team and the context itself share.
pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) me: usize,
    pub(crate) n: usize,
    pub(crate) local_rank: usize,
    pub(crate) local_size: usize,
    /// This PE's part in the control plane.
    pub(crate) ctl: Control,
    /// The data plane: the host's mapped heaps or the GPU's.
    pub(crate) backend: Backend,
    pub(crate) heap: Mutex<Allocator>,
    pub(crate) heap_size: usize,
    pub(crate) finalized: AtomicBool,
    /// How the GPU backend's collectives run.
    pub(crate) collectives: Mutex<Collectives>,
    /// Team slots free on this PE (bit i: slot i).
    pub(crate) free_team_slots: Mutex<u64>,
    pub(crate) world: Arc<TeamState>,
    pub(crate) node: Arc<TeamState>,
    pub(crate) pool: rayon::ThreadPool,
    /// The host's counts of traffic with other nodes' PEs (see [`crate::net`]).
    pub(crate) net: NetCounters,
    /// Kept alive for the context's life: under MPI, dropping it finalizes
    /// MPI. (A job of more than one node keeps it as the control plane's
    /// channel instead, whose close then finalizes MPI.)
    _bootstrap: Mutex<Option<Bootstrap>>,
}

impl Inner {
    /// See [`Context::check_device`].
    pub(crate) fn check_device(&self) -> Result<()> {
        self.take_device_failure().map_or(Ok(()), Err)
    }

    /// The first failure the kernels found since the last look, as the
    /// error the host's check would give (cleared): a MoE exchange's check
    /// (a bad split, a bad routing) before an agreement's failure. Reads
    /// the host-mapped records the kernels write ([`crate::gpu::kernels`]),
    /// with no call into CUDA and no synchronisation; `None` on the host
    /// backend, which checks before it writes.
    pub(crate) fn take_device_failure(&self) -> Option<Error> {
        match self.backend.take_a2av_failure() {
            Some(f) => Some(crate::moe::device_check_error(f)),
            None => self.take_agreement_error(),
        }
    }

    /// `r`, the call's own result, unless it is `Ok` and the kernels
    /// found an earlier call failed since the last look: then that
    /// failure ([`Inner::take_device_failure`]). A call's own error comes
    /// first, and leaves an earlier failure for the next call. Every call
    /// that waits for a stream, and every collective, RMA and MoE call of
    /// the gpu backend returns through it, once its own work is issued,
    /// so that the PEs still make the same calls (see [`crate::Team`]).
    pub(crate) fn report<T>(&self, r: Result<T>) -> Result<T> {
        let v = r?;
        self.take_device_failure().map_or(Ok(v), Err)
    }

    /// The first collective call whose agreement the kernels found failed
    /// since the last look, as its error (cleared); see [`crate::Team`].
    pub(crate) fn take_agreement_error(&self) -> Option<Error> {
        let failure = self.backend.take_agreement_failure()?;
        Some(crate::team::agreement_error(&failure))
    }

    /// Counts a transfer of `bytes` with world PE `peer` in direction
    /// `dir`, if `peer` is on another node (see [`crate::net`]). Every copy
    /// between PEs that the host makes or issues calls it.
    pub(crate) fn net_count(&self, peer: usize, bytes: usize, dir: NetDir) {
        self.net.count(&self.ctl, peer, bytes, dir);
    }

    /// Counts a signal to world PE `peer`, if it is on another node.
    pub(crate) fn net_signal(&self, peer: usize) {
        if self.ctl.other_node(peer) {
            self.net.add_signal();
        }
    }

    /// Fails if the context was finalized; `what` names the object used.
    pub(crate) fn check_live(&self, what: &'static str) -> Result<()> {
        if self.finalized.load(Ordering::Acquire) {
            Err(Error::Finalized(what))
        } else {
            Ok(())
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.finalized.load(Ordering::Acquire) {
            self.ctl.set_state(PeState::Exited);
            // The other nodes hear that this PE left, as its own node reads
            // in its state, not that it died.
            self.ctl.close_net();
            let _ = LIVE.compare_exchange(self.id, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

/// How often the gpu backend's liveness watcher looks for a dead PE.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// Starts the gpu backend's liveness watcher (with shmem's kernels, in a
/// job of more than one PE): a thread that looks for a dead PE of the job
/// every [`WATCH_EVERY`] and, once it sees one, makes every wait of the
/// kernels give up. A PE whose kernel waits on the device for the dead one
/// then fails (its stream reports the trap, naming the dead PE) within
/// about that time, not at the device wait's time limit; the host's own
/// waits see a death by themselves. It ends with the context, or once it
/// has fired.
fn watch_liveness(inner: &Arc<Inner>) -> Result<()> {
    if !inner.backend.has_kernels() || inner.n == 1 {
        return Ok(());
    }
    let weak = Arc::downgrade(inner);
    std::thread::Builder::new()
        .name(format!("shmem-pe{}-liveness", inner.me))
        .spawn(move || loop {
            std::thread::sleep(WATCH_EVERY);
            let Some(inner) = weak.upgrade() else { return };
            if inner.finalized.load(Ordering::Acquire) {
                return;
            }
            if inner.ctl.died_peer().is_some() {
                inner.backend.peer_died();
                return;
            }
        })
        .map(drop)
        .map_err(|e| Error::config(format!("starting the liveness watcher: {e}")))
}

/// The handle to shmem in this process (one PE).
///
/// Created by [`crate::init`] or [`Config::init`]. Buffers and teams keep
/// the runtime alive after the context is dropped, but refuse to be used
/// once it was finalized.
///
/// Errors: bad or mismatched arguments fail a call on every PE, with
/// nothing written. On the GPU backend some are found on the device after
/// the call returned (an eager collective whose PEs' calls differ, a bad
/// MoE split or routing); the first call of the context that can see such
/// a failure reports it, once, and [`Context::finalize`] reports one that
/// no call did ([`Team`] lists which calls).
pub struct Context {
    pub(crate) inner: Arc<Inner>,
}

/// An ordering of work. On the GPU backend it is a CUDA stream; on the host
/// backend every operation completes before it returns, so a stream only
/// keeps the API the same.
#[derive(Debug, Default, Clone)]
pub struct Stream {
    pub(crate) cuda: Option<Arc<cudarc::driver::CudaStream>>,
    /// The context that made it: names a dead peer when the stream fails.
    pub(crate) owner: Option<Weak<Inner>>,
}

impl Stream {
    /// Waits for everything issued on the stream.
    ///
    /// When a kernel on it trapped (a device wait for a dead peer gives up
    /// once this PE's liveness watcher sees the death, or at its time
    /// limit, and traps), the error names the dead PE where the host sees
    /// one.
    ///
    /// On the GPU backend, an eager collective whose PEs' calls differed
    /// (or a PE's own arguments were bad) is found by its kernel, which
    /// then writes nothing, and so is a MoE exchange whose splits or
    /// routing are bad: this fails with that error (an
    /// [`Error::CollectiveMismatch`], or the MoE check's) once the kernel
    /// has run — the first such failure of the context not yet reported,
    /// whichever stream it ran on (see [`crate::Team`]).
    pub fn synchronize(&self) -> Result<()> {
        self.wait()?;
        let failure = self.owner.as_ref().and_then(Weak::upgrade).and_then(|inner| inner.take_device_failure());
        failure.map_or(Ok(()), Err)
    }

    /// Waits for everything issued on the stream, naming a dead peer as
    /// [`Stream::synchronize`] does, and reports nothing else.
    pub(crate) fn wait(&self) -> Result<()> {
        let Some(s) = &self.cuda else { return Ok(()) };
        s.synchronize().map_err(|e| {
            let dead =
                self.owner.as_ref().and_then(Weak::upgrade).filter(|_| crate::gpu::sticky(&e)).and_then(|inner| {
                    (0..inner.n)
                        .filter(|&pe| pe != inner.me)
                        .find_map(|pe| inner.ctl.peer_problem(pe).filter(|p| p.starts_with("died")).map(|p| (pe, p)))
                });
            let err = Error::from(e);
            match dead {
                Some((pe, p)) => Error::PeerLost { pe, what: format!("{p}; the device's wait for it ended in {err}") },
                None => err,
            }
        })
    }

    /// The CUDA stream, on the GPU backend (for users' own kernels).
    pub fn cuda_stream(&self) -> Option<&Arc<cudarc::driver::CudaStream>> {
        self.cuda.as_ref()
    }
}

/// Every PE's start-up settings, checked on every PE: fails on every PE,
/// with [`Error::Config`], when a PE could not read its settings (naming the
/// PEs and their messages) or when the settings that must be equal differ.
/// `mine` is this PE's heap size (in whole pages) and `SHMEM_FORCE_RMA`.
fn agree_settings(boot: &mut Bootstrap, mine: Result<(usize, bool), String>) -> Result<usize> {
    let msg = match &mine {
        Ok((heap, rma)) => [&[0u8][..], &(*heap as u64).to_le_bytes(), &[*rma as u8]].concat(),
        Err(e) => [&[1u8][..], e.as_bytes()].concat(),
    };
    let all = boot.allgather(&msg)?;
    // Identical messages are told once, with the PEs that have them.
    let mut bad: Vec<(String, Vec<usize>)> = Vec::new();
    for (pe, m) in all.iter().enumerate() {
        if m.first() == Some(&0) && m.len() == 10 {
            continue;
        }
        let text = match m.first() {
            Some(1) => String::from_utf8_lossy(&m[1..]).into_owned(),
            _ => "malformed settings message".to_string(),
        };
        match bad.iter_mut().find(|(t, _)| *t == text) {
            Some((_, pes)) => pes.push(pe),
            None => bad.push((text, vec![pe])),
        }
    }
    if !bad.is_empty() {
        let on = |pes: &[usize]| {
            if pes.len() == all.len() && pes.len() > 1 {
                "on every PE".to_string()
            } else {
                format!("on {}", crate::bootstrap::tcp::wire::list_pes(pes))
            }
        };
        let parts: Vec<String> = bad.iter().map(|(text, pes)| format!("{text} ({})", on(pes))).collect();
        return Err(Error::Config(parts.join("; ")));
    }
    let (heap, _) = mine.expect("every PE's settings were read, this PE's too");
    let rmas: Vec<bool> = all.iter().map(|m| m[9] != 0).collect();
    if let Some(pe) = rmas.iter().position(|&r| r != rmas[0]) {
        return Err(Error::config(format!(
            "SHMEM_FORCE_RMA differs across PEs: PE 0 has it {}, PE {pe} {} (set it alike on every PE)",
            ["off", "on"][rmas[0] as usize],
            ["off", "on"][rmas[pe] as usize]
        )));
    }
    Ok(heap)
}

impl Context {
    pub(crate) fn start(config: Config) -> Result<Context> {
        if LIVE.compare_exchange(0, STARTING, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return Err(Error::AlreadyInitialized);
        }
        let result = Self::start_inner(config);
        LIVE.store(result.as_ref().map_or(0, |c| c.inner.id), Ordering::Release);
        result
    }

    fn start_inner(config: Config) -> Result<Context> {
        // A PE with a bad setting still joins the job, so that every PE
        // fails with it (below), not only the PEs that have it.
        let settings = config.env_error.clone().map_or(Ok(()), Err).and_then(|()| {
            crate::config::heap_pages(config.heap_size)
                .ok_or_else(|| format!("a heap of {} bytes per PE is more than one mapping can hold", config.heap_size))
        });
        let gpu_check = match (config.backend, &settings) {
            (BackendKind::Host, _) | (_, Err(_)) => None,
            (BackendKind::Gpu | BackendKind::Auto, Ok(_)) => Some(gpu::available()),
        };
        let backend = match (&gpu_check, config.backend) {
            (Some(Ok(())), _) => 1,
            (Some(Err(_)), BackendKind::Gpu) => 2,
            _ => 0,
        };
        let mut boot = Bootstrap::from_env(config.peer_timeout)?;
        let (me, n) = (boot.rank(), boot.size());
        let heap_size = agree_settings(&mut boot, settings.map(|heap| (heap, config.force_rma)))?;

        let hello = Hello::mine(&boot, heap_size as u64, backend);
        let hellos: Vec<Hello> =
            boot.allgather(&hello.encode())?.iter().map(|b| Hello::decode(b)).collect::<Result<_>>()?;
        // Every PE sees the same hellos, so every PE reaches the same verdicts.
        if let Some((pe, h)) = hellos.iter().enumerate().find(|(_, h)| h.heap_size != hellos[0].heap_size) {
            return Err(Error::config(format!(
                "heap size differs across PEs: PE 0 asked for {} bytes, PE {pe} for {} bytes",
                hellos[0].heap_size, h.heap_size
            )));
        }
        let topo = Topology::from_hellos(&hellos, me)?;
        if let Some(why) = gpu_check.as_ref().and_then(|c| c.as_ref().err()).filter(|_| backend == 2) {
            return Err(Error::BackendUnavailable(format!("SHMEM_BACKEND=gpu, but on PE {me}: {why}")));
        }
        if let Some((pe, h)) = hellos.iter().enumerate().find(|(_, h)| h.backend != hellos[0].backend) {
            let name = |b: u8| ["host", "gpu", "gpu (unavailable)"][b.min(2) as usize];
            return Err(Error::BackendUnavailable(format!(
                "PEs chose different backends: PE 0 {}, PE {pe} {} (set SHMEM_BACKEND to pick one)",
                name(hellos[0].backend),
                name(h.backend)
            )));
        }
        let use_gpu = backend == 1;
        let (local_rank, local_size) = (topo.local_rank, topo.local_size);
        let node_members = topo.my_members().to_vec();
        let unique = NEXT_ID.load(Ordering::Relaxed) ^ nanos();

        // The node's control area: its lowest PE creates it.
        let leader = node_members[0];
        // Only a job of more than one node has rows from other nodes.
        let remote_pes = if topo.nodes.len() > 1 { n } else { 0 };
        let total = node::object_size(local_size, remote_pes)
            .ok_or_else(|| Error::config(format!("a control area for {local_size} PEs overflows the address space")))?;
        let node_area = boot.share_object(
            me,
            leader,
            total,
            "node's control area",
            || {
                let name = shm::object_name(hellos[me].pid, unique << 1 | 1);
                let map = shm::Mapping::create(&name, total)?;
                NodeArea::init_header(&map, n, local_size, remote_pes);
                Ok((name, map))
            },
            |map| NodeArea::new(map, me, n, &node_members, remote_pes),
        )?;

        let backend = match use_gpu {
            true => Backend::start_gpu(&mut boot, &topo, config.pes_per_gpu, heap_size)?,
            false => Backend::start_host(&mut boot, me, n, heap_size, (hellos[0].pid, unique << 1))?,
        };
        let marks = backend.heap_marks();
        // A job of more than one node keeps the bootstrap's channel for the
        // control plane's tier between nodes.
        let (net, boot) = if topo.nodes.len() > 1 {
            (Some(boot.into_net()?), None)
        } else {
            boot.close();
            (None, Some(boot))
        };
        let ctl = Control::new(node_area, &topo, me, config.wait_timeout, &[(WORLD_UID, 0), (NODE_UID, 1)], net);

        let members: Vec<usize> = (0..n).collect();
        // Emulated nodes share the machine's cores.
        let threads = std::thread::available_parallelism().map_or(1, |c| c.get()).div_ceil(topo.host_size).max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("shmem-pe{me}-{i}"))
            .build()
            .map_err(|e| Error::config(format!("starting the rayon pool: {e}")))?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let world = Arc::new(TeamState::new(id, 0, members, &ctl, None, gpu::TEAM_WORLD, WORLD_UID));
        let nv_node = backend.gpu().map_or(gpu::TEAM_INVALID, |g| g.node_team);
        let node = Arc::new(TeamState::new(id, 1, node_members, &ctl, None, nv_node, NODE_UID));
        let inner = Inner {
            id,
            me,
            n,
            local_rank,
            local_size,
            ctl,
            backend,
            heap: Mutex::new(Allocator::new(heap_size).with_marks(marks)),
            heap_size,
            finalized: AtomicBool::new(false),
            collectives: Mutex::new(Collectives { force_rma: config.force_rma, ..Default::default() }),
            free_team_slots: Mutex::new(!0b11),
            world,
            node,
            pool,
            net: NetCounters::default(),
            _bootstrap: Mutex::new(boot),
        };
        let inner = Arc::new(inner);
        watch_liveness(&inner)?;
        Ok(Context { inner })
    }

    /// This PE's number in the world, `0..n_pes()`.
    pub fn my_pe(&self) -> usize {
        self.inner.me
    }

    /// Number of PEs in the world.
    pub fn n_pes(&self) -> usize {
        self.inner.n
    }

    /// This PE's rank among the PEs of its node (its GPU on the GPU backend).
    pub fn local_rank(&self) -> usize {
        self.inner.local_rank
    }

    /// Number of PEs on this node.
    pub fn local_size(&self) -> usize {
        self.inner.local_size
    }

    /// On the GPU backend: this PE's CUDA device ordinal.
    pub fn device(&self) -> Option<usize> {
        self.inner.backend.gpu().map(|g| g.device)
    }

    /// On the GPU backend: the NVSHMEM library's version (major, minor, patch).
    pub fn nvshmem_version(&self) -> Option<(i32, i32, i32)> {
        self.inner.backend.gpu().map(|g| g.version)
    }

    /// Chooses how the GPU backend's collectives run (see [`Collectives`]).
    /// Every PE must set the same, between collectives.
    pub fn set_collectives(&self, c: Collectives) {
        *self.inner.collectives.lock().unwrap_or_else(|e| e.into_inner()) = c;
    }

    /// How the GPU backend's collectives run now.
    pub fn collectives(&self) -> Collectives {
        *self.inner.collectives.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes shmem's kernels reach every peer through NVSHMEM's RMA
    /// (put-with-signal, get) instead of NVLink loads and stores, as
    /// `SHMEM_FORCE_RMA=1` does at start-up. Every PE must set it alike,
    /// between collectives.
    pub fn set_force_rma(&self, on: bool) {
        self.set_collectives(Collectives { force_rma: on, ..self.collectives() });
    }

    /// Whether collectives are forced onto the RMA path (see [`Context::set_force_rma`]).
    pub fn force_rma(&self) -> bool {
        self.collectives().force_rma
    }

    /// Reports, and clears, the first failure the device found since the
    /// last report.
    ///
    /// On the GPU backend an eager collective agrees on the device, and the
    /// MoE all-to-all-v ops and `MoeAllToAll`'s device path check their
    /// splits and routing there: a bad or mismatched call returns, every
    /// PE's kernels reach the same verdict and write nothing, and each PE
    /// records the failure. The first call of this PE that can see it
    /// reports it, once: a call that waits for a stream (`copy_to_host`,
    /// [`Stream::synchronize`] …), the next collective, RMA or MoE call,
    /// or [`Context::finalize`] (see [`Team`]). This method asks without
    /// making a call. Always `Ok` on the host backend, which checks before
    /// it writes.
    pub fn check_device(&self) -> Result<()> {
        self.inner.check_device()
    }

    /// The backend in use.
    pub fn backend(&self) -> BackendKind {
        self.inner.backend.kind()
    }

    /// On the GPU backend: this PE's CUDA context (for users' own kernels).
    pub fn cuda_context(&self) -> Option<&Arc<cudarc::driver::CudaContext>> {
        self.inner.backend.gpu().map(|g| &g.cuda)
    }

    /// Bytes of symmetric heap per PE.
    pub fn heap_size(&self) -> usize {
        self.inner.heap_size
    }

    /// Bytes of this PE's heap in use by live buffers.
    pub fn heap_used(&self) -> usize {
        self.inner.heap.lock().unwrap_or_else(|e| e.into_inner()).used()
    }

    /// A stream to order operations on (see [`Stream`]): on the GPU
    /// backend a new CUDA stream of this PE's GPU.
    pub fn stream(&self) -> Stream {
        match self.inner.backend.kind() {
            BackendKind::Host => Stream::default(),
            _ => Stream { cuda: self.inner.backend.new_stream(), owner: Some(Arc::downgrade(&self.inner)) },
        }
    }

    /// The team of all PEs.
    pub fn world(&self) -> Team {
        Team::from_state(self.inner.clone(), self.inner.world.clone())
    }

    /// The team of the PEs on this node.
    pub fn node(&self) -> Team {
        Team::from_state(self.inner.clone(), self.inner.node.clone())
    }

    /// Ends this PE's part in shmem after a barrier with every PE.
    ///
    /// Fails with a failure the device found that no call reported (see
    /// [`Team`]), after finalizing.
    ///
    /// # Collective
    /// Every PE calls it. Buffers and teams still alive afterwards refuse
    /// to be used.
    pub fn finalize(self) -> Result<()> {
        self.inner.check_live("context")?;
        let s = self.stream();
        let mut result = self.world().barrier_unreported(&s).and_then(|_| s.wait());
        // A failure the device found that nobody asked about yet: reported,
        // after NVSHMEM finalizes.
        let unreported = self.inner.take_device_failure();
        result = result.and_then(|_| self.inner.backend.finalize());
        let result = result.and_then(|()| unreported.map_or(Ok(()), Err));
        self.inner.finalized.store(true, Ordering::Release);
        self.inner.ctl.set_state(PeState::Finalized);
        self.inner.ctl.close_net();
        let _ = LIVE.compare_exchange(self.inner.id, 0, Ordering::AcqRel, Ordering::Relaxed);
        result
    }
}

fn nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}
