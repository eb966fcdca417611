//! [`MoeAllToAll`]'s node-aware form: a token crosses the network at most
//! once per destination node.
//!
//! Where the world spans two nodes or more, its ranks node by node (as
//! the node-aware collectives want it, see [`crate::AcrossNodes`]), the
//! dispatch runs in two stages:
//!
//! 1. **rail**: each PE sends one wire row per (token, destination node)
//!    over its *rail* (the PEs of its local rank, one a node) to its rail
//!    peer on that node, its slots naming the node's experts (`g mod
//!    L·experts_per_pe`, `L` PEs a node) and its token field the source
//!    PE as well as the token ([`ORIGIN_SHIFT`]). The rows for the
//!    source's own node go to itself: a copy, not the network.
//! 2. **node**: each PE takes the rows its rail staged (from every node,
//!    in node order) as its input and sends one row per (row, destination
//!    PE of its node) over the node, as the flat form sends tokens; the
//!    destination expands them into its experts' blocks, each row naming
//!    its source, so the view is the flat form's.
//!
//! The combine reverses it: each expert PE weighs and sums its experts'
//! outputs for a row (as the flat form does) and sends the partial back
//! over the node; the forwarding PE sums the node's partials of each rail
//! row in ascending PE order, rounds once, and sends one row back over
//! the rail; the source sums its nodes' rows in ascending node order.

use super::layer::{
    bytes_of, read_elems, CombineElement, Forward, Layout, MoeAllToAll, MoeConfig, WireBuffers, ORIGIN_SHIFT,
};
use crate::buffer::SymmetricBuffer;
use crate::context::{Context, Stream};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::gpu::CudaCall;
use crate::moe::Agreement;
use crate::team::{Desc, OpKind, Team};

/// The node-aware form's teams and the buffers of its rail stage (the
/// node stage uses the exchange's own buffers).
pub(super) struct Rails {
    /// This PE's rail: the PEs of its local rank, member `a` on node `a`.
    pub(super) rail: Team,
    /// This PE's node.
    pub(super) node: Team,
    /// Nodes (`N`) and PEs on each (`L`).
    pub(super) nodes: usize,
    pub(super) per_node: usize,
    /// Rail rows out (the dispatch), and the node sums that come back (the
    /// combine): `max_tokens × min(top_k, N)` rows.
    pub(super) send: SymmetricBuffer<u8>,
    /// Rail rows in (the dispatch), and in the native format the node sums
    /// that go back: `max_tokens × N` rows.
    pub(super) stage: SymmetricBuffer<u8>,
    /// The FP8 format's node sums before they go back (its staged rows are
    /// too short to hold them).
    pub(super) partials: Option<SymmetricBuffer<u8>>,
    /// The rail exchange's splits (`N`), its out splits/offsets and the
    /// combine's (`2 × N` each).
    pub(super) splits: SymmetricBuffer<i64>,
    pub(super) stage_so: SymmetricBuffer<i64>,
    pub(super) back_so: SymmetricBuffer<i64>,
    /// The device path's node row of each (rail row, slot), and its count
    /// of rail rows (the forwarder's `slot_rows` and `state`).
    pub(super) slot_rows: SymmetricBuffer<i64>,
    pub(super) state: SymmetricBuffer<i64>,
}

/// Nodes and PEs a node where the layer of `world` takes the node-aware
/// form under the current settings: the node-aware collectives' rule
/// ([`crate::algo::node_aware`]).
pub(super) fn node_aware_shape(world: &Team) -> Option<(usize, usize)> {
    let cfg = *world.ctx.collectives.lock().unwrap_or_else(|e| e.into_inner());
    let ctl = &world.ctx.ctl;
    let shape = crate::algo::NodeShape::of(true, &world.state.members, |pe| ctl.node_of(pe));
    crate::algo::node_aware(shape, cfg.across_nodes, cfg.force_rma).then_some((shape.nodes, shape.per_node))
}

impl MoeConfig {
    /// Rail rows one PE sends at most: one per (token, destination node).
    pub(super) fn rail_send_rows(&self, nodes: usize) -> Option<usize> {
        self.max_tokens.checked_mul(self.top_k.min(nodes))
    }

    /// Rail rows one PE stages at most: each node's rail peer sends each
    /// token once.
    pub(super) fn rail_stage_rows(&self, nodes: usize) -> Option<usize> {
        self.max_tokens.checked_mul(nodes)
    }

