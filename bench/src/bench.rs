//! The run: its context, stream and settings, which rows it makes and in
//! what order, and the helpers every group of rows shares.

use crate::args::{Args, Dtype};
use crate::data::Value;
use crate::ops::{Imp, Op, COLLECTIVES, LAYER, MOE};
use crate::report::{note, Row};
use crate::{moe, overlap, Res};
use cudarc::driver::CudaStream;
use shmem::{bf16, f16, BackendKind, Context, Stream, SymmetricBuffer};
use std::cell::{Cell, RefCell};
use std::io::Write as _;
use std::sync::Arc;

/// This PE's run: its context and stream, the settings, the message
/// sizes, and what the rows share.
pub(super) struct Bench<'a> {
    pub(super) ctx: &'a Context,
    pub(super) s: Stream,
    pub(super) args: &'a Args,
    pub(super) sizes: Vec<usize>,
    /// One word per PE, for [`Bench::agree`].
    pub(super) verdicts: SymmetricBuffer<u32>,
    /// One word per PE, for [`Bench::gather_net`].
    pub(super) net_words: SymmetricBuffer<u64>,
    /// Wrong results seen on this PE.
    pub(super) wrong: Cell<usize>,
    /// The last eager timing's host time to issue one operation (µs):
    /// the median batch's issue loop over its operations.
    pub(super) issue_us: Cell<Option<f64>>,
    /// With `--gated`, the last eager timing's device time per operation
    /// with its launches queued ahead (µs).
    pub(super) device_us: Cell<Option<f64>>,
    /// PE 0 with `--json`: rows as they are measured, without ratios.
    pub(super) partial: RefCell<Option<std::fs::File>>,
    pub(super) backend: String,
}

impl Bench<'_> {
    pub(super) fn gpu(&self) -> bool {
        self.ctx.backend() == BackendKind::Gpu
    }

    pub(super) fn cuda(&self) -> Res<&Arc<CudaStream>> {
        Ok(self.s.cuda_stream().ok_or("this needs the gpu backend")?)
    }

    pub(super) fn selected(&self, op: Op) -> bool {
        op.selected_by(&self.args.op)
    }

    /// Whether `imp` has a row for `op` at `bytes` in this run.
    pub(super) fn runs(&self, imp: Imp, op: Op, bytes: usize) -> bool {
        let n = self.ctx.n_pes();
        let ll_max_bytes = shmem::algo::low_latency_max_bytes(n, &self.args.tuning());
        let ll_room = shmem::algo::low_latency_room_bytes(n);
        (self.args.imp.is_empty() || self.args.imp.contains(&imp))
            && imp.runs(op, bytes, self.gpu(), ll_max_bytes, ll_room)
    }

    pub(super) fn graphs(&self, bytes: usize) -> bool {
        self.args.graph && self.gpu() && bytes <= self.args.graph_max_bytes
    }

    pub(super) fn iters(&self, bytes: usize) -> usize {
        match self.args.iters {
            Some(n) => n as usize,
            None => ((256usize << 20) / bytes.max(1)).clamp(10, 1000),
        }
    }

    /// The element types of `op`'s rows.
    pub(super) fn dtypes(&self, op: Op) -> Vec<Dtype> {
        let default = match op {
            Op::AllReduce | Op::ReduceScatter => Dtype::F32,
            _ if op.is_moe() || op.is_layer() => Dtype::Bf16,
            _ if op.is_overlap() => Dtype::F16,
            _ => return vec![Dtype::F32],
        };
        if self.args.dtype.is_empty() {
            return vec![default];
        }
        let mut d: Vec<Dtype> = Vec::new();
        for &t in &self.args.dtype {
            if !d.contains(&t) {
                d.push(t);
            }
        }
        d
    }

    /// Every row of this run, in order; PE 0's are the ones printed.
    pub(super) fn all(&self) -> Res<Vec<Row>> {
        let mut rows = Vec::new();
        let moe_ops: Vec<Op> = MOE.into_iter().filter(|&op| self.selected(op)).collect();
        let layer_ops: Vec<Op> = LAYER.into_iter().filter(|&op| self.selected(op)).collect();
        if !moe_ops.is_empty() || !layer_ops.is_empty() {
            moe::check(self.args, self.ctx.n_pes())?;
        }
        if self.selected(Op::Put) || self.selected(Op::Get) {
            rows.extend(self.put_get()?);
        }
        if self.selected(Op::Barrier) {
            rows.extend(self.barrier()?);
        }
        for op in COLLECTIVES.into_iter().filter(|&op| self.selected(op)) {
            for dtype in self.dtypes(op) {
                rows.extend(match dtype {
                    Dtype::F32 => self.collective::<f32>(op)?,
                    Dtype::F16 => self.collective::<f16>(op)?,
                    Dtype::Bf16 => self.collective::<bf16>(op)?,
                });
            }
        }
        if !moe_ops.is_empty() {
            rows.extend(self.moe(&moe_ops)?);
        }
        if !layer_ops.is_empty() {
            rows.extend(self.moe_layer(&layer_ops)?);
        }
        let overlap_ops: Vec<Op> = overlap::OPS.into_iter().filter(|&op| self.selected(op)).collect();
        if !overlap_ops.is_empty() {
            rows.extend(self.overlap(&overlap_ops)?);
        }
        let nccl_ops: Vec<Op> = COLLECTIVES
            .into_iter()
            .filter(|&op| self.selected(op) && self.sizes.iter().any(|&b| self.runs(Imp::Nccl, op, b)))
            .chain(moe_ops.into_iter().filter(|&op| self.runs(Imp::Nccl, op, 0)))
            .collect();
        if !nccl_ops.is_empty() {
            // Last: a failure there leaves the rows above intact.
            match self.nccl(&nccl_ops) {
                Ok(nccl) => rows.extend(nccl),
                Err(e) => note(format_args!("NCCL rows skipped on PE {}: {e}", self.ctx.my_pe())),
            }
        }
        Ok(rows)
    }

    /// Records a row measured on this PE (PE 0's go to `--json`'s partial file).
    pub(super) fn keep(&self, rows: &mut Vec<Row>, row: Row) -> Res {
        if let Some(f) = self.partial.borrow_mut().as_mut() {
            writeln!(f, "{}", row.json(self.ctx.n_pes(), &self.backend, None))?;
        }
        rows.push(row);
        Ok(())
    }

    /// Overwrites the first `len` elements of this PE's `buf` with poison.
    pub(super) fn poison<T: Value>(&self, buf: &SymmetricBuffer<T>, len: usize) -> Res {
        if len > buf.len() {
            return Err(format!("poisoning {len} elements of a buffer of {}", buf.len()).into());
        }
        match self.s.cuda_stream() {
            Some(stream) => {
                // SAFETY: the first `len` elements (checked above) of this
                // PE's copy of a live buffer, ordered on the stream after
                // the operations that used it.
                let set = unsafe {
                    cudarc::driver::result::memset_d8_async(
                        buf.local_ptr() as u64,
                        0xFF,
                        len * size_of::<T>(),
                        stream.cu_stream(),
                    )
                };
                Ok(set?)
            }
            None => Ok(buf.slice(..len).copy_from_host(&vec![T::POISON; len], &self.s)?),
        }
    }
}
