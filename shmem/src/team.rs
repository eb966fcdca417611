//! Teams: ordered subsets of the world that collectives run over.
//!
//! Every collective starts with an *exchange*: each member publishes a
//! descriptor of the call (operation, element type, buffer offsets and
//! lengths, root, and whether its own arguments were valid), enters the
//! team's barrier, and reads every member's descriptor. Only when all agree
//! does data move, so bad or mismatched arguments fail on every PE with
//! nothing written.

use crate::context::{Inner, Stream};
use crate::control::{DESC_WORDS, MAX_TEAMS};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::gpu::kernels::Kernels;
use crate::gpu::GpuWorld;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a descriptor describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum OpKind {
    Barrier = 1,
    Broadcast,
    AllGather,
    AllReduce,
    ReduceScatter,
    AllToAll,
    Alloc,
    Split,
    SplitBases,
    AllToAllV,
    AllToAllV2d,
    AllToAllV2dOffset,
    MoeSetup,
    AllGatherMatmul,
    MatmulReduceScatter,
}

impl OpKind {
    fn from_u8(v: u8) -> Option<OpKind> {
        use OpKind::*;
        [
            Barrier,
            Broadcast,
            AllGather,
            AllReduce,
            ReduceScatter,
            AllToAll,
            Alloc,
            Split,
            SplitBases,
            AllToAllV,
            AllToAllV2d,
            AllToAllV2dOffset,
            MoeSetup,
            AllGatherMatmul,
            MatmulReduceScatter,
        ]
        .into_iter()
        .find(|k| *k as u8 == v)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            OpKind::Barrier => "barrier",
            OpKind::Broadcast => "broadcast",
            OpKind::AllGather => "all_gather",
            OpKind::AllReduce => "all_reduce",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllToAll => "all_to_all",
            OpKind::Alloc => "alloc",
            OpKind::Split => "split_strided",
            OpKind::SplitBases => "split_strided",
            OpKind::AllToAllV => "all_to_all_v",
            OpKind::AllToAllV2d => "all_to_all_v_2d",
            OpKind::AllToAllV2dOffset => "all_to_all_v_2d_offset",
            OpKind::MoeSetup => "MoeAllToAll::new",
            OpKind::AllGatherMatmul => "all_gather_matmul",
            OpKind::MatmulReduceScatter => "matmul_reduce_scatter",
        }
    }
}

/// A collective call as the PEs compare it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Desc {
    pub(crate) kind: OpKind,
    pub(crate) dtype: Option<DType>,
    pub(crate) op: Option<ReduceOp>,
    /// Operation arguments that must be equal on every PE.
    pub(crate) args: [u64; 5],
    /// Per-PE data carried along, not compared.
    pub(crate) private: u64,
}

impl Desc {
    pub(crate) fn new(kind: OpKind) -> Desc {
        Desc { kind, dtype: None, op: None, args: [0; 5], private: 0 }
    }

    fn words(&self, seq: u64, err: u8) -> [u64; DESC_WORDS] {
        let head = self.kind as u64
            | (self.dtype.map_or(0, |d| d as u64) << 8)
            | (self.op.map_or(0, |o| o as u64) << 16)
            | ((err as u64) << 24);
        let a = self.args;
        [seq, head, a[0], a[1], a[2], a[3], a[4], self.private]
    }
}

/// One member's published row, decoded for messages.
struct Row<'a>(&'a [u64; DESC_WORDS]);

