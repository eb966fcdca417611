//! The gpu backend's collectives: a call that the public layer checked and
//! agreed on, or whose agreement it leaves to the kernel
//! ([`DeviceAgreement`]), becomes shmem's kernel on the stream, or
//! NVSHMEM's team collective where asked ([`crate::CollImpl::Nvshmem`]) or
//! where no kernel applies.

use super::abi::MAX_TEAM;
use super::kernels::Kernels;
use super::{capturing, check, dispatch, CudaCall, GpuWorld, Protocols, TEAM_INVALID};
use crate::algo::{self, Collectives, Solo};
use crate::control::op::OpKind;
use crate::control::team::TeamState;
use crate::control::Control;
use crate::desc::{Collective, DeviceAgreement, On};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::heap::{overlap, Allocator, Scratch};
use std::sync::Mutex;

/// One PE's view of a team on the gpu backend, for the length of one call.
pub(crate) struct GpuTeam<'a> {
    pub(crate) g: &'a GpuWorld,
    pub(crate) ctl: &'a Control,
    pub(crate) state: &'a TeamState,
    pub(crate) alloc: &'a Mutex<Allocator>,
    /// The settings when the call was made (the same on every member).
    pub(crate) cfg: Collectives,
    /// The error of a call whose agreement the kernel found failed, read
    /// after a synchronisation.
    pub(crate) failed: &'a dyn Fn() -> Error,
}