    /// Node rows one PE forwards at most: each staged rail row once to
    /// each PE of its node that holds one of its experts.
    pub(super) fn node_send_rows(&self, nodes: usize, per_node: usize) -> Option<usize> {
        self.rail_stage_rows(nodes)?.checked_mul(self.top_k.min(per_node))
    }
}

impl Rails {
    /// The rail team and the rail stage's buffers.
    ///
    /// # Collective
    /// Every PE of the world calls it, with the same arguments.
    pub(super) fn new(
        ctx: &Context,
        c: &MoeConfig,
        (stride, back_stride, fp8): (usize, usize, bool),
        (nodes, per_node): (usize, usize),
    ) -> Result<Rails> {
        let world = ctx.world();
        let mut rail = None;
        for i in 0..per_node {
            if let Some(t) = world.split_strided(i, per_node, nodes)? {
                rail = Some(t);
            }
        }
        let rail = rail.ok_or_else(|| Error::Invalid("MoeAllToAll::new: this PE is on no rail".into()))?;
        let too_big = || Error::Invalid(format!("MoeAllToAll::new: the buffers of {c:?} on {nodes} nodes overflow"));
        let send_rows = c.rail_send_rows(nodes).ok_or_else(too_big)?;
        let stage_rows = c.rail_stage_rows(nodes).ok_or_else(too_big)?;
        let forwarded = stage_rows.checked_mul(c.top_k).ok_or_else(too_big)?;
        let bytes = |rows: usize, stride: usize| rows.checked_mul(stride).ok_or_else(too_big);
        Ok(Rails {
            send: ctx.alloc(bytes(send_rows, stride.max(back_stride))?)?,
            stage: ctx.alloc(bytes(stage_rows, stride)?)?,
            partials: if fp8 { Some(ctx.alloc(bytes(stage_rows, back_stride)?)?) } else { None },
            splits: ctx.alloc(nodes)?,
            stage_so: ctx.alloc(2 * nodes)?,
            back_so: ctx.alloc(2 * nodes)?,
            slot_rows: ctx.alloc(forwarded)?,
            state: ctx.alloc(2)?,
            node: ctx.node(),
            rail,
            nodes,
            per_node,
        })
    }

    /// Bytes of symmetric memory these buffers hold.
    pub(super) fn memory_bytes(&self) -> usize {
        let i64s = self.splits.len + self.stage_so.len + self.back_so.len + self.slot_rows.len + self.state.len;
        self.send.len + self.stage.len + self.partials.as_ref().map_or(0, |p| p.len) + i64s * size_of::<i64>()
    }
}

impl<T: Element> MoeAllToAll<T> {
    /// The rails of the node-aware form.
    fn rails(&self) -> &Rails {
        self.rails.as_ref().expect("the node-aware form")
    }

