//! Collectives over a team: the public calls, their checks and agreement
//! ([`Team::begin`]), and the hand-over to the backend ([`Team::run`]):
//! the host's collectives (`host/coll.rs`) or, on the GPU, shmem's kernels
//! and NVSHMEM's collectives.

use crate::algo::{self, Solo};
use crate::buffer::SymSlice;
use crate::context::{Context, Stream};
use crate::control::DescRow;
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::gpu::abi::MAX_TEAM;
use crate::gpu::{dispatch, CudaCall, GpuWorld, Protocols};
use crate::heap::{overlap, Region};
use crate::team::{Desc, OpKind, Team};

/// What a collective needs checked before the agreement.
struct Call<'a, 'b, T: Element> {
    kind: OpKind,
    dst: SymSlice<'a, T>,
    src: SymSlice<'b, T>,
    op: Option<ReduceOp>,
    root: usize,
}

/// A call that its kernel agrees on (see `Team::agrees_on_device`): the
/// agreement's epoch and this PE's row.
pub(crate) type DeviceAgreement = (u64, DescRow);

impl Team {
    /// Checks the call locally and returns (dst, src) with how the team
    /// agrees on it: on the host, by exchanging descriptors with the team
    /// before this returns (`None`); in graph capture, not at all (`None`);
    /// on the device, by the call's kernel ([`DeviceAgreement`], see
    /// `Team::agrees_on_device`), where a PE whose own arguments failed
    /// launches the agreement alone before it returns its error. `shape`
    /// checks the regions and says whether this PE's side is its own block
    /// of the other buffer (in-place all-gather and reduce-scatter), which
    /// differs by PE and is so left out of the comparison.
    fn begin<T: Element>(
        &self,
        call: Call<'_, '_, T>,
        stream: &Stream,
        shape: impl Fn(Region, Region) -> Result<bool>,
    ) -> Result<(Region, Region, Option<DeviceAgreement>)> {
        self.check()?;
        let local = (|| {
            let d = call.dst.region(&self.ctx)?;
            let s = call.src.region(&self.ctx)?;
            if let Some(op) = call.op {
                if !op.supports(T::DTYPE) {
                    return Err(Error::UnsupportedOp { op: op.name(), dtype: T::DTYPE.name() });
                }
            }
            if call.root >= self.n_pes() {
                return Err(Error::PeOutOfRange { pe: call.root, n_pes: self.n_pes() });
            }
            let own_block = shape(s, d).map_err(|e| match e {
                Error::LengthMismatch(m) => Error::LengthMismatch(format!("{}: {m}", call.kind.name())),
                Error::Invalid(m) => Error::Invalid(format!("{}: {m}", call.kind.name())),
                e => e,
            })?;
            Ok((d, s, own_block))
        })();
        let mut desc = Desc::new(call.kind);
        desc.dtype = Some(T::DTYPE);
        desc.op = call.op;
        if let Ok((d, s, own_block)) = &local {
            desc.args = [s.offset as u64, s.len as u64, d.offset as u64, d.len as u64, call.root as u64];
            if *own_block {
                let per_pe = if call.kind == OpKind::ReduceScatter { 2 } else { 0 };
                desc.args[per_pe] = u64::MAX;
            }
        }
        let capturing = self.capturing(stream);
        if capturing {
            // A graph replays without the host: arguments are checked here
            // only, and the device path must take the call (see gpu_collective).
            let (d, s, _) = local?;
            return Ok((d, s, None));
        }
        if self.agrees_on_device(capturing) {
            let (epoch, row) = self.device_row(&desc, local.as_ref().err());
            return match local {
                Ok((d, s, _)) => Ok((d, s, Some((epoch, row)))),
                Err(e) => {
                    // The peers' kernels wait for this PE's row. Should the
                    // launch fail, the context is lost anyway (the next
                    // synchronisation says so): the caller's error first.
                    let _ = self.agree_alone((epoch, row), stream);
                    Err(e)
                }
            };
        }
        let rows = self.exchange(&desc, local.as_ref().err())?;
        let (d, s, _) = local?;
        self.agree(&rows)?;
        Ok((d, s, None))
    }