impl fmt::Display for Row<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.0;
        let kind = OpKind::from_u8(w[1] as u8);
        let name = kind.map_or("an unknown operation", |k| k.name());
        write!(f, "{name}(")?;
        if let Some(d) = DType::from_tag((w[1] >> 8) & 0xff) {
            write!(f, "{d}, ")?;
        }
        if let Some(op) = ReduceOp::ALL.iter().find(|o| **o as u64 == (w[1] >> 16) & 0xff) {
            write!(f, "{op}, ")?;
        }
        match kind {
            Some(OpKind::Alloc) => write!(
                f,
                "{} bytes, allocation #{}, with {} live buffers (set {:04x})",
                w[2],
                w[3],
                w[4],
                w[5] & 0xffff
            )?,
            Some(OpKind::Split) => write!(f, "start {}, stride {}, size {}", w[2], w[3], w[4])?,
            Some(OpKind::Barrier) | Some(OpKind::SplitBases) | None => {}
            Some(OpKind::AllToAllV | OpKind::AllToAllV2d | OpKind::AllToAllV2dOffset) => write!(
                f,
                "input at heap offset {}, output at heap offset {}, splits at heap offset {}, out splits/offsets \
                 at heap offset {}, sizes #{:016x}",
                w[2], w[3], w[4], w[5], w[6]
            )?,
            Some(OpKind::MoeSetup) => write!(
                f,
                "hidden {}, max tokens {}, experts per PE {}, top-k {}, major_align {}",
                w[2], w[3], w[4], w[5], w[6]
            )?,
            Some(OpKind::AllGatherMatmul) => write!(
                f,
                "a_shard {} elements at heap offset {}, a_out {} elements at heap offset {}, k {}",
                w[3],
                if w[2] == u64::MAX { "(its block of a_out)".to_string() } else { w[2].to_string() },
                w[5],
                w[4],
                w[6]
            )?,
            Some(OpKind::MatmulReduceScatter) => {
                write!(f, "workspace {} elements at heap offset {}, m {}, n {}", w[3], w[2], w[4], w[5])?
            }
            Some(_) => write!(
                f,
                "src {} elements at heap offset {}, dst {} elements at heap offset {}, root {}",
                w[3], w[2], w[5], w[4], w[6]
            )?,
        }
        write!(f, ")")
    }
}

/// The reason codes a PE publishes when its own arguments were bad.
fn err_code(e: &Error) -> u8 {
    match e {
        Error::OutOfBounds { .. } | Error::IndexOutOfBounds { .. } => 1,
        Error::LengthMismatch(_) => 2,
        Error::UnsupportedOp { .. } => 3,
        Error::Foreign(_) => 4,
        Error::Finalized(_) => 5,
        Error::PeOutOfRange { .. } => 6,
        Error::HeapExhausted { .. } => 7,
        _ => 8,
    }
}

fn err_reason(code: u64) -> &'static str {
    match code {
        1 => "a range out of bounds",
        2 => "a length mismatch",
        3 => "an unsupported reduction",
        4 => "a buffer of another context",
        5 => "a buffer of a finalized context",
        6 => "a PE out of range",
        7 => "heap exhausted",
        _ => "invalid arguments",
    }
}

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
    seq: AtomicU64,
    /// For split teams: the context whose slot to free on drop.
    owner: Option<Arc<Inner>>,
    /// NVSHMEM's handle of the team, on the GPU backend.
    pub(crate) nv_team: i32,
    /// The same on every member, different for every team: what a PE
    /// waiting in this team's barrier publishes.
    pub(crate) uid: u64,
    /// Where the members are: on this PE's node, or on others.
    pub(crate) span: crate::control::Span,
}

impl TeamState {
    /// The state of a team of `members` on this PE, which `ctl` (this PE's
    /// control plane) tells where they are.
    pub(crate) fn new(
        ctx_id: u64,
        slot: usize,
        members: Vec<usize>,
        ctl: &crate::control::Control,
        owner: Option<Arc<Inner>>,
        nv_team: i32,
        uid: u64,
    ) -> TeamState {
        let me = ctl.me();
        let my_index = members.iter().position(|&m| m == me).expect("a team state exists only on its members");
        let span = ctl.span(&members);
        let bases = vec![0; members.len()];
        let (arrivals, seq) = (AtomicU64::new(0), AtomicU64::new(0));
        TeamState { ctx_id, slot, members, my_index, bases, arrivals, seq, owner, nv_team, uid, span }
    }
}

impl Drop for TeamState {
    fn drop(&mut self) {
        if let Some(inner) = &self.owner {
            if let Some(g) = inner.gpu.as_ref().filter(|_| !inner.finalized.load(Ordering::Acquire)) {
                // Members drop their teams in the same order, as they made them.
                let _ = g.destroy_team(self.nv_team);
                if let Some(k) = &g.kernels {
                    k.drop_team(self.slot);
                }
            }
            *inner.free_team_slots.lock().unwrap_or_else(|e| e.into_inner()) |= 1 << self.slot;
            inner.ctl.team_left(self.uid);
        }
    }
}

/// An ordered subset of the world's PEs. Cheap to clone.
///
/// Every collective runs over a team; [`crate::Context`]'s collectives use
/// the world team.
#[derive(Clone)]
pub struct Team {
    pub(crate) ctx: Arc<Inner>,
    pub(crate) state: Arc<TeamState>,
}

impl fmt::Debug for Team {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Team").field("slot", &self.state.slot).field("members", &self.state.members).finish()
    }
}

impl Team {
    pub(crate) fn from_state(ctx: Arc<Inner>, state: Arc<TeamState>) -> Team {
        Team { ctx, state }
    }