    /// The rail dispatch's exchange: rail rows from the rail's `send` into
    /// its `stage`.
    pub(super) fn rail_out_buffers(&self) -> WireBuffers<'_> {
        let r = self.rails();
        let send = r.send.slice(0..r.send.len / self.wire.stride.max(self.wire.back_stride) * self.wire.stride);
        (send, (&r.stage).into(), (&r.splits).into(), (&r.stage_so).into())
    }

    /// The rail combine's exchange: the node sums back into the rail's `send`.
    pub(super) fn rail_back_buffers(&self) -> WireBuffers<'_> {
        let (r, w) = (self.rails(), self.wire);
        let sums = r.partials.as_ref().map_or(&r.stage, |p| p);
        let send = r.send.slice(0..r.send.len / w.stride.max(w.back_stride) * w.back_stride);
        (sums.into(), send, r.stage_so.slice(0..r.nodes), (&r.back_so).into())
    }

    /// Agrees on this PE's call `kind` (a dispatch or a combine of the
    /// node-aware form) with every PE of the world before any of its
    /// exchanges: where `pre` failed on one PE, or the PEs' calls differ,
    /// it fails on every PE (the failing PE with its own error, the others
    /// with a mismatch naming it and the reason), so that no PE enters a
    /// stage that another left.
    ///
    /// On the host backend (and for a world larger than the kernels take),
    /// an exchange on the control plane. On the GPU backend, eagerly, on
    /// the device (`shmem_moe_agree`), with no host round trip: the call's
    /// exchanges skip where it failed, reading its verdict at the returned
    /// heap offset ([`Agreement::Covered`]), and the failure is reported
    /// as a collective's is (by the first call that can see it, see
    /// [`crate::Team`]), or, with `wait`, by this call once the
    /// agreement has run (for the host paths, which read the exchanges'
    /// results at once). Not while capturing (a graph replays without the
    /// host): `pre` alone.
    pub(super) fn agree_world(
        &self,
        kind: OpKind,
        pre: Result<()>,
        wait: bool,
        stream: &Stream,
    ) -> Result<Option<usize>> {
        let (r, team) = (self.rails(), &self.team);
        let mut desc = Desc::new(kind);
        desc.dtype = Some(T::DTYPE);
        desc.args =
            [self.send.offset, self.stage.offset, self.recv.offset, r.send.offset, r.stage.offset].map(|x| x as u64);
        let device = team.ctx.backend.gpu().and_then(|g| {
            let k = g.kernels.as_ref().filter(|_| team.n_pes() <= crate::gpu::kernels::MAX_TEAM)?;
            Some((g, k))
        });
        if let Some((g, k)) = device {
            let st = g.stream(stream.cuda_stream());
            if crate::gpu::capturing(st) {
                return pre.map(|()| None);
            }
            let agreement = team.device_row(&desc, pre.as_ref().err());
            if let Err(e) = pre {
                // The peers' agreement waits for this PE's row.
                let _ = team.agree_alone(agreement, stream);
                return Err(e);
            }
            let force = team.ctx.collectives.lock().unwrap_or_else(|e| e.into_inner()).force_rma;
            let (epoch, row) = agreement;
            let t = k.team(team.state.slot, &team.state.members, force)?.agreeing(epoch, row);
            k.moe_agree(t, self.layer_args(0), st.cu_stream())?;
            if !wait {
                // The verdict: the second word of the layer's state.
                return Ok(Some(self.state.offset + size_of::<i64>()));
            }
            st.synchronize().cuda("cuStreamSynchronize")?;
            return if k.agreement_failed(&t) { Err(team.failed_agreement()) } else { Ok(None) };
        }
        let rows = team.exchange(&desc, pre.as_ref().err())?;
        pre?;
        team.agree(&rows)?;
        Ok(None)
    }

    /// The forwarding PE on the host: turns the rail rows it staged into
    /// node rows (one per destination PE of its node, by ascending PE, each
    /// PE's in staging order), writes them and their splits, and returns
    /// what it forwarded.
    pub(super) fn forward_host(&self, stream: &Stream) -> Result<Forward> {
        let (r, c, w) = (self.rails(), &self.config, self.wire);
        let (k, ne, l) = (c.top_k, c.experts_per_pe, r.per_node);
        let rail_received = r.stage_so.slice(0..r.nodes).read(stream)?;
        let total = rail_received.iter().sum::<i64>() as usize;
        let staged = r.stage.slice(0..total * w.stride).read(stream)?;
        let rows: Vec<&[u8]> = staged.chunks(w.stride).collect();
        // Each rail row's destination PEs in the node, ascending.
        let dests = |row: &[u8]| {
            let mut d: Vec<usize> =
                (0..k).map(|j| w.slot(row, j).0).filter(|&e| e >= 0).map(|e| e as usize / ne).collect();
            d.sort_unstable();
            d.dedup();
            d
        };
        let mut node_sent = vec![0i64; l];
        rows.iter().for_each(|row| dests(row).into_iter().for_each(|d| node_sent[d] += 1));
        let mut next: Vec<usize> = node_sent
            .iter()
            .scan(0usize, |at, &x| {
                let start = *at;
                *at += x as usize;
                Some(start)
            })
            .collect();
        let sent = node_sent.iter().sum::<i64>() as usize;
        let mut bytes = vec![0u8; sent * w.stride];
        let (mut fwd_start, mut fwd_rows) = (Vec::with_capacity(total + 1), Vec::with_capacity(sent));
        for row in &rows {
            fwd_start.push(fwd_rows.len());
            for d in dests(row) {
                let out = &mut bytes[next[d] * w.stride..(next[d] + 1) * w.stride];
                // The payload (the token, or its codes and scales) as it came.
                out[..w.meta].copy_from_slice(&row[..w.meta]);
                let slots = (0..k).map(|j| {
                    let (e, weight) = w.slot(row, j);
                    (if e >= 0 && e as usize / ne == d { e % ne as i32 } else { -1 }, weight)
                });
                let (src, t) = w.origin(row);
                w.set_meta(out, src << ORIGIN_SHIFT | t, slots);
                fwd_rows.push(next[d]);
                next[d] += 1;
            }
        }
        fwd_start.push(fwd_rows.len());
        self.send.slice(0..bytes.len()).copy_from_host(&bytes, stream)?;
        self.send_splits.slice(0..l).copy_from_host(&node_sent, stream)?;
        Ok(Forward { rail_received, node_sent, fwd_start, fwd_rows })
    }
}

