//! The record the MoE kernels write when their check of an exchange fails
//! ([`A2avError`]), in pinned host memory mapped into the device, and what
//! the host makes of it.

use super::abi::{
    A2avError, A2AV_CODE_CLASS_SHIFT, A2AV_CODE_INDEX_MASK, A2AV_CODE_KIND_MASK, A2AV_CODE_KIND_SHIFT,
    A2AV_CODE_PE_MASK, A2AV_CODE_PE_SHIFT,
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
    /// The PE whose splits (classes up to past-input) or output (past-output) are wrong.
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

/// The error record: pinned host memory mapped into the device (not
/// managed memory), so the host reads it without synchronising with the
/// stream.
pub(super) struct HostRecord {
    ptr: *mut u64,
    /// `ptr` in the device's address space.
    pub(super) device: u64,
}

impl HostRecord {
    const WORDS: usize = size_of::<A2avError>() / 8;
    const COUNT: usize = offset_of!(A2avError, count) / 8;

    pub(super) fn new() -> Result<HostRecord> {
        // SAFETY: a plain pinned allocation; CU_MEMHOSTALLOC_DEVICEMAP maps
        // it into the device's address space (with unified addressing at the
        // same address).
        let ptr = unsafe {
            cudarc::driver::result::malloc_host(Self::WORDS * 8, cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP)
        }
        .cuda("cuMemHostAlloc")?
        .cast::<u64>();
        let mut device = 0;
        // SAFETY: `ptr` came from cuMemHostAlloc with DEVICEMAP.
        let mapped = unsafe { cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut device, ptr.cast(), 0) };
        let record = HostRecord { ptr, device };
        mapped.result().cuda("cuMemHostGetDevicePointer")?;
        for w in 0..Self::WORDS {
            record.store(w, 0);
        }
        Ok(record)
    }

    fn load(&self, w: usize) -> u64 {
        // SAFETY: `w < WORDS`; volatile, as the device writes it.
        unsafe { self.ptr.add(w).read_volatile() }
    }

    fn store(&self, w: usize, v: u64) {
        // SAFETY: as in `load`.
        unsafe { self.ptr.add(w).write_volatile(v) }
    }

    /// The recorded failure, cleared; `None` if nothing failed since the last look.
    pub(super) fn take(&self) -> Option<DeviceCheckFailure> {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let count = self.load(Self::COUNT);
        if count == 0 {
            return None;
        }
        let word = |offset: usize| self.load(offset / 8);
        let record = A2avError {
            code: word(offset_of!(A2avError, code)),
            value: word(offset_of!(A2avError, value)) as i64,
            count,
            limit: word(offset_of!(A2avError, limit)),
        };
        self.store(Self::COUNT, 0);
        Some(DeviceCheckFailure::of(&record))
    }
}

impl Drop for HostRecord {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once; an error (a dead
        // context) leaves nothing to free.
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr.cast()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::abi::{A2avKind, A2AV_PAST_OUTPUT};

    #[test]
    fn a_record_unpacks_as_the_kernels_pack_it() {
        // `err_code` of moe.cuh, with the kind added by `a2av_report`.
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
}
