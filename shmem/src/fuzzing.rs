//! Internals for the fuzz targets in `fuzz/`. **Not API**: hidden from the
//! docs, no stability promise, may change or vanish in any release.

use crate::error::Result;
use crate::team::OpKind;

pub use crate::host::a2av::{Chunk, Plan};

/// Which all-to-all-v operation to plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum A2av {
    /// `all_to_all_v`.
    OneD,
    /// `all_to_all_v_2d` (dispatch).
    TwoD,
    /// `all_to_all_v_2d_offset` (combine).
    TwoDOffset,
}

/// The pure validation and layout of an all-to-all-v, as every PE runs it
/// after reading all PEs' splits; see the preconditions there (the shapes are
/// the caller's to get right, as `Team::shape` does for the real calls).
pub fn plan_exchange(
    op: A2av,
    me: usize,
    splits: &[Vec<i64>],
    entries: usize,
    in_rows: u64,
    out_rows: u64,
    major_align: usize,
) -> Result<Plan> {
    let kind = match op {
        A2av::OneD => OpKind::AllToAllV,
        A2av::TwoD => OpKind::AllToAllV2d,
        A2av::TwoDOffset => OpKind::AllToAllV2dOffset,
    };
    crate::host::a2av::plan_exchange(kind, me, splits, entries, in_rows, out_rows, major_align)
}
