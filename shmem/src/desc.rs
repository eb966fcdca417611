//! The descriptors the public layer hands the backends: what to move,
//! as heap offsets, byte counts and PEs, and on which stream. They name
//! no public type and no backend.

use crate::control::op::OpKind;
use crate::control::DescRow;
use crate::dtype::ReduceOp;
use crate::heap::Region;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// The stream an operation is issued on: the public stream's CUDA stream
/// ([`crate::Stream::cuda_stream`]), `None` for the context's own. The
/// host backend has none and completes every operation at once.
pub(crate) type On<'a> = Option<&'a Arc<CudaStream>>;

/// A call that its kernel agrees on (see `Team::agrees_on_device`): the
/// agreement's epoch and this PE's row.
pub(crate) type DeviceAgreement = (u64, DescRow);

/// A data collective (broadcast, all-gather, all-reduce, reduce-scatter,
/// all-to-all) that the public layer checked and its team agreed on, or
/// whose agreement it leaves to the kernel (`agreement`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Collective {
    pub(crate) kind: OpKind,
    pub(crate) dst: Region,
    pub(crate) src: Region,
    /// The reduction's operator (reductions only).
    pub(crate) op: Option<ReduceOp>,
    /// The broadcast's root (team index).
    pub(crate) root: usize,
    pub(crate) agreement: Option<DeviceAgreement>,
}

/// A one-sided copy between this PE's heap and `pe`'s: `bytes` from heap
/// offset `src` to heap offset `dst`, from this PE to `pe` where `put`,
/// else from `pe` to this PE.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Transfer {
    pub(crate) put: bool,
    pub(crate) dst: usize,
    pub(crate) src: usize,
    pub(crate) bytes: usize,
    pub(crate) pe: usize,
}

impl Transfer {
    /// (PE, offset) of the destination and of the source, for PE `me`.
    pub(crate) fn ends(&self, me: usize) -> ((usize, usize), (usize, usize)) {
        match self.put {
            true => ((self.pe, self.dst), (me, self.src)),
            false => ((me, self.dst), (self.pe, self.src)),
        }
    }
}

/// A signal update: `value` stored into (or added to, where `add`) the
/// u64 at heap offset `offset` of PE `pe`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Signal {
    pub(crate) offset: usize,
    pub(crate) value: u64,
    pub(crate) add: bool,
    pub(crate) pe: usize,
}

/// One all-to-all-v call (`all_to_all_v`, `_2d`, `_2d_offset`), checked
/// locally.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AllToAllV {
    pub(crate) kind: OpKind,
    pub(crate) input: Region,
    pub(crate) output: Region,
    /// `in_splits`, or `in_splits_offsets` for the offset variant.
    pub(crate) splits: Region,
    pub(crate) out_splits_offsets: Region,
    pub(crate) row_len: usize,
    /// 0 for the operations that do not pad.
    pub(crate) major_align: usize,
    /// Entries per PE of splits (and of offsets): `n_pes × ne`.
    pub(crate) entries: usize,
}

impl AllToAllV {
    pub(crate) fn experts_per_pe(&self, n: usize) -> usize {
        self.entries / n
    }

    /// Rows of `row_len` elements in `r`.
    pub(crate) fn rows(&self, r: Region) -> u64 {
        (r.len / self.row_len) as u64
    }
}
