//! Launchers of the MoE all-to-all-v (`moe_*.cu`): the line kernel, the one
//! kernel, or the plan kernel and the data kernel, as
//! [`crate::algo::moe_form`] chooses.

use super::abi::{
    a2av_lines_shared_bytes, a2av_one_kernel_shared_bytes, a2av_plan_shared_bytes, a2av_work_words, A2av, A2avKind,
    TeamSync, LINE_DATA_BYTES_WIDE, MAX_BLOCKS,
};
use super::coll::GpuTeam;
use super::kernel_id::{KernelId, Plain};
use super::kernels::Kernels;
use super::layout::A2AV_TABLE_WORDS;
use super::{capturing, CUstream, CudaCall};
use crate::algo::{moe_form, Collectives, MoeForm, TeamShape};
use crate::control::op::{invalid, OpKind};
use crate::desc::{AllToAllV, DeviceAgreement, On};
use crate::dtype::Element;
use crate::error::{Error, Result};
use cudarc::driver::CudaStream;

/// Input bytes per block of the data kernel's grid unless tuned (the
/// kernels keep as many working as the busiest PE's bytes need:
/// `a2av_active` in `moe/a2av.cuh`).
const A2AV_BYTES_PER_BLOCK: usize = 32 << 10;

/// Input bytes per block of the line kernel's grid unless tuned: one pass
/// of its 16 warps, 4 lines of 112 data bytes each (`MoeLines` in
/// `moe/a2av_lines.cu`), so that a warp's lines leave in one pass where the grid
/// allows (`docs/tuning.md`).
const A2AV_LINES_BYTES_PER_BLOCK: usize = 16 * 4 * LINE_DATA_BYTES_WIDE;

impl Kernels {
    /// Whether `n` PEs with `ne` experts each fit the staging (`kind`
    /// [`A2avKind::TwoDOffset`] stages offsets too).
    pub(crate) fn a2av_fits(n: usize, ne: usize, kind: i32) -> bool {
        let with_offsets = kind == A2avKind::TwoDOffset as i32;
        a2av_work_words(n, ne, with_offsets).saturating_add(n.saturating_mul(ne).saturating_mul(4)).saturating_add(2)
            <= A2AV_TABLE_WORDS
    }

    /// Launches the MoE all-to-all-v in the form [`moe_form`] chooses for
    /// `settings` (every PE the same: the same team, sizes and settings).
    /// `settings.moe_local_blocks` of the data blocks copy this PE's own
    /// chunks while the others push (0: each pushes, then copies; `None`:
    /// the kernel chooses). A failed check writes nothing but the record
    /// [`Kernels::take_a2av_error`] reads.
    pub(crate) fn all_to_all_v(
        &self,
        t: TeamSync,
        world: bool,
        a: A2av,
        settings: &Collectives,
        s: CUstream,
    ) -> Result<()> {
        let kind =
            A2avKind::of(a.kind).ok_or_else(|| Error::Invalid(format!("no MoE all-to-all-v kind {}", a.kind)))?;
        let mut a = a;
        a.table = self.layout.a2av() as u64;
        a.error = self.a2av_error.device;
        let in_bytes = (a.in_rows * a.row_bytes) as usize;
        let (n, ne, with_offsets) = (t.n_pes(), a.ne as usize, a.with_offsets());
        let team = TeamShape { world, n_pes: n, nvlink: t.nvlink(), lines: self.lines() };
        let form = moe_form(team, ne, with_offsets, in_bytes, settings.moe, &settings.tuning);
        // The blocks, by what the input can hold (the line kernel: all of
        // them work).
        let tuned = settings.tuning.moe_block_bytes.map(|b| b.max(16));
        if form == MoeForm::Lines {
            // Every block of the line kernel waits for the peers' lines
            // from its start: all of them resident at once on every PE.
            let per = tuned.unwrap_or(A2AV_LINES_BYTES_PER_BLOCK);
            let resident = self.resident_blocks.clamp(1, MAX_BLOCKS);
            a.blocks = in_bytes.div_ceil(per).clamp(1, resident) as i32;
            let shared = a2av_lines_shared_bytes(n, ne, with_offsets) as u32;
            // SAFETY: (TeamSync, A2av) as the kernel declares; the regions
            // were checked on the host, the splits are checked on the
            // device, and what a PE sends fits the buffer (`moe_lines_fit`).
            return unsafe { self.launch_with(KernelId::A2avLines(kind), a.blocks as usize, shared, t, a, s) };
        }
        // The other kernels keep as many working as what is sent needs
        // (`a2av_active`; the idle ones skip their channel).
        let per = tuned.unwrap_or(A2AV_BYTES_PER_BLOCK);
        let blocks = in_bytes.div_ceil(per).clamp(1, Self::most_blocks(&t));
        a.block_bytes = per as u64;
        a.blocks = blocks as i32;
        a.local_blocks = settings.moe_local_blocks.map_or(-1, |b| b.min(MAX_BLOCKS as u32) as i32);
        if form == MoeForm::OneKernel {
            let shared = a2av_one_kernel_shared_bytes(n, ne, with_offsets) as u32;
            // SAFETY: (TeamSync, A2av) as the kernel declares; the regions
            // were checked on the host, the splits are checked on the device.
            return unsafe { self.launch_with(KernelId::A2avFused(kind), blocks, shared, t, a, s) };
        }
        // Every PE's splits (and offsets) and the work arrays in the plan
        // kernel's shared memory where they fit.
        let shared = a2av_plan_shared_bytes(n, ne, with_offsets);
        a.shared_splits = (shared > 0) as i32;
        // SAFETY: as above.
        unsafe { self.launch_with(KernelId::Plain(Plain::A2avPlan), 1, shared as u32, t, a, s) }?;
        // SAFETY: as above.
        unsafe { self.launch_with(KernelId::Plain(Plain::A2avMove), blocks, 0, t, a, s) }
    }
}