impl<T: CombineElement> MoeAllToAll<T> {
    /// The forwarding PE's combine on the host, after the node's partials
    /// came back into `send`: each rail row's partials summed in ascending
    /// PE order in the accumulator's type and rounded once, into the rail
    /// sums, with the rail exchange's splits.
    pub(super) fn forward_sums(&self, f: &Forward, stream: &Stream) -> Result<()> {
        let (r, c, w) = (self.rails(), &self.config, self.wire);
        let h = c.hidden;
        let back = self.send.slice(0..f.fwd_rows.len() * w.back_stride).read(stream)?;
        let rows = f.fwd_start.len() - 1;
        let mut bytes = vec![0u8; rows * w.back_stride];
        let mut part = crate::dtype::zeroed_vec::<T>(h);
        for (i, out) in bytes.chunks_mut(w.back_stride).enumerate() {
            let mut acc = vec![T::zero(); h];
            for &b in &f.fwd_rows[f.fwd_start[i]..f.fwd_start[i + 1]] {
                read_elems(&back[b * w.back_stride..(b + 1) * w.back_stride], &mut part);
                acc.iter_mut().zip(&part).for_each(|(a, &x)| *a = T::add(*a, x));
            }
            let sum: Vec<T> = acc.into_iter().map(T::from_acc).collect();
            out[..h * size_of::<T>()].copy_from_slice(bytes_of(&sum));
        }
        self.rail_back_buffers().0.buf.slice(0..bytes.len()).copy_from_host(&bytes, stream)?;
        r.stage_so.slice(0..r.nodes).copy_from_host(&f.rail_received, stream)
    }

    /// The node-aware combine's exchanges on the host, after the expert
    /// side's partials and the agreement over the world: back over the
    /// node, the forwarders' sums, back over the rail. Returns the rows that came back to this PE, one per
    /// (token, destination node) in send order.
    pub(super) fn combine_nodes_host(&self, layout: &Layout, stream: &Stream) -> Result<Vec<u8>> {
        let (r, w) = (self.rails(), self.wire);
        let f = layout.forward.as_ref().expect("a layout of the node-aware form");
        let covered = Agreement::Covered { skip_if: None };
        r.node.all_to_all_v_any(OpKind::AllToAllV, self.back_buffers(), w.back_stride, 0, covered, stream)?;
        // What came back must be what this PE forwarded: otherwise the PEs
        // combined layouts of different dispatches.
        let back = self.back_so.slice(0..r.per_node).read(stream)?;
        let pre = if back != f.node_sent {
            Err(Error::CollectiveMismatch(format!(
                "MoeAllToAll::combine: PE {} got back {back:?} rows from each PE of its node but forwarded {:?}: \
                 the PEs passed layouts of different dispatches",
                self.team.my_pe(),
                f.node_sent
            )))
        } else {
            self.forward_sums(f, stream)
        };
        // This PE's verdict on what came back: agreed on by the rail (and
        // on the GPU backend waited for: its results are read at once).
        let own = Agreement::Own { pre, wait: true };
        r.rail.all_to_all_v_any(OpKind::AllToAllV, self.rail_back_buffers(), w.back_stride, 0, own, stream)?;
        let back = r.back_so.slice(0..r.nodes).read(stream)?;
        if back != layout.wire_sent() {
            return Err(Error::CollectiveMismatch(format!(
                "MoeAllToAll::combine: PE {} got back {back:?} rows from each node but sent {:?}: the PEs passed \
                 layouts of different dispatches",
                self.team.my_pe(),
                layout.wire_sent()
            )));
        }
        let rows: usize = back.iter().sum::<i64>() as usize;
        r.send.slice(0..rows * w.back_stride).read(stream)
    }
}