impl GpuTeam<'_> {
    /// Whether every member is reached over NVLink (RMA not forced).
    pub(crate) fn nvlink(&self) -> bool {
        !self.cfg.force_rma && self.state.members.iter().all(|&pe| self.g.peer_base[pe].is_some())
    }

    pub(crate) fn n_pes(&self) -> usize {
        self.state.members.len()
    }

    fn scratch(&self, bytes: usize) -> Result<Scratch<'_>> {
        Scratch::take(self.alloc, bytes)
    }

    fn raw_barrier(&self) -> Result<()> {
        self.ctl.barrier(self.state)
    }

    /// The members on each node where the node-aware kernels take this
    /// team's collectives now (see [`crate::Team::node_aware`]): the same
    /// on every member (the settings, the topology and the resident blocks
    /// agreed at start are).
    pub(crate) fn rails(&self) -> Option<usize> {
        let (g, cfg, shape) = (self.g, self.cfg, self.state.shape);
        if !algo::node_aware(shape, cfg.across_nodes, cfg.force_rma) {
            return None;
        }
        let k = g.kernels.as_ref().filter(|_| algo::kernels_take(cfg.implementation, self.n_pes()))?;
        k.rail_channels()?;
        let (per_node, node) = (shape.per_node, self.state.my_index / shape.per_node);
        let members = &self.state.members[node * per_node..(node + 1) * per_node];
        members.iter().all(|&pe| g.peer_base[pe].is_some()).then_some(per_node)
    }

    /// Whether this PE's eager call (not `capturing`) of a collective
    /// kernel or barrier on this team is agreed on the device, by the
    /// call's kernel, rather than on the host: shmem's kernels take the
    /// team's collectives, and the team has more than one PE. The same on
    /// every member (each setting it reads must be).
    pub(crate) fn agrees_on_device(&self, capturing: bool) -> bool {
        let n = self.n_pes();
        !capturing && self.g.kernels.is_some() && n > 1 && algo::kernels_take(self.cfg.implementation, n)
    }

    /// shmem's barrier kernel on the stream, agreeing on the call first
    /// where given an agreement. Its waits end (trap) after the device's
    /// wait limit: a peer that dies mid-barrier cannot hang the survivors,
    /// as NVSHMEM's barrier, which waits for ever, would.
    fn kernel_barrier(&self, k: &Kernels, agreement: Option<DeviceAgreement>, stream: On<'_>) -> Result<()> {
        let mut t = k.team(self.state.slot, &self.state.members, self.cfg.force_rma)?;
        if let Some((epoch, row)) = agreement {
            t = t.agreeing(epoch, row);
        }
        k.barrier(t, self.g.stream(stream).cu_stream())
    }

    /// The barrier where it needs no exchange on the host: in a CUDA graph
    /// (without the host), or agreed on the device ([`Self::agrees_on_device`];
    /// `row` gives this PE's agreement), this PE's puts completing first as
    /// with NVSHMEM's barrier. `None` where the host agrees first.
    pub(crate) fn barrier_on_device(
        &self,
        row: impl FnOnce() -> DeviceAgreement,
        stream: On<'_>,
    ) -> Option<Result<()>> {
        let k = self.g.kernels.as_ref()?;
        let st = self.g.stream(stream);
        let capturing = capturing(st);
        if capturing {
            return Some(self.kernel_barrier(k, None, stream));
        }
        if !self.agrees_on_device(capturing) {
            return None;
        }
        let agreement = row();
        Some(self.g.quiet(st).and_then(|()| self.kernel_barrier(k, Some(agreement), stream)))
    }

    /// The barrier of a call the host agreed on: this PE's puts complete,
    /// then shmem's barrier kernel, or NVSHMEM's without the kernels.
    pub(crate) fn barrier_agreed(&self, stream: On<'_>) -> Result<()> {
        let (g, st) = (self.g, self.g.stream(stream));
        if self.n_pes() == 1 {
            // A one-PE team waits for nobody: the barrier is the quiet.
            // (NVSHMEM's barrier kernel on a one-PE team read address 0x10
            // on the box: invalid reads under memcheck, an illegal address
            // under racecheck.)
            return g.quiet(st);
        }
        match &g.kernels {
            Some(k) => g.quiet(st).and_then(|()| self.kernel_barrier(k, None, stream)),
            None if self.state.nv_team == TEAM_INVALID => Err(Error::BackendUnavailable(
                "a barrier of a team NVSHMEM has no team for (a node whose PEs are not consecutive ranks) needs the \
                 device kernels"
                    .into(),
            )),
            None => g.barrier(self.state.nv_team, st),
        }
    }

    /// Launches the agreement on the device alone (`shmem_agree`), for a
    /// call this PE does not make: its row carries its error.
    pub(crate) fn agree_alone(&self, (epoch, row): DeviceAgreement, stream: On<'_>) -> Result<()> {
        let k = self.g.kernels.as_ref().expect("the device agrees with shmem's kernels");
        let t = k.team(self.state.slot, &self.state.members, self.cfg.force_rma)?.agreeing(epoch, row);
        k.agree(t, self.g.stream(stream).cu_stream())
    }

    /// A collective on the GPU backend, on the stream: shmem's kernel, or
    /// NVSHMEM's team collective where asked ([`crate::CollImpl::Nvshmem`])
    /// or where no kernel applies (teams larger than the kernels take).
    /// With `agreement`, the kernel agrees on the call first (and host-issued
    /// work waits for its verdict). Its callers report a failure the device
    /// found in an earlier call once it is issued (`Inner::report`).
    pub(crate) fn collective<T: Element>(&self, c: Collective, stream: On<'_>) -> Result<()> {
        let Collective { kind, dst: d, src: s, op, root, agreement } = c;
        let (g, cfg) = (self.g, self.cfg);
        let st = g.stream(stream);
        let elem = size_of::<T>();
        let kernels = g.kernels.as_ref().filter(|_| algo::kernels_take(cfg.implementation, self.n_pes()));
        if let Some(k) = kernels {
            // A team of one: the result is the source as it is (see
            // `Tuning::solo_copy_engine_min_bytes`); `begin` made both the
            // same length.
            if self.n_pes() == 1 {
                let bytes = d.len * elem;
                let reduces = matches!(kind, OpKind::AllReduce | OpKind::ReduceScatter);
                let overlapping = overlap(d, s, elem);
                match algo::solo(d == s, bytes, overlapping, reduces, capturing(st), &cfg.tuning) {
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
            let rails = self.rails();
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
            let nvlink = self.nvlink();
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
                                return Err((self.failed)());
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
                    if capturing(st) {
                        return Err(Error::Invalid(
                            "an in-place all_to_all cannot be captured in a CUDA graph (it goes through a \
                             temporary copy): use separate source and destination buffers"
                                .into(),
                        ));
                    }
                    let sc = match self.scratch(s.len * elem) {
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
                        return Err((self.failed)());
                    }
                    Ok(())
                }
                other => unreachable!("{} is not a data collective", other.name()),
            };
        }
        debug_assert!(agreement.is_none(), "NVSHMEM's collectives are agreed on the host");
        let (team, dt) = (self.state.nv_team, T::DTYPE);
        if team == TEAM_INVALID {
            return Err(Error::Invalid(format!(
                "{} through NVSHMEM's collectives: NVSHMEM has no team for this team (it is within a node whose PEs \
                 are not consecutive ranks); shmem's own kernels can run it",
                kind.name()
            )));
        }
        if capturing(st) {
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
        let scratch = if apart { None } else { Some(self.scratch(s.len * elem)?) };
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
        check(kind.name(), rc)?;
        if let Some(sc) = scratch {
            // Peers may read this PE's copy until every PE is done with it.
            st.synchronize().cuda("cuStreamSynchronize")?;
            self.raw_barrier()?;
            drop(sc);
        }
        Ok(())
    }
}
