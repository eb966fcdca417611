//! Teams: ordered subsets of the world that collectives run over.
//!
//! Every collective starts with an *agreement*: each member publishes a
//! descriptor of the call (operation, element type, buffer offsets and
//! lengths, root, and whether its own arguments were valid) and reads every
//! member's. Only when all agree does data move, so bad or mismatched
//! arguments fail on every PE with nothing written.
//!
//! Where it happens:
//!
//! - on the host, in an *exchange* through the control plane (a barrier
//!   of the team that carries the rows): the host backend, team splits,
//!   allocations, the overlapped operations, NVSHMEM's collectives
//!   ([`crate::CollImpl::Nvshmem`]) and teams of one;
//! - on the device, for the eager calls (outside graph capture) of the
//!   GPU backend's own collective kernels and barrier ([`Team::agrees_on_device`])
//!   and of its MoE all-to-all-v kernels and layer: the call's row travels
//!   with its kernel, whose first step compares every member's row
//!   (`kernels/core/agree.cuh`), so that no PE waits for another on the host.
//!   On a mismatch every member's kernel skips the call (and the kernels
//!   after it in the same call: the MoE forms' data kernel, the node-aware
//!   MoE layer's exchanges, which its agreement over the world covers),
//!   and each PE's kernel records every member's row in host-mapped
//!   memory; the host reads the record without a round trip and fails
//!   with the message the exchange would give ([`agreement_error`]), as
//!   below. A PE whose own arguments fail its checks returns its error at
//!   once, after launching the agreement alone with its error code in its
//!   row, so that its peers skip the call and report it too;
//! - nowhere, in graph capture: a graph replays without the host, and its
//!   calls are checked on each PE only.
//!
//! How a failure the device finds is reported: [`Team`]'s docs.

use crate::context::{Inner, Stream};
pub(crate) use crate::control::op::OpKind;
use crate::control::team::{Release, TeamState};
use crate::control::{DescRow, DESC_WORDS, MAX_TEAMS};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result, RoutingFault};
use crate::gpu::abi::{AGREE_ERROR_SHIFT, AGREE_HEAD_WORD, AGREE_PRIVATE_WORD, AGREE_WORDS};
use crate::gpu::coll::GpuTeam;
use crate::gpu::kernels::AgreementFailure;
use crate::host::team::HostTeam;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
            | ((err as u64) << AGREE_ERROR_SHIFT);
        let a = self.args;
        [seq, head, a[0], a[1], a[2], a[3], a[4], self.private]
    }
}

// The kernels compare rows as `Desc::words` lays them out (`abi.cuh`).
const _: () = assert!(AGREE_WORDS == DESC_WORDS);
const _: () = assert!(AGREE_HEAD_WORD == 1 && AGREE_ERROR_SHIFT == 24);
const _: () = assert!(AGREE_PRIVATE_WORD == DESC_WORDS - 1);

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
            Some(OpKind::MoeDispatch | OpKind::MoeCombine) => write!(
                f,
                "the exchange with wire rows at heap offset {}, staged at {}, the view at {}, rail rows at {}, \
                 staged at {}",
                w[2], w[3], w[4], w[5], w[6]
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
        // 9.. name the routing fault (see `err_reason`).
        Error::BadRouting { fault, .. } => 9 + RoutingFault::ALL.iter().position(|f| f == fault).unwrap_or(0) as u8,
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
        9..=12 => RoutingFault::ALL[code as usize - 9].describe(),
        _ => "invalid arguments",
    }
}

/// What frees split team `uid` (slot `slot`, NVSHMEM's team `nv_team`)
/// once its last holder drops it: its NVSHMEM team and kernel slot (GPU
/// backend, context alive), then its slot in the control plane. Members
/// drop their teams in the same order, as they made them.
fn release_split(inner: Arc<Inner>, slot: usize, nv_team: i32, uid: u64) -> Release {
    Box::new(move || {
        if !inner.finalized.load(Ordering::Acquire) {
            inner.backend.drop_team(slot, nv_team);
        }
        *inner.free_team_slots.lock().unwrap_or_else(|e| e.into_inner()) |= 1 << slot;
        inner.ctl.team_left(uid);
    })
}