    /// Launches the agreement on the device alone (`shmem_agree`), for a
    /// call this PE does not make: its row carries its error.
    pub(crate) fn agree_alone(&self, (epoch, row): DeviceAgreement, stream: &Stream) -> Result<()> {
        let g = self.ctx.backend.gpu().expect("the device agrees on the GPU backend");
        let k = g.kernels.as_ref().expect("the device agrees with shmem's kernels");
        let force = self.ctx.collectives.lock().unwrap_or_else(|e| e.into_inner()).force_rma;
        let t = k.team(self.state.slot, &self.state.members, force)?.agreeing(epoch, row);
        k.agree(t, g.stream(stream.cuda_stream()).cu_stream())
    }

    /// The error of this call's agreement, which its kernel found failed
    /// (after a synchronisation): the first failure since the last look,
    /// which is this one unless an earlier went unreported.
    pub(crate) fn failed_agreement(&self) -> Error {
        self.ctx.take_agreement_error().unwrap_or_else(|| {
            Error::CollectiveMismatch(format!(
                "a collective on the team of PEs {:?} failed its agreement",
                self.state.members
            ))
        })
    }

    /// Whether this team's collectives take the node-aware forms now, where
    /// a byte crosses between nodes once ([`crate::AcrossNodes`]): where
    /// the settings and the team's shape say so; on the gpu backend also
    /// where shmem's own kernels run the collectives, the node's PEs reach
    /// each other over NVLink and two blocks of a kernel are resident at
    /// once.
    pub fn node_aware(&self) -> bool {
        let cfg = *self.ctx.collectives.lock().unwrap_or_else(|e| e.into_inner());
        let host = algo::node_aware(self.state.shape, cfg.across_nodes, cfg.force_rma);
        match self.ctx.backend.gpu() {
            None => host,
            Some(g) => host && self.gpu_rails(g).is_some(),
        }
    }

    /// The members on each node where the gpu backend's node-aware kernels
    /// take this team's collectives now (see [`Team::node_aware`]): the
    /// same on every member (the settings, the topology and the resident
    /// blocks agreed at start are).
    fn gpu_rails(&self, g: &GpuWorld) -> Option<usize> {
        let cfg = *self.ctx.collectives.lock().unwrap_or_else(|e| e.into_inner());
        let shape = self.state.shape;
        if !algo::node_aware(shape, cfg.across_nodes, cfg.force_rma) {
            return None;
        }
        let k = g.kernels.as_ref().filter(|_| algo::kernels_take(cfg.implementation, self.n_pes()))?;
        k.rail_channels()?;
        let (per_node, node) = (shape.per_node, self.my_pe() / shape.per_node);
        let members = &self.state.members[node * per_node..(node + 1) * per_node];
        members.iter().all(|&pe| g.peer_base[pe].is_some()).then_some(per_node)
    }

    /// Whether `stream` is being captured into a CUDA graph (GPU backend).
    fn capturing(&self, stream: &Stream) -> bool {
        self.ctx.backend.gpu().is_some_and(|g| crate::gpu::capturing(g.stream(stream.cuda_stream())))
    }

