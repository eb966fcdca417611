//! shmem's rows of the collectives and of the barrier.

use crate::bench::Bench;
use crate::data::{seed, Pattern, Shape, Value};
use crate::harness::Case;
use crate::ops::{Imp, Op, ROOT};
use crate::report::Row;
use crate::Res;
use clap::ValueEnum;
use shmem::{Collectives, ReduceOp, SymSlice};

impl Bench<'_> {
    /// One shmem collective on the bench's stream.
    fn enqueue<T: Value>(&self, op: Op, dst: SymSlice<'_, T>, src: SymSlice<'_, T>) -> Res {
        let s = &self.s;
        match op {
            Op::AllReduce => self.ctx.all_reduce(dst, src, ReduceOp::Sum, s)?,
            Op::AllGather => self.ctx.all_gather(dst, src, s)?,
            Op::ReduceScatter => self.ctx.reduce_scatter(dst, src, ReduceOp::Sum, s)?,
            Op::Broadcast => self.ctx.broadcast(dst, src, ROOT, s)?,
            Op::AllToAll => self.ctx.all_to_all(dst, src, s)?,
            _ => return Err(format!("{} is not a collective", op.name()).into()),
        }
        Ok(())
    }

    /// The largest source and destination counts of `op` in this run.
    pub(super) fn largest(&self, op: Op, elem: usize) -> Option<Shape> {
        self.sizes.iter().rev().find_map(|&b| Shape::of(op, b, elem, self.ctx.n_pes()))
    }

    /// `op`'s rows for shmem's implementations, out of place.
    pub(super) fn collective<T: Value>(&self, op: Op) -> Res<Vec<Row>> {
        let (me, n) = (self.ctx.my_pe(), self.ctx.n_pes());
        let mut rows = Vec::new();
        let Some(max) = self.largest(op, size_of::<T>()) else { return Ok(rows) };
        let src = self.ctx.alloc::<T>(max.src)?;
        let dst = self.ctx.alloc::<T>(max.dst)?;
        for &b in &self.sizes {
            let Some(shape) = Shape::of(op, b, size_of::<T>(), n) else { continue };
            let imps: Vec<Imp> = <Imp as ValueEnum>::value_variants()
                .iter()
                .copied()
                .filter(|&imp| imp.settings(self.args.tuning()).is_some() && self.runs(imp, op, shape.bytes))
                .collect();
            if imps.is_empty() {
                continue;
            }
            let pattern = Pattern::new::<T>(n, seed(op, T::NAME, shape.bytes))?;
            src.slice(..shape.src).copy_from_host(&pattern.input(me, shape.src), &self.s)?;
            let want = pattern.expected::<T>(op, shape, me);
            let run = || self.enqueue(op, dst.slice(..shape.dst), src.slice(..shape.src));
            let poison = || self.poison(&dst, shape.dst);
            let read = || Ok(dst.slice(..shape.dst).copy_to_host(&self.s)?);
            for imp in imps {
                // Every PE, between collectives (after the last agreement).
                self.ctx.set_collectives(imp.settings(self.args.tuning()).expect("filtered"));
                let case = Case {
                    op,
                    imp,
                    dtype: Some(T::NAME),
                    bytes: shape.bytes,
                    run: &run,
                    poison: &poison,
                    read: &read,
                    want: &want,
                    moe: None,
                    splits: None,
                    matmul: None,
                    layer: None,
                };
                let measured = self.measure(&case, &mut rows);
                self.ctx.set_collectives(Collectives::default());
                measured?;
            }
        }
        Ok(rows)
    }

    /// Back-to-back barriers on every PE: each lasts until the last PE arrives.
    pub(super) fn barrier(&self) -> Res<Vec<Row>> {
        let mut rows = Vec::new();
        if !self.runs(Imp::Shmem, Op::Barrier, 0) {
            return Ok(rows);
        }
        let case = Case::<f32> {
            op: Op::Barrier,
            imp: Imp::Shmem,
            dtype: None,
            bytes: 0,
            run: &|| Ok(self.ctx.barrier_all(&self.s)?),
            poison: &|| Ok(()),
            read: &|| Ok(Vec::new()),
            want: &[],
            moe: None,
            splits: None,
            matmul: None,
            layer: None,
        };
        self.measure(&case, &mut rows)?;
        Ok(rows)
    }
}