/// An ordered subset of the world's PEs. Cheap to clone.
///
/// Every collective runs over a team; [`crate::Context`]'s collectives use
/// the world team.
///
/// Bad or mismatched arguments fail a collective on every PE, with nothing
/// written: on the host backend before the call returns; on the GPU
/// backend, for an eager call, on the device, as below.
///
/// # Failures found on the device
///
/// A call that its kernels check (an eager collective's agreement; a MoE
/// exchange's splits and routing, in eager calls and graph replays alike)
/// returns before the check, and its kernels write nothing where it
/// fails. Every PE's kernels reach the same verdict and each PE's record
/// holds it. The first of these calls of this PE that can see the failure
/// returns it, with the message the host's check gives, once:
///
/// - every call that waits for a stream on the host: `copy_to_host`,
///   `copy_to_host_into`, [`crate::Stream::synchronize`], the GPU backend's
///   `signal_wait_until`, `g`, `signal_fetch`, and the calls that
///   synchronise anyway (the copy-engine all-gather, an in-place
///   all-to-all through a copy, the MoE layer's host paths);
/// - every later collective, barrier, RMA and MoE call, which reads the
///   record (mapped host memory, no synchronisation) once its own work is
///   issued: it still made its call, so the PEs' calls stay in step
///   whichever call each PE learns of the failure at;
/// - [`crate::Context::finalize`], for a failure no call reported;
/// - [`crate::Context::check_device`], on request.
///
/// A call's own error comes first and leaves an earlier failure for the
/// next call. Which call reports depends on when the kernel ran: a call
/// that waits for the failed call's stream always does.
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
        let added = if is_member { self.ctx.backend.add_team(slot, &members, self.ctx.me) } else { Ok(()) };
        // Second exchange: each member's barrier counter on the chosen slot,
        // read before anyone can enter a barrier of the new team.
        let mut d = Desc::new(OpKind::SplitBases);
        d.private = self.ctx.ctl.slot_epoch(slot);
        let rows = self.exchange(&d, added.as_ref().err())?;
        added?;
        self.agree(&rows)?;
        // A team NVSHMEM has no team for (a node of ranks that are not
        // consecutive) has no NVSHMEM sub-teams either: shmem's kernels only.
        let nv_team = self.ctx.backend.split_team(self.state.nv_team, start, stride, size)?;
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
        let release = release_split(self.ctx.clone(), slot, nv_team, uid);
        let mut state = TeamState::new(self.ctx.id, slot, members, &self.ctx.ctl, Some(release), nv_team, uid);
        state.bases = bases;
        Ok(Some(Team { ctx: self.ctx.clone(), state: Arc::new(state) }))
    }

    /// Blocks until every PE of the team has arrived.
    ///
    /// On the GPU backend the barrier is on the stream: the work after it
    /// waits there, not the host. A barrier that another PE met with a
    /// different collective call fails as a collective does (see
    /// [`Team`]).
    ///
    /// # Collective
    pub fn barrier(&self, stream: &Stream) -> Result<()> {
        let r = self.barrier_unreported(stream);
        self.ctx.report(r)
    }

    /// [`Team::barrier`], leaving a failure the device found earlier for
    /// the caller to report.
    pub(crate) fn barrier_unreported(&self, stream: &Stream) -> Result<()> {
        self.check()?;
        let on = stream.cuda_stream();
        let row = || self.device_row(&Desc::new(OpKind::Barrier), None);
        if let Some(done) = self.on_gpu(|t| t.barrier_on_device(row, on)).flatten() {
            return done;
        }
        let rows = self.exchange(&Desc::new(OpKind::Barrier), None)?;
        self.agree(&rows)?;
        self.on_gpu(|t| t.barrier_agreed(on)).unwrap_or(Ok(()))
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

    /// The team as the host backend's collectives see it (`None` on the
    /// gpu backend), with the settings as they are now.
    pub(crate) fn host(&self) -> Option<HostTeam<'_>> {
        let ctx = &self.ctx;
        Some(HostTeam {
            heap: ctx.backend.host()?,
            ctl: &ctx.ctl,
            state: &self.state,
            pool: &ctx.pool,
            net: &ctx.net,
            alloc: &ctx.heap,
            cfg: *ctx.collectives.lock().unwrap_or_else(|e| e.into_inner()),
        })
    }

    /// `f` of the team as the gpu backend sees it (`None` on the host
    /// backend), with the settings as they are now.
    pub(crate) fn on_gpu<R>(&self, f: impl FnOnce(&GpuTeam<'_>) -> R) -> Option<R> {
        let ctx = &self.ctx;
        let failed = || self.failed_agreement();
        Some(f(&GpuTeam {
            g: ctx.backend.gpu()?,
            ctl: &ctx.ctl,
            state: &self.state,
            alloc: &ctx.heap,
            cfg: *ctx.collectives.lock().unwrap_or_else(|e| e.into_inner()),
            failed: &failed,
        }))
    }

    /// Publishes `desc`, enters the barrier, and returns every member's row.
    pub(crate) fn exchange(&self, desc: &Desc, my_error: Option<&Error>) -> Result<Vec<[u64; DESC_WORDS]>> {
        let seq = self.state.seq.fetch_add(1, Ordering::Relaxed);
        self.ctx.ctl.exchange(&self.state, seq, &desc.words(seq, my_error.map_or(0, err_code)))
    }

    /// Fails unless every member's row carries no error and the same call.
    pub(crate) fn agree(&self, rows: &[[u64; DESC_WORDS]]) -> Result<()> {
        check_rows(rows, &self.state.members, self.state.my_index)
    }

    /// Whether this PE's eager call (not `capturing`) of a collective
    /// kernel or barrier on this team is agreed on the device, by the
    /// call's kernel, rather than on the host: on the GPU backend with
    /// shmem's kernels taking the team's collectives, for teams of more
    /// than one. The same on every member (each setting it reads must be).
    pub(crate) fn agrees_on_device(&self, capturing: bool) -> bool {
        self.on_gpu(|t| t.agrees_on_device(capturing)).unwrap_or(false)
    }

    /// The next agreement on the device of this team: its epoch (from 1)
    /// and this PE's row of `desc`, with the error code of `my_error`. The
    /// row's sequence number is the host exchanges' count, which it leaves
    /// as it is: the exchange's rows alternate by its parity.
    pub(crate) fn device_row(&self, desc: &Desc, my_error: Option<&Error>) -> (u64, DescRow) {
        let epoch = self.state.agreements.fetch_add(1, Ordering::Relaxed) + 1;
        let seq = self.state.seq.load(Ordering::Relaxed);
        (epoch, desc.words(seq, my_error.map_or(0, err_code)))
    }
}

