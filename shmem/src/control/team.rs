//! A team as this PE's control plane keeps it: the members, the slot their
//! barriers and exchanges use in the node area, and the counters that
//! order them. The public [`crate::Team`] holds one in an `Arc`.

use super::{Control, Span};
use crate::algo::NodeShape;
use std::sync::atomic::AtomicU64;

/// What runs when the last holder of a split team lets it go: the data
/// plane frees what it made for the team, then the slot is given back.
pub(crate) type Release = Box<dyn FnOnce() + Send + Sync>;

/// The per-process state of one team.
pub(crate) struct TeamState {
    pub(crate) ctx_id: u64,
    pub(crate) slot: usize,
    /// World PEs of the members, in team order.
    pub(crate) members: Vec<usize>,
    pub(crate) my_index: usize,
    /// Each member's barrier counter on `slot` when the team was made.
    pub(crate) bases: Vec<u64>,
    /// Barriers this PE has entered on the team.
    pub(crate) arrivals: AtomicU64,
    /// Exchanges this PE has made on the team.
    pub(crate) seq: AtomicU64,
    /// Calls this PE has agreed on the device on the team: the last
    /// agreement's epoch.
    pub(crate) agreements: AtomicU64,
    /// For split teams: what frees the team's slot and its data plane's
    /// resources when it is dropped.
    release: Option<Release>,
    /// NVSHMEM's handle of the team, on the GPU backend.
    pub(crate) nv_team: i32,
    /// The same on every member, different for every team: what a PE
    /// waiting in this team's barrier publishes.
    pub(crate) uid: u64,
    /// Where the members are: on this PE's node, or on others.
    pub(crate) span: Span,
    /// How the members spread over nodes (fixed with the members: the
    /// collectives read it on every call).
    pub(crate) shape: NodeShape,
}

impl TeamState {
    /// The state of a team of `members` on this PE, which `ctl` (this PE's
    /// control plane) tells where they are.
    pub(crate) fn new(
        ctx_id: u64,
        slot: usize,
        members: Vec<usize>,
        ctl: &Control,
        release: Option<Release>,
        nv_team: i32,
        uid: u64,
    ) -> TeamState {
        let me = ctl.me();
        let my_index = members.iter().position(|&m| m == me).expect("a team state exists only on its members");
        let span = ctl.span(&members);
        let shape = NodeShape::of(slot == 0, &members, |pe| ctl.node_of(pe));
        let bases = vec![0; members.len()];
        let (arrivals, seq, agreements) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        TeamState {
            ctx_id,
            slot,
            members,
            my_index,
            bases,
            arrivals,
            seq,
            agreements,
            release,
            nv_team,
            uid,
            span,
            shape,
        }
    }
}

impl Drop for TeamState {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}
