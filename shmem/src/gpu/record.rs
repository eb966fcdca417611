//! The records the kernels write for the host, in pinned host memory mapped
//! into the device, and what the host makes of them: the MoE kernels' when
//! their check of an exchange fails ([`A2avError`]), and the collectives'
//! when their agreement on an eager call fails ([`AgreeFailure`]).

use super::abi::{
    A2avError, AgreeFailure, A2AV_CODE_CLASS_SHIFT, A2AV_CODE_INDEX_MASK, A2AV_CODE_KIND_MASK, A2AV_CODE_KIND_SHIFT,
    A2AV_CODE_PE_MASK, A2AV_CODE_PE_SHIFT, AGREE_WORDS, MAX_TEAM,
};
use super::CudaCall;
use crate::error::Result;
use std::mem::{offset_of, size_of};

/// What a MoE all-to-all-v's device-side check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceCheckFailure {
    /// The operation (an [`A2avKind`](super::abi::A2avKind) as `i32`).
    pub kind: i32,
    /// The `A2AV_*` class of the failure (`A2AV_NEGATIVE_SPLIT` …
    /// `A2AV_PAST_OUTPUT` in the ABI).
    pub class: u32,
    /// The PE (its world number) whose splits (classes up to past-input) or
    /// output (past-output) are wrong.
    pub pe: usize,
    /// The entry of its splits (classes up to past-input).
    pub index: usize,
    /// The offending split, offset or received rows.
    pub value: i64,
    /// The input's (classes up to past-input) or output's (past-output) rows.
    pub limit: u64,
    /// Failed operations since the last look.
    pub count: u64,
}

impl DeviceCheckFailure {
    /// The failure a record holds.
    fn of(r: &A2avError) -> DeviceCheckFailure {
        DeviceCheckFailure {
            kind: ((r.code >> A2AV_CODE_KIND_SHIFT) & A2AV_CODE_KIND_MASK) as i32,
            class: (r.code >> A2AV_CODE_CLASS_SHIFT) as u32,
            pe: ((r.code >> A2AV_CODE_PE_SHIFT) & A2AV_CODE_PE_MASK) as usize,
            index: (r.code & A2AV_CODE_INDEX_MASK) as usize,
            value: r.value,
            limit: r.limit,
            count: r.count,
        }
    }
}

/// Pinned host memory mapped into the device (not managed memory), which
/// the device writes and the host reads without synchronising with the
/// stream: `words` 64-bit words, zeroed.
struct Mapped {
    ptr: *mut u64,
    /// `ptr` in the device's address space.
    device: u64,
    words: usize,
}

impl Mapped {
    fn new(words: usize) -> Result<Mapped> {
        // SAFETY: a plain pinned allocation; CU_MEMHOSTALLOC_DEVICEMAP maps
        // it into the device's address space (with unified addressing at the
        // same address).
        let ptr =
            unsafe { cudarc::driver::result::malloc_host(words * 8, cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP) }
                .cuda("cuMemHostAlloc")?
                .cast::<u64>();
        let mut device = 0;
        // SAFETY: `ptr` came from cuMemHostAlloc with DEVICEMAP.
        let mapped = unsafe { cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut device, ptr.cast(), 0) };
        let m = Mapped { ptr, device, words };
        mapped.result().cuda("cuMemHostGetDevicePointer")?;
        for w in 0..words {
            m.store(w, 0);
        }
        Ok(m)
    }

    fn load(&self, w: usize) -> u64 {
        assert!(w < self.words);
        // SAFETY: `w < words`; volatile, as the device writes it.
        unsafe { self.ptr.add(w).read_volatile() }
    }

    fn store(&self, w: usize, v: u64) {
        assert!(w < self.words);
        // SAFETY: as in `load`.
        unsafe { self.ptr.add(w).write_volatile(v) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once; an error (a dead
        // context) leaves nothing to free.
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr.cast()) };
    }
}

/// The word the kernels' waits look at to give up on a dead peer
/// (`shmem_peer_died` in the kernels' `core/team_sync.cuh`): the host sets it
/// once it sees a PE of the job die ([`PeerDied::set`]).
pub(super) struct PeerDied {
    mapped: Mapped,
}

impl PeerDied {
    pub(super) fn new() -> Result<PeerDied> {
        Ok(PeerDied { mapped: Mapped::new(1)? })
    }

    /// Its address in the device's address space.
    pub(super) fn device(&self) -> u64 {
        self.mapped.device
    }

    /// Tells the kernels' waits, running and to come, to give up.
    pub(super) fn set(&self) {
        self.mapped.store(0, 1);
    }
}

/// The MoE kernels' error record ([`A2avError`]).
pub(super) struct HostRecord {
    mapped: Mapped,
    /// Its address in the device's address space.
    pub(super) device: u64,
}

impl HostRecord {
    const WORDS: usize = size_of::<A2avError>() / 8;
    const COUNT: usize = offset_of!(A2avError, count) / 8;

    pub(super) fn new() -> Result<HostRecord> {
        let mapped = Mapped::new(Self::WORDS)?;
        Ok(HostRecord { device: mapped.device, mapped })
    }

    /// The recorded failure, cleared; `None` if nothing failed since the last look.
    pub(super) fn take(&self) -> Option<DeviceCheckFailure> {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let m = &self.mapped;
        let count = m.load(Self::COUNT);
        if count == 0 {
            return None;
        }
        let word = |offset: usize| m.load(offset / 8);
        let record = A2avError {
            code: word(offset_of!(A2avError, code)),
            value: word(offset_of!(A2avError, value)) as i64,
            count,
            limit: word(offset_of!(A2avError, limit)),
        };
        m.store(Self::COUNT, 0);
        Some(DeviceCheckFailure::of(&record))
    }
}

