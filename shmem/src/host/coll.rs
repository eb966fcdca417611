//! The host backend's collectives.
//!
//! The algorithms are the device kernels' (one-shot and two-shot
//! all-reduce, direct all-gather and all-to-all), run by each PE over the
//! peers' mapped heaps and parallelised with rayon. Reductions combine the
//! PEs' values in team order, so every PE gets bit-identical results.
//! Across nodes they take the node-aware forms where they apply
//! ([`crate::AcrossNodes`], [`super::nodes`]). The calls come here after
//! the public layer checked them and the team agreed on them.

use super::team::{HostTeam, Rails};
use crate::algo;
use crate::dtype::{Element, ReduceOp};
use crate::error::Result;
use crate::heap::{overlap, Region};
use rayon::prelude::*;

/// Elements per rayon task.
pub(crate) const CHUNK: usize = 1 << 15;

/// An address that may cross into rayon tasks.
#[derive(Clone, Copy)]
pub(crate) struct Addr(usize);

impl Addr {
    pub(crate) fn of<T>(p: *const T) -> Addr {
        Addr(p as usize)
    }
    pub(crate) fn ptr<T>(self) -> *mut T {
        self.0 as *mut T
    }
}

impl HostTeam<'_> {
    /// Copies `root`'s `s` into every PE's `d`.
    pub(crate) fn broadcast<T: Element>(&self, d: Region, s: Region, root: usize) -> Result<()> {
        if let Some(r) = Rails::of(self) {
            return self.broadcast_nodes::<T>(r, d, s, root);
        }
        if d != s || self.my_pe() != root {
            self.count_read::<T>(root, d.len);
            let from: *const T = self.pe_ptr(root, s.offset);
            let to: *mut T = self.pe_ptr(self.my_pe(), d.offset);
            // SAFETY: checked regions; root's src is stable until the closing
            // barrier; `copy` tolerates the root's own overlapping src/dst.
            unsafe { std::ptr::copy(from, to, d.len) };
        }
        self.raw_barrier()
    }

    /// Gathers every PE's `s` into `d` (PE order); `s` may be this PE's
    /// own block of `d`.
    pub(crate) fn all_gather<T: Element>(&self, d: Region, s: Region) -> Result<()> {
        if let Some(r) = Rails::of(self) {
            return self.all_gather_nodes::<T>(r, d, s);
        }
        let (n, me, elem) = (self.n_pes(), self.my_pe(), size_of::<T>());
        let in_place = s == Region { offset: d.offset + me * s.len * elem, len: s.len };
        let dst_addr = Addr::of(self.pe_ptr::<T>(me, d.offset));
        let blocks: Vec<usize> = (0..n).filter(|&j| !(in_place && j == me)).collect();
        self.pool.install(|| {
            blocks.par_iter().for_each(|&j| {
                // In place, member j's src is its own block j of dst.
                let src_offset = if in_place { d.offset + j * s.len * elem } else { s.offset };
                self.count_read::<T>(j, s.len);
                let from: *const T = self.pe_ptr(j, src_offset);
                // SAFETY: block j of this PE's dst and member j's src are
                // checked regions; nobody writes either until the closing barrier.
                unsafe { std::ptr::copy_nonoverlapping(from, dst_addr.ptr::<T>().add(j * s.len), s.len) };
            })
        });
        self.raw_barrier()
    }

    /// Reduces every PE's `s` element-wise into every PE's `d` (the same
    /// region where in place).
    pub(crate) fn all_reduce<T: Element>(&self, d: Region, s: Region, op: ReduceOp) -> Result<()> {
        if let Some(r) = Rails::of(self) {
            return self.all_reduce_nodes::<T>(r, d, s, op);
        }
        let elem = size_of::<T>();
        let in_place = d == s;
        let n = self.n_pes();
        if algo::host_all_reduce_one_shot(d.len * elem, d.len, n) {
            // One-shot: every PE reduces the whole vector.
            if in_place {
                let mut tmp = vec_for::<T>(d.len);
                self.reduce_into::<T>(tmp.as_mut_ptr(), s.offset, 0, d.len, op);
                self.raw_barrier()?; // everyone has read every src
                self.write_local(d.offset, &tmp);
            } else {
                self.reduce_into::<T>(self.pe_ptr(self.my_pe(), d.offset), s.offset, 0, d.len, op);
            }
            return self.raw_barrier();
        }
        // Two-shot: PE i reduces block i, then every PE gathers the blocks.
        let block = |i: usize| (i * d.len / n, (i + 1) * d.len / n);
        let (lo, hi) = block(self.my_pe());
        if in_place {
            let mut tmp = vec_for::<T>(hi - lo);
            self.reduce_into::<T>(tmp.as_mut_ptr(), s.offset, lo, hi - lo, op);
            self.raw_barrier()?; // everyone has read block i of every src
            self.write_local(d.offset + lo * elem, &tmp);
        } else {
            self.reduce_into::<T>(self.pe_ptr::<T>(self.my_pe(), d.offset + lo * elem), s.offset, lo, hi - lo, op);
        }
        self.raw_barrier()?; // every block is reduced
        let dst_addr = Addr::of(self.pe_ptr::<T>(self.my_pe(), d.offset));
        let others: Vec<usize> = (0..n).filter(|&j| j != self.my_pe()).collect();
        self.pool.install(|| {
            others.par_iter().for_each(|&j| {
                let (lo, hi) = block(j);
                self.count_read::<T>(j, hi - lo);
                let from: *const T = self.pe_ptr(j, d.offset + lo * elem);
                // SAFETY: block j of member j's dst is final until the closing
                // barrier; block j of this PE's dst is written only here.
                unsafe { std::ptr::copy_nonoverlapping(from, dst_addr.ptr::<T>().add(lo), hi - lo) };
            })
        });
        self.raw_barrier()
    }

    /// Reduces every PE's `s` (`n_pes` blocks of `d.len`) and leaves block
    /// `i` of the result in PE `i`'s `d`, which may be its block of `s`.
    pub(crate) fn reduce_scatter<T: Element>(&self, d: Region, s: Region, op: ReduceOp) -> Result<()> {
        if let Some(r) = Rails::of(self) {
            return self.reduce_scatter_nodes::<T>(r, d, s, op);
        }
        let lo = self.my_pe() * d.len;
        if overlap(d, s, size_of::<T>()) {
            let mut tmp = vec_for::<T>(d.len);
            self.reduce_into::<T>(tmp.as_mut_ptr(), s.offset, lo, d.len, op);
            self.raw_barrier()?;
            self.write_local(d.offset, &tmp);
        } else {
            self.reduce_into::<T>(self.pe_ptr(self.my_pe(), d.offset), s.offset, lo, d.len, op);
        }
        self.raw_barrier()
    }

    /// Block `j` of this PE's `s` into block `i` (this PE's index) of PE
    /// `j`'s `d`; `d` may be `s`.
    pub(crate) fn all_to_all<T: Element>(&self, d: Region, s: Region) -> Result<()> {
        if let Some(r) = Rails::of(self) {
            return self.all_to_all_nodes::<T>(r, d, s);
        }
        let (n, me, elem) = (self.n_pes(), self.my_pe(), size_of::<T>());
        let c = d.len / n;
        let in_place = overlap(d, s, elem);
        let mut tmp = if in_place { vec_for::<T>(d.len) } else { Vec::new() };
        let out = Addr::of(if in_place { tmp.as_mut_ptr() } else { self.pe_ptr::<T>(me, d.offset) });
        self.pool.install(|| {
            (0..n).into_par_iter().for_each(|j| {
                self.count_read::<T>(j, c);
                let from: *const T = self.pe_ptr(j, s.offset + me * c * elem);
                // SAFETY: block `me` of member j's src and block j of this
                // PE's output are checked, disjoint, and stable until the barrier.
                unsafe { std::ptr::copy_nonoverlapping(from, out.ptr::<T>().add(j * c), c) };
            })
        });
        if in_place {
            self.raw_barrier()?;
            self.write_local(d.offset, &tmp);
        }
        self.raw_barrier()
    }

    /// `out[i] = op over members m of src_m[lo + i]`, for `i < len`, in team order.
    fn reduce_into<T: Element>(&self, out: *mut T, src_offset: usize, lo: usize, len: usize, op: ReduceOp) {
        let elem = size_of::<T>();
        let inputs: Vec<Addr> = (0..self.n_pes())
            .map(|m| {
                self.count_read::<T>(m, len);
                Addr::of(self.pe_ptr::<T>(m, src_offset + lo * elem))
            })
            .collect();
        let out = Addr::of(out);
        let tasks = len.div_ceil(CHUNK);
        let body = |t: usize| {
            let start = t * CHUNK;
            let n = CHUNK.min(len - start);
            // SAFETY: every input holds `len` elements of a checked source
            // region that no PE writes before the next barrier; `out` holds
            // `len` elements of which only this task writes `start..start+n`.
            let (ins, out) = unsafe {
                let ins: Vec<&[T]> = inputs
                    .iter()
                    .map(|a| std::slice::from_raw_parts(a.ptr::<T>().add(start).cast_const(), n))
                    .collect();
                (ins, std::slice::from_raw_parts_mut(out.ptr::<T>().add(start), n))
            };
            reduce_chunk(op, out, &ins);
        };
        if tasks <= 1 {
            (0..tasks).for_each(body);
        } else {
            self.pool.install(|| (0..tasks).into_par_iter().for_each(body));
        }
    }
}

