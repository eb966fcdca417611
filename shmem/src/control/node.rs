//! The node tier of the control plane: one POSIX shared-memory object per
//! node, created by the node's lowest PE and mapped only by the node's PEs.
//!
//! Layout of the object (the node's `k` PEs, by local rank):
//!
//! ```text
//! [ header: 4 KiB ][ PeCell 0 ]..[ PeCell k-1 ][ RemoteRows 0 ]..[ RemoteRows k-1 ]
//! ```
//!
//! The remote rows exist only in a job of more than one node: there each
//! PE, as its teams' delegate on this node, publishes the rows that the
//! other nodes' delegates sent it (per team slot and round parity, one row
//! per world PE).
//!
//! Each `PeCell` is written only by its PE (its pid and state, and per team
//! slot a barrier counter and two descriptor rows) and read by the node's
//! other PEs; everything in it is an atomic, so references to it are sound
//! across processes.

use crate::error::{Error, Result};
use crate::shm::Mapping;
use std::sync::atomic::{AtomicU64, Ordering};

/// Team slots per PE (world and node take two).
pub(crate) const MAX_TEAMS: usize = 64;
/// Words of one collective descriptor.
pub(crate) const DESC_WORDS: usize = 8;
const HEADER_BYTES: usize = 4096;
const MAGIC: u64 = 0x7368_6d65_6d5f_6331; // "shmem_c1"

/// A PE's life as its peers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeState {
    // 0: not yet joined (fresh shared memory).
    Running = 1,
    Finalized = 2,
    /// Its context was dropped without `finalize`.
    Exited = 3,
}

/// Per-PE, per-team control words.
#[repr(C, align(64))]
pub(crate) struct TeamCell {
    /// Barriers this PE has entered on this slot (monotonic).
    pub(crate) epoch: AtomicU64,
    /// Barriers this PE has entered on the team now in this slot.
    pub(crate) arrivals: AtomicU64,
    /// Two rows of descriptors, by sequence parity: an exchange writes row
    /// `seq & 1`, and the barrier after it keeps anyone from reaching
    /// `seq + 2` (the same row) before every member has read row `seq`.
    pub(crate) desc: [[AtomicU64; DESC_WORDS]; 2],
    /// As its team's delegate on this node: the tag ([`round_tag`]) of the
    /// last round whose remote rows it has published.
    pub(crate) remote_done: AtomicU64,
}

/// What a delegate stores in `remote_done` once round `round` of team
/// `uid` is complete: the team's id in it keeps a slot's earlier team
/// from passing for the new one.
pub(crate) fn round_tag(uid: u64, round: u64) -> u64 {
    (uid.wrapping_mul(0x9e37_79b9_7f4a_7c15) & !0xffff_ffff) | (round & 0xffff_ffff)
}

#[repr(C, align(64))]
pub(crate) struct PeCell {
    pub(crate) pid: AtomicU64,
    pub(crate) state: AtomicU64,
    /// While this PE waits in a barrier: that team's id (0: not waiting),
    /// and the arrivals it waits for.
    pub(crate) waiting_team: AtomicU64,
    pub(crate) waiting_target: AtomicU64,
    pub(crate) teams: [TeamCell; MAX_TEAMS],
}

#[repr(C)]
struct Header {
    magic: AtomicU64,
    /// PEs in the job, and on this node.
    n_pes: AtomicU64,
    local_size: AtomicU64,
    /// World PEs with a row in each remote-rows area (0 in a job of one node).
    remote_pes: AtomicU64,
}

const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

const CELL_STRIDE: usize = round_up(std::mem::size_of::<PeCell>(), 4096);

/// Bytes of one PE's remote-rows area for `remote_pes` world PEs.
fn remote_stride(remote_pes: usize) -> Option<usize> {
    let bytes = (MAX_TEAMS * 2 * DESC_WORDS * 8).checked_mul(remote_pes)?;
    Some(round_up(bytes, 4096))
}

/// Size of a node's object for `local_size` PEs, with remote-rows areas
/// for `remote_pes` world PEs (0: a job of one node).
pub(crate) fn object_size(local_size: usize, remote_pes: usize) -> Option<usize> {
    let per_pe = CELL_STRIDE.checked_add(remote_stride(remote_pes)?)?;
    per_pe.checked_mul(local_size)?.checked_add(HEADER_BYTES)
}

/// This PE's view of its node's object.
pub(crate) struct NodeArea {
    map: Mapping,
    /// Each world PE's index on this node (its cell), `None` off the node.
    local_of: Vec<Option<usize>>,
    my_local: usize,
    local_size: usize,
    remote_pes: usize,
}