/// A failed agreement on an eager collective call, as the kernels recorded
/// it ([`AgreeFailure`]): the first since the host last looked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AgreementFailure {
    /// Its agreement epoch, and its team's slot (`TeamSync::sync_offset`).
    pub epoch: u64,
    pub slot: u64,
    /// This PE's place in the team.
    pub rank: usize,
    /// The members' world PEs.
    pub pes: Vec<usize>,
    /// The members' descriptor rows.
    pub rows: Vec<[u64; AGREE_WORDS]>,
    /// Failed agreements since the last look, this one included.
    pub count: u64,
}

impl AgreementFailure {
    /// The failure a record holds (`None` where it counts none, or holds
    /// no team the kernels take).
    fn of(r: &AgreeFailure) -> Option<AgreementFailure> {
        let n = usize::try_from(r.n).ok().filter(|&n| n <= MAX_TEAM && r.count > 0)?;
        let rank = usize::try_from(r.rank).ok().filter(|&k| k < n)?;
        Some(AgreementFailure {
            epoch: r.epoch,
            slot: r.slot,
            rank,
            pes: r.pes[..n].iter().map(|&p| p as usize).collect(),
            rows: r.rows[..n].to_vec(),
            count: r.count,
        })
    }
}

/// The kernels' record of failed agreements ([`AgreeFailure`]).
pub(super) struct AgreeRecord {
    mapped: Mapped,
    /// Its address in the device's address space.
    pub(super) device: u64,
}

impl AgreeRecord {
    const WORDS: usize = size_of::<AgreeFailure>() / 8;
    const COUNT: usize = offset_of!(AgreeFailure, count) / 8;

    pub(super) fn new() -> Result<AgreeRecord> {
        let mapped = Mapped::new(Self::WORDS)?;
        Ok(AgreeRecord { device: mapped.device, mapped })
    }

    /// Whether agreement `epoch` of the team at `slot` is the latest
    /// failure recorded (and not yet looked at): once its kernel has run,
    /// whether that call failed.
    pub(super) fn latest_is(&self, slot: u64, epoch: u64) -> bool {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let m = &self.mapped;
        m.load(Self::COUNT) != 0
            && m.load(offset_of!(AgreeFailure, latest_epoch) / 8) == epoch
            && m.load(offset_of!(AgreeFailure, latest_slot) / 8) == slot
    }

    /// The recorded failure, cleared; `None` if nothing failed since the last look.
    pub(super) fn take(&self) -> Option<AgreementFailure> {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let m = &self.mapped;
        if m.load(Self::COUNT) == 0 {
            return None;
        }
        // SAFETY: `AgreeFailure` is plain integers, any bits a valid value.
        let mut r: AgreeFailure = unsafe { std::mem::zeroed() };
        // SAFETY: `r` is `WORDS` 8-byte aligned words (its size and
        // alignment asserted in abi.rs), written here word by word.
        let words = unsafe { std::slice::from_raw_parts_mut((&raw mut r).cast::<u64>(), Self::WORDS) };
        for (w, slot) in words.iter_mut().enumerate() {
            *slot = m.load(w);
        }
        m.store(Self::COUNT, 0);
        AgreementFailure::of(&r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::abi::{A2avKind, A2AV_PAST_OUTPUT};

    #[test]
    fn a_record_unpacks_as_the_kernels_pack_it() {
        // `err_code` of moe/a2av.cuh, with the kind added by `a2av_report`.
        let code = (A2AV_PAST_OUTPUT as u64) << 56 | 5 << 32 | 7 | (A2avKind::TwoD as u64) << 52;
        let f = DeviceCheckFailure::of(&A2avError { code, value: -3, count: 2, limit: 9 });
        assert_eq!(
            f,
            DeviceCheckFailure {
                kind: A2avKind::TwoD as i32,
                class: A2AV_PAST_OUTPUT,
                pe: 5,
                index: 7,
                value: -3,
                limit: 9,
                count: 2
            }
        );
    }

    #[test]
    fn an_agreement_failure_unpacks_as_the_kernels_pack_it() {
        // SAFETY: plain integers, all zeros a valid value.
        let mut r: AgreeFailure = unsafe { std::mem::zeroed() };
        assert_eq!(AgreementFailure::of(&r), None, "nothing counted");
        r.count = 2;
        r.epoch = 9;
        r.slot = 4096;
        r.n = 2;
        r.rank = 1;
        r.pes[..2].copy_from_slice(&[3, 5]);
        r.rows[0] = [1; AGREE_WORDS];
        r.rows[1] = [2; AGREE_WORDS];
        let f = AgreementFailure::of(&r).expect("a failure");
        assert_eq!(
            f,
            AgreementFailure {
                epoch: 9,
                slot: 4096,
                rank: 1,
                pes: vec![3, 5],
                rows: vec![[1; AGREE_WORDS], [2; AGREE_WORDS]],
                count: 2
            }
        );
        r.rank = 2;
        assert_eq!(AgreementFailure::of(&r), None, "a rank outside the team");
        r.rank = 0;
        r.n = MAX_TEAM as i32 + 1;
        assert_eq!(AgreementFailure::of(&r), None, "a team larger than the kernels take");
    }
}