/// `out = ins[0] op ins[1] op …`, element-wise, accumulating in `T::Acc`
/// and rounding once.
fn reduce_chunk<T: Element>(op: ReduceOp, out: &mut [T], ins: &[&[T]]) {
    let mut acc: Vec<T::Acc> = ins[0].iter().map(|x| x.to_acc()).collect();
    fold_acc(op, &mut acc, &ins[1..]);
    for (o, a) in out.iter_mut().zip(acc) {
        *o = T::from_acc(a);
    }
}

/// `acc = acc op ins[0] op ins[1] op …`, element-wise, in `T::Acc`: the
/// left fold every reduction takes, from a running value. The operator is
/// chosen once, outside the loops, so each loop is a straight vectorisable
/// pass.
pub(crate) fn fold_acc<T: Element>(op: ReduceOp, acc: &mut [T::Acc], ins: &[&[T]]) {
    fn fold<T: Element>(acc: &mut [T::Acc], ins: &[&[T]], f: impl Fn(T::Acc, T::Acc) -> T::Acc) {
        for input in ins {
            for (a, x) in acc.iter_mut().zip(input.iter()) {
                *a = f(*a, x.to_acc());
            }
        }
    }
    match op {
        ReduceOp::Sum => fold(acc, ins, |a, b| T::combine(ReduceOp::Sum, a, b)),
        ReduceOp::Min => fold(acc, ins, |a, b| T::combine(ReduceOp::Min, a, b)),
        ReduceOp::Max => fold(acc, ins, |a, b| T::combine(ReduceOp::Max, a, b)),
        ReduceOp::Prod => fold(acc, ins, |a, b| T::combine(ReduceOp::Prod, a, b)),
        ReduceOp::And => fold(acc, ins, |a, b| T::combine(ReduceOp::And, a, b)),
        ReduceOp::Or => fold(acc, ins, |a, b| T::combine(ReduceOp::Or, a, b)),
        ReduceOp::Xor => fold(acc, ins, |a, b| T::combine(ReduceOp::Xor, a, b)),
    }
}