    /// Copies `root`'s `src` into every PE's `dst`.
    ///
    /// # Collective
    pub fn broadcast<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        root: usize,
        _stream: &Stream,
    ) -> Result<()> {
        let call = Call { kind: OpKind::Broadcast, dst: dst.into(), src: src.into(), op: None, root };
        let (d, s, agreement) = self.begin(call, _stream, |s, d| {
            if s.len != d.len {
                return Err(Error::LengthMismatch(format!("src has {} elements, dst {}", s.len, d.len)));
            }
            Ok(false)
        })?;
        self.run::<T>(OpKind::Broadcast, d, s, None, root, agreement, _stream)
    }

    /// Gathers every PE's `src` into `dst` (`n_pes × src.len()`
    /// elements, PE order). `src` may be this PE's own block of `dst`.
    ///
    /// # Collective
    pub fn all_gather<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        _stream: &Stream,
    ) -> Result<()> {
        let n = self.n_pes();
        let me = self.my_pe();
        let call = Call { kind: OpKind::AllGather, dst: dst.into(), src: src.into(), op: None, root: 0 };
        let elem = size_of::<T>();
        let mine = |d: Region, s: Region| Region { offset: d.offset + me * s.len * elem, len: s.len };
        let (d, s, agreement) = self.begin(call, _stream, |s, d| {
            if d.len != s.len * n {
                return Err(Error::LengthMismatch(format!("dst has {} elements, expected {n} × {}", d.len, s.len)));
            }
            if overlap(d, s, elem) && s != mine(d, s) {
                return Err(Error::Invalid("src overlaps dst but is not this PE's block of it".into()));
            }
            Ok(s == mine(d, s) && n > 1)
        })?;
        self.run::<T>(OpKind::AllGather, d, s, None, 0, agreement, _stream)
    }

    /// Reduces every PE's `src` element-wise into every PE's `dst`.
    /// `dst` and `src` may be the same slice (in place).
    ///
    /// # Collective
    pub fn all_reduce<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        op: ReduceOp,
        _stream: &Stream,
    ) -> Result<()> {
        let call = Call { kind: OpKind::AllReduce, dst: dst.into(), src: src.into(), op: Some(op), root: 0 };
        let elem = size_of::<T>();
        let (d, s, agreement) = self.begin(call, _stream, |s, d| {
            if s.len != d.len {
                return Err(Error::LengthMismatch(format!("src has {} elements, dst {}", s.len, d.len)));
            }
            if overlap(d, s, elem) && d != s {
                return Err(Error::Invalid("src and dst overlap without being the same slice".into()));
            }
            Ok(false)
        })?;
        self.run::<T>(OpKind::AllReduce, d, s, Some(op), 0, agreement, _stream)
    }

    /// Reduces every PE's `src` (`n_pes × dst.len()` elements) and leaves
    /// block `i` of the result in PE `i`'s `dst`.
    ///
    /// # Collective
    pub fn reduce_scatter<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        op: ReduceOp,
        _stream: &Stream,
    ) -> Result<()> {
        let n = self.n_pes();
        let me = self.my_pe();
        let elem = size_of::<T>();
        let call = Call { kind: OpKind::ReduceScatter, dst: dst.into(), src: src.into(), op: Some(op), root: 0 };
        let (d, s, agreement) = self.begin(call, _stream, |s, d| {
            if s.len != d.len * n {
                return Err(Error::LengthMismatch(format!("src has {} elements, expected {n} × {}", s.len, d.len)));
            }
            let mine = Region { offset: s.offset + me * d.len * elem, len: d.len };
            if overlap(d, s, elem) && d != mine {
                return Err(Error::Invalid("dst overlaps src but is not this PE's block of it".into()));
            }
            Ok(d == mine && n > 1)
        })?;
        self.run::<T>(OpKind::ReduceScatter, d, s, Some(op), 0, agreement, _stream)
    }

    /// Sends block `j` of this PE's `src` to PE `j`, which stores it as
    /// block `i` (this PE's index) of its `dst`. Both hold `n_pes` equal
    /// blocks; `dst` may be `src` (in place).
    ///
    /// # Collective
    pub fn all_to_all<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        _stream: &Stream,
    ) -> Result<()> {
        let n = self.n_pes();
        let elem = size_of::<T>();
        let call = Call { kind: OpKind::AllToAll, dst: dst.into(), src: src.into(), op: None, root: 0 };
        let (d, s, agreement) = self.begin(call, _stream, |s, d| {
            if s.len != d.len || s.len % n != 0 {
                return Err(Error::LengthMismatch(format!(
                    "src ({}) and dst ({}) must have the same length, a multiple of {n}",
                    s.len, d.len
                )));
            }
            if overlap(d, s, elem) && d != s {
                return Err(Error::Invalid("src and dst overlap without being the same slice".into()));
            }
            Ok(false)
        })?;
        self.run::<T>(OpKind::AllToAll, d, s, None, 0, agreement, _stream)
    }

    /// Runs a call that `begin` checked and agreed on (or left to the
    /// device to agree on) on this team's backend.
    #[allow(clippy::too_many_arguments)]
    fn run<T: Element>(
        &self,
        kind: OpKind,
        d: Region,
        s: Region,
        op: Option<ReduceOp>,
        root: usize,
        agreement: Option<DeviceAgreement>,
        stream: &Stream,
    ) -> Result<()> {
        let Some(t) = self.host() else {
            let g = self.ctx.backend.gpu().expect("the gpu backend, where not the host's");
            return self.ctx.report(self.gpu_collective::<T>(g, kind, d, s, op, root, agreement, stream));
        };
        let op = op.unwrap_or(ReduceOp::Sum);
        match kind {
            OpKind::Broadcast => t.broadcast::<T>(d, s, root),
            OpKind::AllGather => t.all_gather::<T>(d, s),
            OpKind::AllReduce => t.all_reduce::<T>(d, s, op),
            OpKind::ReduceScatter => t.reduce_scatter::<T>(d, s, op),
            OpKind::AllToAll => t.all_to_all::<T>(d, s),
            other => unreachable!("{} is not a data collective", other.name()),
        }
    }

    /// A collective on the GPU backend, on the stream: shmem's kernel, or
    /// NVSHMEM's team collective where asked ([`crate::CollImpl::Nvshmem`])
    /// or where no kernel applies (teams larger than the kernels take).
    /// With `agreement`, the kernel agrees on the call first (and host-issued
    /// work waits for its verdict). Its callers report a failure the device
    /// found in an earlier call once it is issued (`Inner::report`).
    #[allow(clippy::too_many_arguments)]
    fn gpu_collective<T: Element>(
        &self,
        g: &GpuWorld,
        kind: OpKind,
        d: Region,
        s: Region,
        op: Option<ReduceOp>,
        root: usize,
        agreement: Option<DeviceAgreement>,
        stream: &Stream,
    ) -> Result<()> {
        let st = g.stream(stream.cuda_stream());
        let elem = size_of::<T>();
        let cfg = *self.ctx.collectives.lock().unwrap_or_else(|e| e.into_inner());
        let kernels = g.kernels.as_ref().filter(|_| algo::kernels_take(cfg.implementation, self.n_pes()));
        if let Some(k) = kernels {
            // A team of one: the result is the source as it is (see
            // `Tuning::solo_copy_engine_min_bytes`); `begin` made both the
            // same length.
            if self.n_pes() == 1 {
                let bytes = d.len * elem;
                let reduces = matches!(kind, OpKind::AllReduce | OpKind::ReduceScatter);
                let overlapping = overlap(d, s, elem);
                match algo::solo(d == s, bytes, overlapping, reduces, self.capturing(stream), &cfg.tuning) {
                    Solo::Nothing => return Ok(()),
                    Solo::CopyEngine => return g.copy(g.addr(d.offset), g.addr(s.offset), bytes, st),
                    Solo::Kernel => {}
                }
            }
            // Every (dtype, op) that `begin` accepted has a kernel.
            let team = &self.state;
            let plain = k.team(team.slot, &team.members, cfg.force_rma)?;
            let t = agreement.map_or(plain, |(epoch, row)| plain.agreeing(epoch, row));
            let cu = st.cu_stream();
            let (dt, op) = (T::DTYPE, op.unwrap_or(ReduceOp::Sum));
            let p = Protocols::new(team.slot == 0, k.lines(), &cfg.tuning);
            let rails = self.gpu_rails(g);
            if let Some(per_node) = rails {
                let order = cfg.reduce_order;
                match kind {
                    OpKind::AllGather => {
                        let (bytes, in_place) = (s.len * elem, overlap(d, s, elem));
                        return k.all_gather_nodes(t, per_node, d.offset, s.offset, bytes, in_place, cu);
                    }
                    OpKind::Broadcast => {
                        return k.broadcast_nodes(t, per_node, d.offset, s.offset, d.len * elem, root, cu);
                    }
                    OpKind::AllReduce => {
                        return k.all_reduce_nodes(t, per_node, order, dt, op, d.offset, s.offset, d.len, cu);
                    }
                    OpKind::ReduceScatter => {
                        return k.reduce_scatter_nodes(t, per_node, order, dt, op, d.offset, s.offset, d.len, cu);
                    }
                    OpKind::AllToAll if !overlap(d, s, elem) => {
                        let per_pe = d.len / self.n_pes() * elem;
                        return k.all_to_all_nodes(t, per_node, d.offset, s.offset, per_pe, cu);
                    }
                    // The in-place all-to-all: below.
                    _ => {}
                }
            }
            // Copy engines need every member's NVLink address.
            let nvlink = !cfg.force_rma && team.members.iter().all(|&pe| g.peer_base[pe].is_some());
            return match kind {
                OpKind::AllReduce => k.all_reduce(t, p, cfg.all_reduce, dt, op, d.offset, s.offset, d.len, cu),
                OpKind::ReduceScatter => k.reduce_scatter(t, p, dt, op, d.offset, s.offset, d.len, cu),
                OpKind::AllGather => {
                    let in_place = overlap(d, s, elem);
                    let bytes = s.len * elem;
                    if algo::all_gather_by_copy_engine(cfg.all_gather, nvlink) {
                        // The copies are issued from the host: not before
                        // the call is agreed (copy engines pay off for large
                        // all-gathers, where a synchronisation costs
                        // little). The choice of path reads settings and
                        // the topology only, the same on every member.
                        if t.agreement() != 0 {
                            k.agree(t, cu)?;
                            st.synchronize().cuda("cuStreamSynchronize")?;
                            if k.agreement_failed(&t) {
                                return Err(self.failed_agreement());
                            }
                        }
                        k.all_gather_ce(g, plain, &team.members, d.offset, s.offset, bytes, in_place, cu)
                    } else {
                        k.all_gather(t, p, d.offset, s.offset, bytes, in_place, cu)
                    }
                }
                OpKind::Broadcast => {
                    let bytes = d.len * elem;
                    let form = algo::broadcast_form(nvlink, self.n_pes(), bytes, &cfg.tuning);
                    k.broadcast(form, t, p, d.offset, s.offset, bytes, root, cu)
                }
                OpKind::AllToAll => {
                    let per_pe = d.len / self.n_pes() * elem;
                    if !overlap(d, s, elem) || algo::all_to_all_in_place(p.shape(&t), per_pe, &cfg.tuning) {
                        return k.all_to_all(t, p, d.offset, s.offset, per_pe, cu);
                    }
                    // In place: this PE's blocks go out from a copy, as peers
                    // write into the same buffer (by the node-aware kernel
                    // where the world takes it).
                    if self.capturing(stream) {
                        return Err(Error::Invalid(
                            "an in-place all_to_all cannot be captured in a CUDA graph (it goes through a \
                             temporary copy): use separate source and destination buffers"
                                .into(),
                        ));
                    }
                    let sc = match self.ctx.scratch(s.len * elem) {
                        Ok(sc) => sc,
                        Err(e) => {
                            // Peers whose calls differ took another path and
                            // wait for this PE's row (where the calls match,
                            // every PE fails here alike).
                            if t.agreement() != 0 {
                                let _ = k.agree(t, cu);
                            }
                            return Err(e);
                        }
                    };
                    g.copy(g.addr(sc.offset), g.addr(s.offset), s.len * elem, st)?;
                    match rails {
                        Some(per_node) => k.all_to_all_nodes(t, per_node, d.offset, sc.offset, per_pe, cu)?,
                        None => k.all_to_all(t, p, d.offset, sc.offset, per_pe, cu)?,
                    }
                    st.synchronize().cuda("cuStreamSynchronize")?;
                    drop(sc);
                    // Synchronised anyway: the call itself reports its
                    // failed agreement (peers on another path may report
                    // it from their next synchronisation).
                    if k.agreement_failed(&t) {
                        return Err(self.failed_agreement());
                    }
                    Ok(())
                }
                other => unreachable!("{} is not a data collective", other.name()),
            };
        }
        debug_assert!(agreement.is_none(), "NVSHMEM's collectives are agreed on the host");
        let (team, dt) = (self.state.nv_team, T::DTYPE);
        if team == crate::gpu::TEAM_INVALID {
            return Err(Error::Invalid(format!(
                "{} through NVSHMEM's collectives: NVSHMEM has no team for this team (it is within a node whose PEs \
                 are not consecutive ranks); shmem's own kernels can run it",
                kind.name()
            )));
        }
        if self.capturing(stream) {
            return Err(Error::Invalid(format!(
                "{} through NVSHMEM's collectives cannot be captured in a CUDA graph: they are called from the \
                 host (shmem's own kernels can, and run unless CollImpl::Nvshmem is chosen or the team has more \
                 than {} PEs)",
                kind.name(),
                MAX_TEAM
            )));
        }
        // NVSHMEM's reduce-scatter stages every member's block in half its
        // reduce scratch and writes past it where they do not fit (see
        // `nvshmem_reduce_scratch`). Every member sees the same agreed call
        // and setting: all refuse it, before anything is written.
        let most = g.nv_reduce_scratch / 2;
        if kind == OpKind::ReduceScatter && s.len * elem > most {
            return Err(Error::Invalid(format!(
                "reduce_scatter through NVSHMEM's collectives (CollImpl::Nvshmem): a source of {} bytes on a team of \
                 {} PEs does not fit the half of NVSHMEM's reduce scratch its reduce-scatter uses ({most} bytes), \
                 and NVSHMEM would write past it; raise NVSHMEM_REDUCE_SCRATCH_SIZE (on every PE) to at least \
                 twice the source, or let shmem's own kernels run it",
                s.len * elem,
                self.n_pes()
            )));
        }
        // NVSHMEM wants source and destination apart (a reduction may be
        // exactly in place): otherwise the source goes through a copy.
        let apart = !overlap(d, s, elem) || (kind == OpKind::AllReduce && d == s);
        let scratch = if apart { None } else { Some(self.ctx.scratch(s.len * elem)?) };
        let src = match &scratch {
            Some(sc) => {
                g.copy(g.addr(sc.offset), g.addr(s.offset), s.len * elem, st)?;
                g.addr(sc.offset)
            }
            None => g.addr(s.offset),
        };
        let (dst, cu) = (g.addr(d.offset), st.cu_stream());
        // SAFETY: symmetric regions checked and agreed by every member; the
        // element counts match the regions (checked by `begin`).
        let rc = unsafe {
            match kind {
                OpKind::Broadcast => dispatch::broadcast(g.nv, dt, team, dst, src, d.len, root as i32, cu)?,
                OpKind::AllGather => dispatch::fcollect(g.nv, dt, team, dst, src, s.len, cu)?,
                OpKind::AllReduce => {
                    dispatch::reduce(g.nv, dt, op.unwrap_or(ReduceOp::Sum), team, dst, src, d.len, cu)?
                }
                OpKind::ReduceScatter => {
                    dispatch::reducescatter(g.nv, dt, op.unwrap_or(ReduceOp::Sum), team, dst, src, d.len, cu)?
                }
                OpKind::AllToAll => dispatch::alltoall(g.nv, dt, team, dst, src, d.len / self.n_pes(), cu)?,
                other => unreachable!("{} is not a data collective", other.name()),
            }
        };
        crate::gpu::check(kind.name(), rc)?;
        if let Some(sc) = scratch {
            // Peers may read this PE's copy until every PE is done with it.
            st.synchronize().cuda("cuStreamSynchronize")?;
            self.raw_barrier()?;
            drop(sc);
        }
        Ok(())
    }
}