    /// This PE's index in the team.
    pub fn my_pe(&self) -> usize {
        self.state.my_index
    }

    /// Number of PEs in the team.
    pub fn n_pes(&self) -> usize {
        self.state.members.len()
    }

    /// The world PE of the team's PE `pe`.
    pub fn world_pe(&self, pe: usize) -> Result<usize> {
        self.state.members.get(pe).copied().ok_or(Error::PeOutOfRange { pe, n_pes: self.n_pes() })
    }

    /// The index in `other` of this team's PE `pe`, or `None` if it is not a member of `other`.
    pub fn translate_pe(&self, pe: usize, other: &Team) -> Result<Option<usize>> {
        let world = self.world_pe(pe)?;
        Ok(other.state.members.iter().position(|&m| m == world))
    }

    /// Checks that the team is usable with this PE's context.
    pub(crate) fn check(&self) -> Result<()> {
        if self.state.ctx_id != self.ctx.id {
            return Err(Error::Foreign("team"));
        }
        self.ctx.check_live("team")
    }

    /// A team of the PEs `start, start + stride, …` (`size` of them) of this team.
    /// Returns `None` on PEs that are not members.
    ///
    /// # Collective
    /// Every PE of this team calls it with the same arguments.
    pub fn split_strided(&self, start: usize, stride: usize, size: usize) -> Result<Option<Team>> {
        self.check()?;
        let n = self.n_pes();
        let valid = if size == 0 || stride == 0 {
            Err(Error::Invalid(format!("split_strided: size ({size}) and stride ({stride}) must be at least 1")))
        } else if start.checked_add(stride.saturating_mul(size - 1)).is_none_or(|last| last >= n) {
            Err(Error::PeOutOfRange { pe: start.saturating_add(stride.saturating_mul(size - 1)), n_pes: n })
        } else {
            Ok(())
        };
        let free_mask = *self.ctx.free_team_slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut d = Desc::new(OpKind::Split);
        d.args = [start as u64, stride as u64, size as u64, 0, 0];
        d.private = free_mask;
        let rows = self.exchange(&d, valid.as_ref().err())?;
        valid?;
        self.agree(&rows)?;
        let common = rows.iter().fold(!0u64, |m, r| m & r[DESC_WORDS - 1]);
        if common == 0 {
            return Err(Error::TeamsExhausted { max: MAX_TEAMS });
        }
        let slot = common.trailing_zeros() as usize;
        let members: Vec<usize> = (0..size).map(|i| self.state.members[start + i * stride]).collect();
        let is_member = members.contains(&self.ctx.me);
        if is_member {
            *self.ctx.free_team_slots.lock().unwrap_or_else(|e| e.into_inner()) &= !(1 << slot);
        }
        // The kernels' state of the slot, zeroed by every member before the
        // second exchange lets anyone use the team.
        let added = match &self.ctx.gpu {
            Some(g) if is_member => g.kernels.as_ref().map_or(Ok(()), |k| k.add_team(g, slot, &members, self.ctx.me)),
            _ => Ok(()),
        };
        // Second exchange: each member's barrier counter on the chosen slot,
        // read before anyone can enter a barrier of the new team.
        let mut d = Desc::new(OpKind::SplitBases);
        d.private = self.ctx.ctl.slot_epoch(slot);
        let rows = self.exchange(&d, added.as_ref().err())?;
        added?;
        self.agree(&rows)?;
        // A team NVSHMEM has no team for (a node of ranks that are not
        // consecutive) has no NVSHMEM sub-teams either: shmem's kernels only.
        let nv_team = match &self.ctx.gpu {
            Some(g) if self.state.nv_team != crate::gpu::TEAM_INVALID => {
                g.split_team(self.state.nv_team, start, stride, size)?
            }
            _ => crate::gpu::TEAM_INVALID,
        };
        if !is_member {
            return Ok(None);
        }
        let bases = members
            .iter()
            .map(|&w| rows[self.state.members.iter().position(|&m| m == w).unwrap()][DESC_WORDS - 1])
            .collect();
        // Every member computes the same id: the parent's, where in the
        // parent's sequence the split happened, and its arguments.
        let at = self.state.seq.load(Ordering::Relaxed);
        let uid = [self.state.uid, at, start as u64, stride as u64, size as u64]
            .iter()
            .fold(0x9e37_79b9_7f4a_7c15u64, |h, &x| (h ^ x).wrapping_mul(0x100_0000_01b3).rotate_left(29))
            | 1 << 63;
        self.ctx.ctl.team_joined(uid, slot);
        let mut state = TeamState::new(self.ctx.id, slot, members, &self.ctx.ctl, Some(self.ctx.clone()), nv_team, uid);
        state.bases = bases;
        Ok(Some(Team { ctx: self.ctx.clone(), state: Arc::new(state) }))
    }