fn vec_for<T: Element>(len: usize) -> Vec<T> {
    crate::dtype::zeroed_vec(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_overlap_only_when_they_share_a_byte() {
        let r = |offset, len| Region { offset, len };
        assert!(overlap(r(0, 4), r(12, 4), 4));
        assert!(!overlap(r(0, 4), r(16, 4), 4));
        assert!(!overlap(r(16, 4), r(0, 4), 4));
        assert!(!overlap(r(0, 0), r(0, 4), 4), "an empty region overlaps nothing");
        assert!(overlap(r(8, 1), r(0, 4), 4));
    }

    #[test]
    fn reduce_chunk_folds_every_input_in_order() {
        let a = [1i64, -2, 3, i64::MAX];
        let b = [10i64, 20, -30, 1];
        let c = [100i64, 200, 300, 0];
        let mut out = [0i64; 4];
        reduce_chunk(ReduceOp::Sum, &mut out, &[&a, &b, &c]);
        assert_eq!(out, [111, 218, 273, i64::MIN]);
        reduce_chunk(ReduceOp::Max, &mut out, &[&a, &b, &c]);
        assert_eq!(out, [100, 200, 300, i64::MAX]);
        let h: Vec<half::f16> = [0.5f32, 1.5, -4.0].iter().map(|&x| half::f16::from_f32(x)).collect();
        let mut hout = [half::f16::ZERO; 3];
        reduce_chunk(ReduceOp::Prod, &mut hout, &[&h, &h]);
        assert_eq!(hout.map(|x| x.to_f32()), [0.25, 2.25, 16.0]);
    }
}
