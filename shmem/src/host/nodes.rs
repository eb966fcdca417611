//! The host backend's node-aware collectives ([`AcrossNodes`]): the data's
//! route that the kernels across nodes take, so that their results and
//! the bytes each PE sends to other nodes can be checked against these.
//!
//! The team is the world on `N` nodes of `L` PEs each, node by node: member
//! `a·L + i` is PE (node `a`, local rank `i`), and rail `i` is the PEs of
//! local rank `i`. A byte crosses between nodes only between two PEs of
//! one rail, once, pushed by the PE that holds it into its peer's heap, as
//! the kernels put; inside a node the PEs load and store each other's
//! memory, as over NVLink. Every copy between two PEs goes through
//! [`HostTeam::copy_between`].
//!
//! Each form runs in phases separated by barriers of the team. A phase
//! writes only where no PE reads in it, and reads only what earlier phases
//! finished: the in-place cases are safe by that, as the design of each
//! form below says. Staging lives in the heap's scratch, which every PE
//! takes at the same point (so at the same offset) before its first write.
//! The calls come here after `begin` has agreed on them on every PE.
//!
//! Reductions accumulate in `T::Acc` and follow [`ReduceOrder`]:
//! - **PeOrder**: shard `i` of the vector (whole 16-byte vectors,
//!   [`rail_share`]) is rail `i`'s. PE (0,i) folds node 0's values of it;
//!   each later node adds its PEs' values, in local rank order, to the
//!   running value it receives from the previous node, in `T::Acc`; the
//!   last node rounds once. That is the flat fold `x0 ⊕ x1 ⊕ … ⊕ x(n−1)`,
//!   bit for bit.
//! - **NodeGrouped**: node `a`'s PE-order fold `P_a`, rounded to `T`,
//!   crosses the network; the receiver folds the nodes' partials in node
//!   order: `from_acc(Σ_a to_acc(from_acc(P_a)))`.
//!
//! [`AcrossNodes`]: crate::AcrossNodes

use super::coll::{fold_acc, Addr, CHUNK};
use super::team::{HostTeam, Rails};
use crate::algo::{rail_share, ReduceOrder};
use crate::dtype::{Element, ReduceOp};
use crate::error::Result;
use crate::heap::{overlap, Region};
use crate::traffic::NetDir;
use rayon::prelude::*;

/// One end of a copy between PEs: byte `offset` of team member `member`'s
/// symmetric heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct At {
    pub(crate) member: usize,
    pub(crate) offset: usize,
}