    /// Blocks until every PE of the team has arrived.
    ///
    /// # Collective
    pub fn barrier(&self, stream: &Stream) -> Result<()> {
        self.check()?;
        let kernels = self.ctx.gpu.as_ref().and_then(|g| g.kernels.as_ref().map(|k| (g, k)));
        // shmem's barrier kernel on the stream, whose waits end (trap) after
        // the device's wait limit: a peer that dies mid-barrier cannot hang
        // the survivors, as NVSHMEM's barrier, which waits for ever, would.
        let kernel_barrier = |g: &GpuWorld, k: &Kernels| {
            let force = self.ctx.collectives.lock().unwrap_or_else(|e| e.into_inner()).force_rma;
            k.barrier(k.team(self.state.slot, &self.state.members, force)?, g.stream(stream).cu_stream())
        };
        if let Some((g, k)) = kernels.filter(|(g, _)| crate::gpu::capturing(g.stream(stream))) {
            // In a CUDA graph: without the host.
            return kernel_barrier(g, k);
        }
        let rows = self.exchange(&Desc::new(OpKind::Barrier), None)?;
        self.agree(&rows)?;
        let Some(g) = &self.ctx.gpu else { return Ok(()) };
        let st = g.stream(stream);
        if self.state.members.len() == 1 {
            // A one-PE team waits for nobody: the barrier is the quiet.
            // (NVSHMEM's barrier kernel on a one-PE team read address 0x10
            // on the box: invalid reads under memcheck, an illegal address
            // under racecheck.)
            return g.quiet(st);
        }
        match kernels {
            // This PE's puts complete first.
            Some((g, k)) => g.quiet(st).and_then(|()| kernel_barrier(g, k)),
            None if self.state.nv_team == crate::gpu::TEAM_INVALID => Err(Error::BackendUnavailable(
                "a barrier of a team NVSHMEM has no team for (a node whose PEs are not consecutive ranks) needs the \
                 device kernels"
                    .into(),
            )),
            None => g.barrier(self.state.nv_team, st),
        }
    }

    /// Like [`Team::barrier`]; on the GPU backend it orders memory but does
    /// not wait for outstanding puts (NVSHMEM's `team_sync`).
    ///
    /// # Collective
    pub fn sync(&self, stream: &Stream) -> Result<()> {
        self.barrier(stream)
    }

    /// Enters the team's barrier and waits for every member.
    pub(crate) fn raw_barrier(&self) -> Result<()> {
        self.ctx.ctl.barrier(&self.state)
    }

    /// Publishes `desc`, enters the barrier, and returns every member's row.
    pub(crate) fn exchange(&self, desc: &Desc, my_error: Option<&Error>) -> Result<Vec<[u64; DESC_WORDS]>> {
        let seq = self.state.seq.fetch_add(1, Ordering::Relaxed);
        self.ctx.ctl.exchange(&self.state, seq, &desc.words(seq, my_error.map_or(0, err_code)))
    }

    /// Fails unless every member's row carries no error and the same call.
    pub(crate) fn agree(&self, rows: &[[u64; DESC_WORDS]]) -> Result<()> {
        let n = rows.len();
        let me = self.state.my_index;
        for (i, r) in rows.iter().enumerate() {
            let code = (r[1] >> 24) & 0xff;
            if code != 0 && i != me {
                return Err(Error::CollectiveMismatch(format!(
                    "{} on a team of {n} PEs: PE {} rejected its arguments ({})",
                    Row(r),
                    self.state.members[i],
                    err_reason(code)
                )));
            }
        }
        let strip = |r: &[u64; DESC_WORDS]| {
            let mut r = *r;
            r[1] &= 0xff_ffff; // the error code
            r[DESC_WORDS - 1] = 0; // private data
            r
        };
        let mine = strip(&rows[me]);
        if let Some(i) = rows.iter().position(|r| strip(r) != mine) {
            return Err(Error::CollectiveMismatch(format!(
                "on a team of {n} PEs, PE {} called {} but PE {} called {}",
                self.ctx.me,
                Row(&rows[me]),
                self.state.members[i],
                Row(&rows[i])
            )));
        }
        Ok(())
    }
}