/// The world team's collectives.
impl Context {
    /// Blocks until every PE has arrived (NVSHMEM's `barrier_all`).
    ///
    /// # Collective
    pub fn barrier_all(&self, stream: &Stream) -> Result<()> {
        self.world().barrier(stream)
    }

    /// [`Team::broadcast`] over the world.
    ///
    /// # Collective
    pub fn broadcast<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.world().broadcast(dst, src, root, stream)
    }

    /// [`Team::all_gather`] over the world.
    ///
    /// # Collective
    pub fn all_gather<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        stream: &Stream,
    ) -> Result<()> {
        self.world().all_gather(dst, src, stream)
    }

    /// [`Team::all_reduce`] over the world.
    ///
    /// # Collective
    pub fn all_reduce<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.world().all_reduce(dst, src, op, stream)
    }

    /// [`Team::reduce_scatter`] over the world.
    ///
    /// # Collective
    pub fn reduce_scatter<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.world().reduce_scatter(dst, src, op, stream)
    }

    /// [`Team::all_to_all`] over the world.
    ///
    /// # Collective
    pub fn all_to_all<'a, 'b, T: Element>(
        &self,
        dst: impl Into<SymSlice<'a, T>>,
        src: impl Into<SymSlice<'b, T>>,
        stream: &Stream,
    ) -> Result<()> {
        self.world().all_to_all(dst, src, stream)
    }

    /// A team of world PEs `start, start + stride, …` (`size` of them);
    /// `None` on PEs outside it.
    ///
    /// # Collective
    pub fn team_split_strided(&self, start: usize, stride: usize, size: usize) -> Result<Option<Team>> {
        self.world().split_strided(start, stride, size)
    }
}