/// Fails unless every member's row carries no error and the same call
/// (the per-PE word aside): `members` are the members' world PEs, `me`
/// this PE's place among them.
fn check_rows(rows: &[DescRow], members: &[usize], me: usize) -> Result<()> {
    let n = rows.len();
    for (i, r) in rows.iter().enumerate() {
        let code = (r[AGREE_HEAD_WORD] >> AGREE_ERROR_SHIFT) & 0xff;
        if code != 0 && i != me {
            return Err(Error::CollectiveMismatch(format!(
                "{} on a team of {n} PEs: PE {} rejected its arguments ({})",
                Row(r),
                members[i],
                err_reason(code)
            )));
        }
    }
    let strip = |r: &DescRow| {
        let mut r = *r;
        r[AGREE_HEAD_WORD] &= (1 << AGREE_ERROR_SHIFT) - 1; // the error code
        r[AGREE_PRIVATE_WORD] = 0; // private data
        r
    };
    let mine = strip(&rows[me]);
    if let Some(i) = rows.iter().position(|r| strip(r) != mine) {
        return Err(Error::CollectiveMismatch(format!(
            "on a team of {n} PEs, PE {} called {} but PE {} called {}",
            members[me],
            Row(&rows[me]),
            members[i],
            Row(&rows[i])
        )));
    }
    Ok(())
}