impl NodeArea {
    /// Writes the header of a freshly created object (the node's lowest
    /// PE, before any other PE opens it).
    pub(crate) fn init_header(map: &Mapping, n: usize, local_size: usize, remote_pes: usize) {
        // SAFETY: the header lies at the start of the page-aligned mapping;
        // its fields are atomics. The Release store of `magic`, after the
        // others, pairs with the Acquire load in `new`.
        let h = unsafe { &*map.base().cast::<Header>() };
        h.n_pes.store(n as u64, Ordering::Relaxed);
        h.local_size.store(local_size as u64, Ordering::Relaxed);
        h.remote_pes.store(remote_pes as u64, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
    }

    /// Wraps a mapping of `object_size(members.len(), remote_pes)` bytes
    /// whose header the node's lowest PE wrote, and publishes this PE's
    /// pid. `members` are the node's PEs in rank order (their local ranks
    /// are their indices), `me` among them.
    pub(crate) fn new(map: Mapping, me: usize, n: usize, members: &[usize], remote_pes: usize) -> Result<NodeArea> {
        assert_eq!(Some(map.len()), object_size(members.len(), remote_pes));
        let mut local_of = vec![None; n];
        for (local, &pe) in members.iter().enumerate() {
            local_of[pe] = Some(local);
        }
        let my_local = local_of[me].expect("a PE is a member of its own node");
        let area = NodeArea { map, local_of, my_local, local_size: members.len(), remote_pes };
        let h = area.header();
        if h.magic.load(Ordering::Acquire) != MAGIC
            || h.n_pes.load(Ordering::Relaxed) != n as u64
            || h.local_size.load(Ordering::Relaxed) != members.len() as u64
            || h.remote_pes.load(Ordering::Relaxed) != remote_pes as u64
        {
            return Err(Error::bootstrap("the node's control area header does not match this job"));
        }
        let cell = area.mine();
        cell.pid.store(std::process::id() as u64, Ordering::SeqCst);
        cell.state.store(PeState::Running as u64, Ordering::SeqCst);
        Ok(area)
    }

    fn header(&self) -> &Header {
        // SAFETY: the header lies at the start of the mapping, which is
        // page-aligned and at least HEADER_BYTES long; all fields are atomics.
        unsafe { &*self.map.base().cast::<Header>() }
    }

    /// Whether world PE `pe` is on this node.
    pub(crate) fn holds(&self, pe: usize) -> bool {
        self.local_of.get(pe).is_some_and(Option::is_some)
    }

    /// The control cell of world PE `pe`, which must be on this node.
    pub(crate) fn cell(&self, pe: usize) -> &PeCell {
        let local = self.local_of[pe].expect("only a PE of this node has a cell in its control area");
        self.cell_at(local)
    }

    /// This PE's own cell.
    pub(crate) fn mine(&self) -> &PeCell {
        self.cell_at(self.my_local)
    }

    fn cell_at(&self, local: usize) -> &PeCell {
        assert!(HEADER_BYTES + (local + 1) * CELL_STRIDE <= self.map.len());
        // SAFETY: cells lie after the header at CELL_STRIDE (a multiple of
        // 4096, so aligned) intervals inside the mapping (the assert); all
        // fields are atomics, so shared references are sound across
        // processes, each access choosing its own ordering.
        unsafe { &*self.map.base().add(HEADER_BYTES + local * CELL_STRIDE).cast::<PeCell>() }
    }

    /// The remote row of world PE `pe` for team slot `slot` and round
    /// parity `parity` in the remote-rows area of `owner`, a PE of this
    /// node (in a job of more than one node).
    pub(crate) fn remote_row(&self, owner: usize, slot: usize, parity: usize, pe: usize) -> &[AtomicU64; DESC_WORDS] {
        let local = self.local_of[owner].expect("only a PE of this node has a remote-rows area here");
        assert!(slot < MAX_TEAMS && parity < 2 && pe < self.remote_pes);
        let stride = remote_stride(self.remote_pes).expect("sized when the object was made");
        let row = (slot * 2 + parity) * self.remote_pes + pe;
        let at = HEADER_BYTES + self.local_size * CELL_STRIDE + local * stride + row * DESC_WORDS * 8;
        assert!(at + DESC_WORDS * 8 <= self.map.len());
        // SAFETY: the row lies inside the mapping (the assert), 8-byte
        // aligned (every term is a multiple of 8 on a page-aligned base);
        // its words are atomics, each access choosing its own ordering.
        unsafe { &*self.map.base().add(at).cast::<[AtomicU64; DESC_WORDS]>() }
    }

    pub(crate) fn set_state(&self, state: PeState) {
        self.mine().state.store(state as u64, Ordering::SeqCst);
    }

    /// How `pe`, a PE of this node, is doing: its published state, and
    /// whether its process lives.
    pub(crate) fn peer_problem(&self, pe: usize) -> Option<String> {
        let cell = self.cell(pe);
        let left = || match cell.state.load(Ordering::SeqCst) {
            s if s == PeState::Finalized as u64 => Some("has finalized".to_string()),
            s if s == PeState::Exited as u64 => Some("has left (its context was dropped without finalize)".to_string()),
            _ => None,
        };
        if let Some(p) = left() {
            return Some(p);
        }
        let pid = cell.pid.load(Ordering::SeqCst) as libc::pid_t;
        // A PE that left and exited between the two looks is gone with its
        // final state written: look again before calling it dead (seen in
        // CI: a PE that had left reported as died).
        (pid > 0 && !process_alive(pid)).then(|| left().unwrap_or_else(|| format!("died (process {pid} is gone)")))
    }
}

/// Whether process `pid` exists and is not a zombie.
fn process_alive(pid: libc::pid_t) -> bool {
    let exists = || {
        // SAFETY: signal 0 only checks for existence and permission.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    };
    if !exists() {
        return false;
    }
    // A dead child not yet reaped by its launcher is still there as a zombie.
    match proc_state(pid) {
        Some(state) => !matches!(state, 'Z' | 'X'),
        // Reaped since the first look (gone), or no /proc: ask again.
        None => exists(),
    }
}

/// The state letter of process `pid` (`R`, `S`, `Z` …) in `/proc`, if it
/// can be read. A process whose main thread has ended shows `Z`, even
/// while its other threads are still ending.
pub(crate) fn proc_state(pid: libc::pid_t) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next())
}