/// How a MoE all-to-all-v on the device agrees and reports (the public
/// layer's `Agreement`): `own` where the call agrees by itself (else a
/// caller's agreement covers it); `wait` to wait for the kernels and fail
/// the call itself where its agreement failed; `skip_if`, the heap word
/// that skips the call where a caller's agreement failed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Launch {
    pub(crate) own: bool,
    pub(crate) wait: bool,
    pub(crate) skip_if: Option<usize>,
}

/// The `kind` of `abi.cuh`'s `A2av`.
pub(crate) fn a2av_kind(kind: OpKind) -> i32 {
    match kind {
        OpKind::AllToAllV => A2avKind::V as i32,
        OpKind::AllToAllV2d => A2avKind::TwoD as i32,
        _ => A2avKind::TwoDOffset as i32,
    }
}

/// The MoE all-to-all-v of a team on the gpu backend.
impl GpuTeam<'_> {
    /// Whether an eager call on this team agrees on the device (its first
    /// kernel compares the members' rows): where shmem's kernels take the
    /// team and it has peers. The same on every member.
    fn moe_agrees_on_device(&self) -> bool {
        self.g.kernels.is_some() && (2..=super::kernels::MAX_TEAM).contains(&self.state.members.len())
    }

    /// The call (`call`: this PE's checked arguments, or its error) on the
    /// device: agreed by its first kernel where it agrees by itself, eager
    /// and on a team the kernels agree on (`row` gives this PE's row); else
    /// launched as it is. A PE whose own arguments failed launches the
    /// agreement alone, so that its peers skip the call, and returns its
    /// error.
    pub(crate) fn all_to_all_v<T: Element>(
        &self,
        call: Result<AllToAllV>,
        how: Launch,
        row: impl FnOnce(Option<&Error>) -> DeviceAgreement,
        stream: On<'_>,
    ) -> Result<()> {
        let st = self.g.stream(stream);
        // A graph replays without the host, and agrees nowhere; a call
        // that a caller's agreement covers has none of its own; and a
        // team of one, or one the kernels do not take (which fails on
        // every PE alike), has nothing to agree on.
        if !how.own || capturing(st) || !self.moe_agrees_on_device() {
            return self.launch_a2av::<T>(&call?, None, how.skip_if, st).map(drop);
        }
        // The first kernel agrees on the call (`kernels/moe/a2av.cuh`).
        let agreement = row(call.as_ref().err());
        let call = match call {
            Ok(c) => c,
            Err(e) => {
                // The peers' kernels wait for this PE's row (should the
                // launch fail, the context is lost anyway): the caller's
                // error first.
                let _ = self.agree_alone(agreement, stream);
                return Err(e);
            }
        };
        let t = self.launch_a2av::<T>(&call, Some(agreement), None, st)?;
        if how.wait {
            st.synchronize().cuda("cuStreamSynchronize")?;
            if self.g.kernels.as_ref().is_some_and(|k| k.agreement_failed(&t)) {
                return Err((self.failed)());
            }
        }
        Ok(())
    }

    /// The device kernels (`kernels/moe_*.cu`), agreeing first on the call
    /// where given its `agreement`, skipping it where the word at heap
    /// offset `skip_if` is set: splits are read and checked on the device,
    /// every PE reaching the same verdict; a bad exchange writes nothing
    /// and is reported by the first call that can see it (see [`crate::Team`]).
    /// Returns the view the kernels were launched with.
    fn launch_a2av<T: Element>(
        &self,
        c: &AllToAllV,
        agreement: Option<DeviceAgreement>,
        skip_if: Option<usize>,
        st: &CudaStream,
    ) -> Result<TeamSync> {
        let k = self.g.kernels.as_ref().ok_or_else(super::kernels::not_built)?;
        let n = self.n_pes();
        if n > super::kernels::MAX_TEAM {
            return Err(invalid(
                c.kind,
                format!("the device kernels take teams of up to {} PEs, this one has {n}", super::kernels::MAX_TEAM),
            ));
        }
        let settings = self.cfg;
        let plain = k.team(self.state.slot, &self.state.members, settings.force_rma)?;
        let t = agreement.map_or(plain, |(epoch, row)| plain.agreeing(epoch, row));
        let mut a = A2av::new(
            a2av_kind(c.kind),
            c.input.offset,
            c.output.offset,
            c.splits.offset,
            c.out_splits_offsets.offset,
            c.row_len * size_of::<T>(),
            c.input.len / c.row_len,
            c.output.len / c.row_len,
            c.experts_per_pe(n),
            c.major_align.max(1),
        );
        a.skip_if = skip_if.unwrap_or(0) as u64;
        k.all_to_all_v(t, self.state.slot == 0, a, &settings, st.cu_stream())?;
        Ok(t)
    }
}
