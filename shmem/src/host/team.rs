//! A team as the host backend's collectives see it: the mapped heaps, the
//! control plane's state of the team (its members and barrier), and what
//! the collectives use besides (the rayon pool, the traffic counters,
//! scratch space, the settings).

use super::HostHeap;
use crate::algo::Collectives;
use crate::control::team::TeamState;
use crate::control::Control;
use crate::error::Result;
use crate::heap::{Allocator, Scratch};
use crate::traffic::{NetCounters, NetDir};
use std::sync::Mutex;

/// One PE's view of a team, for the length of one collective.
pub(crate) struct HostTeam<'a> {
    pub(crate) heap: &'a HostHeap,
    pub(crate) ctl: &'a Control,
    pub(crate) state: &'a TeamState,
    pub(crate) pool: &'a rayon::ThreadPool,
    pub(crate) net: &'a NetCounters,
    pub(crate) alloc: &'a Mutex<Allocator>,
    /// The settings when the call was made (the same on every member).
    pub(crate) cfg: Collectives,
}

impl HostTeam<'_> {
    /// This PE's index in the team.
    pub(crate) fn my_pe(&self) -> usize {
        self.state.my_index
    }

    pub(crate) fn n_pes(&self) -> usize {
        self.state.members.len()
    }

    /// Address of byte `offset` of member `member`'s heap.
    pub(crate) fn pe_ptr<T>(&self, member: usize, offset: usize) -> *mut T {
        self.heap.heap_ptr(self.state.members[member], offset).cast()
    }

    /// Counts a read of `len` elements from `member` (see [`crate::net`]):
    /// every copy of the host collectives from a peer's heap goes with one.
    pub(crate) fn count_read<T>(&self, member: usize, len: usize) {
        self.count(member, len * size_of::<T>(), NetDir::Got);
    }

    /// Counts a transfer of `bytes` with `member` in direction `dir`.
    pub(crate) fn count(&self, member: usize, bytes: usize, dir: NetDir) {
        self.net.count(self.ctl, self.state.members[member], bytes, dir);
    }

    /// The team's barrier on the host (no agreement).
    pub(crate) fn raw_barrier(&self) -> Result<()> {
        self.ctl.barrier(self.state)
    }

    /// Scratch space of `bytes` in this PE's heap ([`Scratch`]).
    pub(crate) fn scratch(&self, bytes: usize) -> Result<Scratch<'_>> {
        Scratch::take(self.alloc, bytes)
    }

    /// Copies `data` into this PE's heap at `offset`, a checked region (or
    /// this call's scratch) that no peer reads until the next barrier.
    pub(crate) fn write_local<U: Copy>(&self, offset: usize, data: &[U]) {
        let p: *mut U = self.pe_ptr(self.my_pe(), offset);
        // SAFETY: as above; `p` is aligned for U (regions start at element
        // boundaries of 256-aligned allocations) and cannot overlap `data`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
    }
}

/// Where this PE is in a team laid out node by node.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rails {
    /// `N`: the nodes.
    pub(crate) nodes: usize,
    /// `L`: members on each node (and rails).
    pub(crate) per_node: usize,
    /// This PE's node (`a`) and rail (local rank, `i`).
    pub(crate) node: usize,
    pub(crate) rail: usize,
}

impl Rails {
    /// This PE's place among the rails where `team`'s collectives take the
    /// node-aware forms now (see [`crate::algo::node_aware`]); `None` where
    /// they run flat.
    pub(crate) fn of(team: &HostTeam<'_>) -> Option<Rails> {
        let (shape, cfg) = (team.state.shape, team.cfg);
        if !crate::algo::node_aware(shape, cfg.across_nodes, cfg.force_rma) {
            return None;
        }
        let (me, per_node) = (team.my_pe(), shape.per_node);
        Some(Rails { nodes: shape.nodes, per_node, node: me / per_node, rail: me % per_node })
    }

    /// The member of node `node` on rail `rail`.
    pub(super) fn member(&self, node: usize, rail: usize) -> usize {
        node * self.per_node + rail
    }

    /// This PE.
    pub(super) fn me(&self) -> usize {
        self.member(self.node, self.rail)
    }

    /// The members of this PE's node other than itself.
    pub(super) fn node_peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.per_node).filter(|&k| k != self.rail).map(|k| self.member(self.node, k))
    }

    /// The members of this PE's rail on the other nodes.
    pub(super) fn rail_peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes).filter(|&b| b != self.node).map(|b| self.member(b, self.rail))
    }

    /// The members of node `node`, in local rank order.
    pub(super) fn node_members(&self, node: usize) -> Vec<usize> {
        (0..self.per_node).map(|k| self.member(node, k)).collect()
    }
}