/// The error of an agreement the kernels found failed: the message the
/// host's exchange gives for the same rows, with how many more failed
/// since.
pub(crate) fn agreement_error(f: &AgreementFailure) -> Error {
    let message = match check_rows(&f.rows, &f.pes, f.rank) {
        Err(Error::CollectiveMismatch(m)) => m,
        _ => format!(
            "a collective call on the team of PEs {:?} failed its agreement on the device (agreement {})",
            f.pes, f.epoch
        ),
    };
    match f.count {
        0 | 1 => Error::CollectiveMismatch(message),
        c => Error::CollectiveMismatch(format!("{message} (and {} later calls failed their agreement)", c - 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels' verdict (`agree` in `kernels/core/agree.cuh`): every word of
    /// every member's row equals this PE's, the per-PE word aside.
    fn device_agrees(rows: &[DescRow], me: usize) -> bool {
        rows.iter().all(|r| (0..AGREE_WORDS).all(|w| w == AGREE_PRIVATE_WORD || r[w] == rows[me][w]))
    }

    fn all_reduce(len: u64) -> Desc {
        let mut d = Desc::new(OpKind::AllReduce);
        d.dtype = Some(DType::F32);
        d.op = Some(ReduceOp::Sum);
        d.args = [4096, len, 8192, len, 0];
        d
    }

    /// Calls that differ in anything the exchange compares.
    fn variants() -> Vec<Desc> {
        let base = all_reduce(10);
        let mut v = vec![base, all_reduce(11), Desc { op: Some(ReduceOp::Max), ..base }];
        v.push(Desc { dtype: Some(DType::I32), ..base });
        v.push(Desc { kind: OpKind::Broadcast, op: None, ..base });
        v.push(Desc::new(OpKind::Barrier));
        for i in 0..5 {
            let mut d = base;
            d.args[i] ^= 1 << 40;
            v.push(d);
        }
        v
    }

    #[test]
    fn differing_calls_give_differing_rows_and_errors_never_a_valid_row() {
        let rows: Vec<DescRow> = variants().iter().map(|d| d.words(3, 0)).collect();
        for (i, a) in rows.iter().enumerate() {
            for (j, b) in rows.iter().enumerate() {
                assert_eq!(device_agrees(&[*a, *b], 0), i == j, "variants {i} and {j}");
            }
        }
        // A PE whose own arguments failed publishes its code: its row is
        // no valid row, whatever its call.
        for d in variants() {
            for code in 1..=8 {
                let bad = d.words(3, code);
                assert!(rows.iter().all(|valid| !device_agrees(&[*valid, bad], 0)), "{d:?} with code {code}");
            }
        }
        // The per-PE word is carried, not compared.
        let mut a = all_reduce(10);
        a.private = 7;
        assert!(device_agrees(&[a.words(3, 0), all_reduce(10).words(3, 0)], 0));
    }

    /// Where this PE's own row is valid (the only rows a kernel reports),
    /// the device's verdict is the host's.
    #[test]
    fn the_device_fails_exactly_the_calls_the_host_fails() {
        let members = [0, 2, 5];
        let mut rows_of: Vec<(Desc, u8)> = variants().into_iter().take(4).map(|d| (d, 0)).collect();
        rows_of.push((all_reduce(10), 2));
        for a in &rows_of {
            for b in &rows_of {
                for c in &rows_of {
                    let rows: Vec<DescRow> = [a, b, c].iter().map(|(d, e)| d.words(1, *e)).collect();
                    for me in (0..3).filter(|&m| [a, b, c][m].1 == 0) {
                        assert_eq!(device_agrees(&rows, me), check_rows(&rows, &members, me).is_ok());
                    }
                }
            }
        }
    }

    #[test]
    fn a_recorded_failure_reads_as_the_exchange_would_say_it() {
        let rows = vec![all_reduce(10).words(0, 0), all_reduce(11).words(0, 0)];
        let f = AgreementFailure { epoch: 4, slot: 0, rank: 0, pes: vec![0, 3], rows: rows.clone(), count: 1 };
        let expected =
            "on a team of 2 PEs, PE 0 called all_reduce(f32, sum, src 10 elements at heap offset 4096, dst 10 \
                        elements at heap offset 8192, root 0) but PE 3 called all_reduce(f32, sum, src 11 elements at \
                        heap offset 4096, dst 11 elements at heap offset 8192, root 0)";
        match agreement_error(&f) {
            Error::CollectiveMismatch(m) => assert_eq!(m, expected),
            e => panic!("{e}"),
        }
        let e = agreement_error(&AgreementFailure { count: 3, ..f.clone() }).to_string();
        assert!(e.ends_with("(and 2 later calls failed their agreement)"), "{e}");
        let rejected = vec![all_reduce(10).words(0, 0), Desc::new(OpKind::AllReduce).words(0, 1)];
        let e = agreement_error(&AgreementFailure { rows: rejected, ..f }).to_string();
        assert!(e.contains("PE 3 rejected its arguments (a range out of bounds)"), "{e}");
    }
}