impl HostTeam<'_> {
    /// Copies `bytes` from `from` to `to`, one of which is this PE: a put
    /// where `from` is, a get where `to` is (and a local copy where both
    /// are). This is the one place where the node-aware collectives move
    /// bytes between PEs, and so where the bytes that cross between nodes
    /// are counted ([`crate::net`]): a put at `from`, a get at `to`.
    pub(crate) fn copy_between(&self, from: At, to: At, bytes: usize) {
        let me = self.my_pe();
        debug_assert!(from.member == me || to.member == me, "a copy between PEs starts at one of its ends");
        if bytes == 0 || from == to {
            return;
        }
        if from.member != me {
            self.count(from.member, bytes, NetDir::Got);
        } else if to.member != me {
            self.count(to.member, bytes, NetDir::Put);
        }
        let src: *const u8 = self.pe_ptr(from.member, from.offset);
        let dst: *mut u8 = self.pe_ptr(to.member, to.offset);
        // SAFETY: both ends lie in checked regions or in this call's
        // scratch, and the phases of the calling form keep every other PE
        // from writing the source or touching the destination until the
        // next barrier; `copy` allows the ends to overlap.
        unsafe { std::ptr::copy(src, dst, bytes) };
    }

    /// The reduction order the node-aware reductions take now.
    fn reduce_order(&self) -> ReduceOrder {
        self.cfg.reduce_order
    }

    /// All-gather of `s` (this PE's block) into every PE's `d`: each PE
    /// stores its block into its node's outputs and pushes it to its rail
    /// peers' outputs; then each PE stores the blocks its rail peers sent
    /// into its node peers' outputs. Bytes out of a node per PE: `(N−1)·B`.
    ///
    /// In place, `s` is this PE's block of `d`, which no other PE writes.
    pub(crate) fn all_gather_nodes<T: Element>(&self, r: Rails, d: Region, s: Region) -> Result<()> {
        let bytes = s.len * size_of::<T>();
        let block = |m: usize| d.offset + m * bytes;
        let me = r.me();
        let mine = At { member: me, offset: s.offset };
        for m in std::iter::once(me).chain(r.node_peers()).chain(r.rail_peers()) {
            self.copy_between(mine, At { member: m, offset: block(me) }, bytes);
        }
        self.raw_barrier()?;
        for from in r.rail_peers() {
            let got = At { member: me, offset: block(from) };
            for k in r.node_peers() {
                self.copy_between(got, At { member: k, offset: block(from) }, bytes);
            }
        }
        self.raw_barrier()
    }

    /// Broadcast from `root`: the root stores its source into its node's
    /// outputs; each PE of the root's node sends its rail's share of the
    /// vector along its rail ([`HostTeam::spread_on_rail`]); each PE of the
    /// other nodes stores its share into its node peers' outputs. Bytes
    /// out of the root's node per PE: `(N−1)·S/L` (`S/L` along a ring of
    /// four nodes or more).
    pub(crate) fn broadcast_nodes<T: Element>(&self, r: Rails, d: Region, s: Region, root: usize) -> Result<()> {
        let elem = size_of::<T>();
        let me = r.me();
        let root_node = root / r.per_node;
        if me == root {
            let from = At { member: root, offset: s.offset };
            for m in std::iter::once(me).chain(r.node_peers()) {
                self.copy_between(from, At { member: m, offset: d.offset }, d.len * elem);
            }
        }
        self.raw_barrier()?;
        let share = rail_share(d.len, elem, r.rail, r.per_node);
        let (at, bytes) = (d.offset + share.start * elem, share.len() * elem);
        self.spread_on_rail(r, root_node, at, bytes)?;
        self.to_node_peers(r, r.node != root_node, at, bytes);
        self.raw_barrier()
    }

    /// All-to-all: each PE sends the `L` blocks of its source for node `b`
    /// (contiguous: members `b·L ..`) as one transfer into the scratch of
    /// its rail peer on node `b` (its own for its node); then each PE
    /// stores each block it received into the output of its destination on
    /// its node. Bytes out of a node per PE: `(N−1)/N·S`, in `N−1`
    /// transfers.
    ///
    /// In place, the second phase writes the outputs only after every PE
    /// has sent its source in the first.
    pub(crate) fn all_to_all_nodes<T: Element>(&self, r: Rails, d: Region, s: Region) -> Result<()> {
        let elem = size_of::<T>();
        let block = d.len / (r.nodes * r.per_node) * elem;
        let row = r.per_node * block;
        let scratch = self.scratch(r.nodes * row)?;
        let inbox = |from_node: usize| scratch.offset + from_node * row;
        let me = r.me();
        for b in 0..r.nodes {
            let from = At { member: me, offset: s.offset + b * row };
            self.copy_between(from, At { member: r.member(b, r.rail), offset: inbox(r.node) }, row);
        }
        self.raw_barrier()?;
        for b in 0..r.nodes {
            let sender = r.member(b, r.rail);
            for k in 0..r.per_node {
                let from = At { member: me, offset: inbox(b) + k * block };
                let to = At { member: r.member(r.node, k), offset: d.offset + sender * block };
                self.copy_between(from, to, block);
            }
        }
        self.raw_barrier()?;
        drop(scratch);
        Ok(())
    }

    /// All-reduce in the order [`HostTeam::reduce_order`] says (see the module
    /// docs).
    pub(crate) fn all_reduce_nodes<T: Element>(&self, r: Rails, d: Region, s: Region, op: ReduceOp) -> Result<()> {
        match self.reduce_order() {
            ReduceOrder::PeOrder => self.all_reduce_chain::<T>(r, d, s, op),
            ReduceOrder::NodeGrouped => self.all_reduce_grouped::<T>(r, d, s, op),
        }
    }

    /// Reduce-scatter in the order [`HostTeam::reduce_order`] says (see the
    /// module docs).
    pub(crate) fn reduce_scatter_nodes<T: Element>(&self, r: Rails, d: Region, s: Region, op: ReduceOp) -> Result<()> {
        match self.reduce_order() {
            ReduceOrder::PeOrder => self.reduce_scatter_chain::<T>(r, d, s, op),
            ReduceOrder::NodeGrouped => self.reduce_scatter_grouped::<T>(r, d, s, op),
        }
    }

    /// The PE-order all-reduce. Steps `0..N−1`: node `a`'s PE of rail `i`
    /// folds its node's shard `i` onto the running value (node 0 starts
    /// it) and pushes it, in `T::Acc`, into the scratch of node `a+1`'s.
    /// Node `N−1`'s then rounds, stores the result into its node's
    /// outputs and spreads it along its rail; the other nodes' store it
    /// into their node peers' outputs. Bytes out of a node per PE:
    /// `f·S/L` on nodes `0..N−1`, `(N−1)·S/L` on node `N−1` (`S/L` along
    /// a ring of four nodes or more; `f` = the size of `T::Acc` over `T`'s).
    ///
    /// In place: shard `i` of every source is read only by the PE of rail
    /// `i` on its node, in its step; it is written only after (step `N−1`,
    /// or the phases after it).
    fn all_reduce_chain<T: Element>(&self, r: Rails, d: Region, s: Region, op: ReduceOp) -> Result<()> {
        let elem = size_of::<T>();
        let acc_bytes = size_of::<T::Acc>();
        let largest = (0..r.per_node).map(|i| rail_share(d.len, elem, i, r.per_node).len()).max().unwrap_or(0);
        let scratch = self.scratch(largest * acc_bytes)?;
        let share = rail_share(d.len, elem, r.rail, r.per_node);
        let len = share.len();
        let me = r.me();
        let running = At { member: me, offset: scratch.offset };
        let node_inputs = || self.inputs(&r.node_members(r.node), s.offset + share.start * elem);
        let last = r.nodes - 1;
        for step in 0..last {
            if r.node == step && len > 0 {
                let start = (step > 0).then(|| self.read_local::<T::Acc>(running.offset, len));
                let acc = self.fold::<T>(op, start, &node_inputs(), len);
                self.write_local(running.offset, &acc);
                let next = At { member: r.member(step + 1, r.rail), offset: scratch.offset };
                self.copy_between(running, next, len * acc_bytes);
            }
            self.raw_barrier()?;
        }
        let at = d.offset + share.start * elem;
        if r.node == last && len > 0 {
            let acc = self.fold::<T>(op, Some(self.read_local::<T::Acc>(running.offset, len)), &node_inputs(), len);
            let y: Vec<T> = acc.into_iter().map(T::from_acc).collect();
            self.write_local(at, &y);
        }
        self.to_node_peers(r, r.node == last, at, len * elem);
        self.spread_on_rail(r, last, at, len * elem)?;
        self.to_node_peers(r, r.node != last, at, len * elem);
        self.raw_barrier()?;
        drop(scratch);
        Ok(())
    }

    /// The node-grouped all-reduce: node reduce-scatter, reduce-scatter
    /// and all-gather among each rail, node all-gather. The PE of rail `i`
    /// folds its node's shard `i` in `T::Acc`, rounds it to `T` and pushes
    /// part `b` of it (whole vectors of the shard, split over the nodes)
    /// into the scratch of node `b`'s PE of rail `i`; each folds the nodes'
    /// parts in node order, stores the result into its output and pushes it
    /// to its rail peers' outputs; each then stores its whole shard into its
    /// node peers' outputs. Bytes out of a node per PE: `2 (N−1)/N·S/L`.
    ///
    /// In place: shard `i` of every source is read only in the first
    /// phase, by the PE of rail `i` on its node; the outputs are written in
    /// the later phases.
    fn all_reduce_grouped<T: Element>(&self, r: Rails, d: Region, s: Region, op: ReduceOp) -> Result<()> {
        let elem = size_of::<T>();
        let largest = (0..r.per_node).map(|i| rail_share(d.len, elem, i, r.per_node).len()).max().unwrap_or(0);
        let scratch = self.scratch(r.nodes * largest * elem)?;
        let slot = |node: usize| scratch.offset + node * largest * elem;
        let share = rail_share(d.len, elem, r.rail, r.per_node);
        // Part `b` of the shard, as elements of the shard.
        let part = |b: usize| rail_share(share.len(), elem, b, r.nodes);
        let me = r.me();
        if !share.is_empty() {
            let inputs = self.inputs(&r.node_members(r.node), s.offset + share.start * elem);
            let partial: Vec<T> = self.fold::<T>(op, None, &inputs, share.len()).into_iter().map(T::from_acc).collect();
            self.write_local(slot(r.node), &partial);
            for b in (0..r.nodes).filter(|&b| b != r.node) {
                let p = part(b);
                let from = At { member: me, offset: slot(r.node) + p.start * elem };
                let to = At { member: r.member(b, r.rail), offset: slot(r.node) + p.start * elem };
                self.copy_between(from, to, p.len() * elem);
            }
        }
        self.raw_barrier()?;
        let mine = part(r.node);
        let at = d.offset + (share.start + mine.start) * elem;
        if !mine.is_empty() {
            let partials: Vec<At> =
                (0..r.nodes).map(|a| At { member: me, offset: slot(a) + mine.start * elem }).collect();
            let y: Vec<T> = self.fold::<T>(op, None, &partials, mine.len()).into_iter().map(T::from_acc).collect();
            self.write_local(at, &y);
            for peer in r.rail_peers() {
                self.copy_between(At { member: me, offset: at }, At { member: peer, offset: at }, mine.len() * elem);
            }
        }
        self.raw_barrier()?;
        self.to_node_peers(r, true, d.offset + share.start * elem, share.len() * elem);
        self.raw_barrier()?;
        drop(scratch);
        Ok(())
    }

    /// The PE-order reduce-scatter. Block `b·L + i` (`B` elements) is
    /// chained on rail `i`: steps `0..N−1` as in the all-reduce's chain,
    /// for the `N` blocks of rail `i` at once (one transfer of `N` running
    /// values in `T::Acc`); node `N−1`'s PE of rail `i` rounds each block
    /// and pushes it into its owner's output (its own block into its own).
    /// Bytes out of a node per PE: `f·N·B` on nodes `0..N−1`, `(N−1)·B` on
    /// node `N−1`.
    ///
    /// In place: a source's block `b·L + i` is read only by its node's PE
    /// of rail `i`, in its step, before any output is written; each PE's
    /// output is its own block of its source ([`HostTeam::output_of`]).
    fn reduce_scatter_chain<T: Element>(&self, r: Rails, d: Region, s: Region, op: ReduceOp) -> Result<()> {
        let elem = size_of::<T>();
        let acc_bytes = size_of::<T::Acc>();
        let len = d.len;
        let scratch = self.scratch(r.nodes * len * acc_bytes)?;
        let running = |b: usize| scratch.offset + b * len * acc_bytes;
        let me = r.me();
        let node_inputs = |b: usize| self.inputs(&r.node_members(r.node), s.offset + r.member(b, r.rail) * len * elem);
        let last = r.nodes - 1;
        for step in 0..last {
            if r.node == step && len > 0 {
                for b in 0..r.nodes {
                    let start = (step > 0).then(|| self.read_local::<T::Acc>(running(b), len));
                    let acc = self.fold::<T>(op, start, &node_inputs(b), len);
                    self.write_local(running(b), &acc);
                }
                let next = At { member: r.member(step + 1, r.rail), offset: scratch.offset };
                self.copy_between(At { member: me, offset: scratch.offset }, next, r.nodes * len * acc_bytes);
            }
            self.raw_barrier()?;
        }
        if r.node == last && len > 0 {
            for b in 0..r.nodes {
                let acc = self.fold::<T>(op, Some(self.read_local::<T::Acc>(running(b), len)), &node_inputs(b), len);
                let y: Vec<T> = acc.into_iter().map(T::from_acc).collect();
                // The rounded block, in T, where its running value was.
                self.write_local(running(b), &y);
                let owner = self.output_of(r.member(b, r.rail), d, s, elem);
                self.copy_between(At { member: me, offset: running(b) }, owner, len * elem);
            }
        }
        self.raw_barrier()?;
        drop(scratch);
        Ok(())
    }

    /// The node-grouped reduce-scatter: the PE of rail `i` on node `a`
    /// folds its node's block `b·L + i` for every `b`, rounds it to `T` and
    /// pushes it into the scratch of the block's owner (node `b`'s PE of
    /// rail `i`), which folds the `N` partials in node order. Bytes out of
    /// a node per PE: `(N−1)·B = (N−1)/N·S/L`.
    ///
    /// In place: a source's block `b·L + i` is read only in the first
    /// phase; the outputs are written in the second.
    fn reduce_scatter_grouped<T: Element>(&self, r: Rails, d: Region, s: Region, op: ReduceOp) -> Result<()> {
        let elem = size_of::<T>();
        let len = d.len;
        // The partials this PE sends (by owner's node), then those it
        // receives (by sender's node).
        let scratch = self.scratch(2 * r.nodes * len * elem)?;
        let outbox = |b: usize| scratch.offset + b * len * elem;
        let inbox = |a: usize| scratch.offset + (r.nodes + a) * len * elem;
        let me = r.me();
        if len > 0 {
            for b in 0..r.nodes {
                let owner = r.member(b, r.rail);
                let inputs = self.inputs(&r.node_members(r.node), s.offset + owner * len * elem);
                let partial: Vec<T> = self.fold::<T>(op, None, &inputs, len).into_iter().map(T::from_acc).collect();
                self.write_local(outbox(b), &partial);
                self.copy_between(
                    At { member: me, offset: outbox(b) },
                    At { member: owner, offset: inbox(r.node) },
                    len * elem,
                );
            }
        }
        self.raw_barrier()?;
        if len > 0 {
            let partials: Vec<At> = (0..r.nodes).map(|a| At { member: me, offset: inbox(a) }).collect();
            let y: Vec<T> = self.fold::<T>(op, None, &partials, len).into_iter().map(T::from_acc).collect();
            self.write_local(d.offset, &y);
        }
        self.raw_barrier()?;
        drop(scratch);
        Ok(())
    }

    /// Where member `m`'s output of a reduce-scatter lies, seen from this
    /// PE's output `d` and source `s`: at the same offset, or in place (`d`
    /// is this PE's block of `s`) `m`'s block of its source, as every
    /// member's calls agree.
    fn output_of(&self, m: usize, d: Region, s: Region, elem: usize) -> At {
        let in_place = overlap(d, s, elem);
        At { member: m, offset: if in_place { s.offset + m * d.len * elem } else { d.offset } }
    }

    /// Spreads `bytes` at `offset` of the PE of this PE's rail on node
    /// `from` to the same place on every other node's PE of the rail:
    /// directly from node `from` on up to three nodes, else along the ring
    /// `from, from+1, …` (each node forwards what it received), so that no
    /// PE sends more than once. Every member calls it alike; it ends with a
    /// barrier (one a hop on the ring).
    fn spread_on_rail(&self, r: Rails, from: usize, offset: usize, bytes: usize) -> Result<()> {
        let here = At { member: r.me(), offset };
        if r.nodes <= 3 {
            if r.node == from {
                for peer in r.rail_peers() {
                    self.copy_between(here, At { member: peer, offset }, bytes);
                }
            }
            return self.raw_barrier();
        }
        for hop in 0..r.nodes - 1 {
            let sender = (from + hop) % r.nodes;
            if r.node == sender {
                let next = r.member((sender + 1) % r.nodes, r.rail);
                self.copy_between(here, At { member: next, offset }, bytes);
            }
            self.raw_barrier()?;
        }
        Ok(())
    }

    /// Where `when`, copies `bytes` at `offset` of this PE's heap to the
    /// same place of its node peers'.
    fn to_node_peers(&self, r: Rails, when: bool, offset: usize, bytes: usize) {
        if when {
            for k in r.node_peers() {
                self.copy_between(At { member: r.me(), offset }, At { member: k, offset }, bytes);
            }
        }
    }

    /// The same byte `offset` of each of `members`' heaps.
    fn inputs(&self, members: &[usize], offset: usize) -> Vec<At> {
        members.iter().map(|&member| At { member, offset }).collect()
    }

    /// `start op x0 op x1 op …` element-wise over `len` elements of `T` at
    /// each of `inputs` (loads from their heaps, which no PE writes in the
    /// calling phase), in `T::Acc`; without `start`, from `to_acc(x0)`.
    fn fold<T: Element>(&self, op: ReduceOp, start: Option<Vec<T::Acc>>, inputs: &[At], len: usize) -> Vec<T::Acc> {
        let addrs: Vec<Addr> = inputs.iter().map(|a| Addr::of(self.pe_ptr::<T>(a.member, a.offset))).collect();
        // SAFETY: each input holds `len` elements of `T` (a checked region
        // or this call's scratch) that no PE writes in this phase.
        let slices = |lo: usize, n: usize| -> Vec<&[T]> {
            addrs.iter().map(|a| unsafe { std::slice::from_raw_parts(a.ptr::<T>().add(lo).cast_const(), n) }).collect()
        };
        let (mut acc, rest) = match start {
            Some(acc) => (acc, 0),
            None => (slices(0, len)[0].iter().map(|x| x.to_acc()).collect(), 1),
        };
        debug_assert_eq!(acc.len(), len);
        self.pool.install(|| {
            acc.par_chunks_mut(CHUNK).enumerate().for_each(|(t, chunk)| {
                let ins = slices(t * CHUNK, chunk.len());
                fold_acc(op, chunk, &ins[rest..]);
            })
        });
        acc
    }

    /// `len` values of `U` at byte `offset` of this PE's heap (scratch it
    /// wrote earlier, or a peer pushed before the last barrier).
    fn read_local<U: Copy>(&self, offset: usize, len: usize) -> Vec<U> {
        let p: *const U = self.pe_ptr(self.my_pe(), offset);
        // SAFETY: `offset` begins `len` values of `U` in this call's
        // scratch, aligned (scratch offsets are, and its slots are
        // multiples of `U`), written whole before the last barrier.
        unsafe { std::slice::from_raw_parts(p, len).to_vec() }
    }
}
