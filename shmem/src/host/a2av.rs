//! The host backend's MoE all-to-all-v: its pure part, validating every
//! PE's splits (and offsets) and laying out what one PE receives
//! ([`plan_exchange`], which the fuzz targets in `fuzz/` call through
//! [`crate::fuzzing`]), and the exchange itself over a [`HostTeam`], which
//! reads the peers' splits, plans, and copies its chunks from the peers'
//! inputs.

use super::coll::Addr;
use super::team::HostTeam;
use crate::control::op::{invalid, mismatch, OpKind};
use crate::desc::AllToAllV;
use crate::dtype::Element;
use crate::error::Result;
use rayon::prelude::*;

/// Elements per rayon task when copying.
const PIECE: usize = 1 << 15;

/// One validated chunk of rows a PE receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Team index of the source.
    pub src: usize,
    /// First row in the source's input.
    pub from: u64,
    /// First row in this PE's output.
    pub to: u64,
    /// Rows, at least 1.
    pub rows: u64,
}

/// What one PE receives and what it writes into `out_splits_offsets`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The non-empty chunks, in output order.
    pub chunks: Vec<Chunk>,
    /// Row 0 of `out_splits_offsets`.
    pub out_splits: Vec<i64>,
    /// Row 1 of `out_splits_offsets`.
    pub out_offsets: Vec<i64>,
}

/// Validates the splits (and offsets) of every PE and returns PE `me`'s part
/// of the exchange.
///
/// `splits[s]` is PE `s`'s splits buffer as the operation reads it: `entries`
/// splits, followed for [`OpKind::AllToAllV2dOffset`] by `entries` offsets.
/// Every PE's input holds `in_rows` rows and its output `out_rows`.
///
/// The caller has checked the shapes (as `Team::shape` does): `kind` is one
/// of the three all-to-all-v operations, `me < splits.len()`, `entries` is
/// `splits.len()` for the 1D operation and a non-zero multiple of it
/// otherwise, each `splits[s]` holds `entries` (offset variant: `2 ×
/// entries`) values, `major_align ≥ 1` for the 2D dispatch, and `in_rows`
/// and `out_rows` are at most `i64::MAX` (they count rows of a heap region,
/// and no allocation passes `isize::MAX` bytes).
///
/// Checks run in a fixed order — sources in PE order, each source's entries
/// in order (split, offset, order of offsets, end within the input), then
/// destinations in PE order — so every PE that sees the same splits reaches
/// the same verdict and message.
pub(crate) fn plan_exchange(
    kind: OpKind,
    me: usize,
    splits: &[Vec<i64>],
    entries: usize,
    in_rows: u64,
    out_rows: u64,
    major_align: usize,
) -> Result<Plan> {
    let (n, m) = (splits.len(), entries);
    let ne = m / n;
    debug_assert!(me < n && m > 0 && m % n == 0 && in_rows <= i64::MAX as u64 && out_rows <= i64::MAX as u64);
    // Each source's chunks as (first row, rows), in its splits' order.
    let mut sources: Vec<Vec<(u64, u64)>> = Vec::with_capacity(n);
    for (s, raw) in splits.iter().enumerate() {
        let (splits, offsets) = raw.split_at(m);
        let mut chunks = Vec::with_capacity(m);
        let mut end = 0u64;
        for i in 0..m {
            let rows = u64::try_from(splits[i])
                .map_err(|_| invalid(kind, format!("PE {s}'s split {i} is negative ({})", splits[i])))?;
            let from = if kind == OpKind::AllToAllV2dOffset {
                let at = u64::try_from(offsets[i])
                    .map_err(|_| invalid(kind, format!("PE {s}'s offset {i} is negative ({})", offsets[i])))?;
                if at < end {
                    return Err(invalid(
                        kind,
                        format!(
                            "PE {s}'s offset {i} ({at}) starts before the end of its chunk {} (row {end}): \
                             offsets must be ascending and chunks must not overlap",
                            i - 1
                        ),
                    ));
                }
                at
            } else {
                end
            };
            end = from.checked_add(rows).filter(|&e| e <= in_rows).ok_or_else(|| {
                mismatch(
                    kind,
                    format!("PE {s}'s chunk {i} ({rows} rows from row {from}) runs past its input of {in_rows} rows"),
                )
            })?;
            chunks.push((from, rows));
        }
        sources.push(chunks);
    }
    let mut mine = None;
    for d in 0..n {
        // (source, index in the source's splits) of each output entry, in
        // output order; entries come in groups of `group` (2d: one expert
        // each) that are padded to `major_align`.
        let (entries, group): (Vec<(usize, usize)>, usize) = match kind {
            OpKind::AllToAllV => ((0..n).map(|s| (s, d)).collect(), n),
            OpKind::AllToAllV2d => ((0..ne).flat_map(|e| (0..n).map(move |s| (s, d * ne + e))).collect(), n),
            _ => ((0..n).flat_map(|s| (0..ne).map(move |e| (s, e * n + d))).collect(), ne),
        };
        let mut at = 0u64;
        let mut out_offsets = Vec::with_capacity(m);
        let mut chunks = Vec::new();
        for block in entries.chunks(group) {
            let start = at;
            for &(s, i) in block {
                let (from, rows) = sources[s][i];
                out_offsets.push(at);
                chunks.push(Chunk { src: s, from, to: at, rows });
                at = at.saturating_add(rows);
            }
            if kind == OpKind::AllToAllV2d {
                let align = major_align as u64;
                let len = (at - start).div_ceil(align).saturating_mul(align).max(align);
                at = start.saturating_add(len);
            }
        }
        if at > out_rows {
            let padding = if kind == OpKind::AllToAllV2d { " (with major_align padding)" } else { "" };
            return Err(mismatch(
                kind,
                format!("PE {d} would receive {at} rows{padding}, but its output holds {out_rows} rows"),
            ));
        }
        if d == me {
            let out_splits = entries.iter().map(|&(s, i)| sources[s][i].1 as i64).collect();
            let out_offsets = out_offsets.into_iter().map(|o| o as i64).collect();
            chunks.retain(|ch| ch.rows > 0);
            mine = Some(Plan { chunks, out_splits, out_offsets });
        }
    }
    Ok(mine.expect("this PE is one of the destinations"))
}

/// Cases the `moe_plan` fuzz target checks against its reference, kept here
/// so that CI runs them: the module docs' pictures and the edges.
impl HostTeam<'_> {
    /// The exchange of a call the team agreed on: every PE validates every
    /// PE's splits (the same data in the same order, so the same verdict
    /// everywhere, before anything is written), then pulls its chunks.
    pub(crate) fn all_to_all_v<T: Element>(&self, c: &AllToAllV) -> Result<()> {
        let plan = self.plan(c)?;
        self.execute::<T>(c, &plan);
        self.raw_barrier()
    }

    /// `member`'s `len` i64s at heap offset `offset`.
    fn peer_i64s(&self, member: usize, offset: usize, len: usize) -> Vec<i64> {
        let from = self.pe_ptr::<u8>(member, offset).cast::<i64>();
        self.count_read::<i64>(member, len);
        let mut v = vec![0i64; len];
        // SAFETY: a checked region of i64s (aligned: allocations are
        // 256-aligned, slices start at element boundaries) in `member`'s
        // heap, which its owner passed as input and nobody writes until the
        // closing barrier; the exchange's SeqCst barrier made it visible.
        unsafe { std::ptr::copy_nonoverlapping(from.cast_const(), v.as_mut_ptr(), len) };
        v
    }

    /// Reads every PE's splits (and offsets), validates them all and returns
    /// this PE's part (see [`plan::plan_exchange`]).
    fn plan(&self, c: &AllToAllV) -> Result<Plan> {
        let n = self.n_pes();
        let splits: Vec<Vec<i64>> = (0..n).map(|s| self.peer_i64s(s, c.splits.offset, c.splits.len)).collect();
        let (in_rows, out_rows) = (c.rows(c.input), c.rows(c.output));
        plan_exchange(c.kind, self.my_pe(), &splits, c.entries, in_rows, out_rows, c.major_align)
    }

    /// Pulls this PE's chunks from the peers' inputs and writes its
    /// `out_splits_offsets`.
    fn execute<T: Element>(&self, c: &AllToAllV, plan: &Plan) {
        let (elem, row) = (size_of::<T>(), c.row_len);
        let me = self.my_pe();
        let out: *mut u8 = self.pe_ptr(me, c.output.offset);
        // (source address, destination address, elements) in pieces of at most PIECE.
        let mut pieces = Vec::new();
        for ch in &plan.chunks {
            let input: *mut u8 = self.pe_ptr(ch.src, c.input.offset);
            let from = input.wrapping_add(ch.from as usize * row * elem);
            let to = out.wrapping_add(ch.to as usize * row * elem);
            let len = ch.rows as usize * row;
            self.count_read::<T>(ch.src, len);
            for k in (0..len).step_by(PIECE) {
                let piece = (from.wrapping_add(k * elem), to.wrapping_add(k * elem));
                pieces.push((Addr::of(piece.0), Addr::of(piece.1), PIECE.min(len - k)));
            }
        }
        let copy = |&(from, to, len): &(Addr, Addr, usize)| {
            // SAFETY: `plan` checked that each chunk lies inside the source's
            // input and this PE's output (same regions on every PE); the
            // output's chunks are disjoint and it overlaps no input (checked by
            // `shape`); nobody writes an input until the closing barrier.
            unsafe { std::ptr::copy_nonoverlapping(from.ptr::<T>().cast_const(), to.ptr::<T>(), len) };
        };
        if pieces.len() <= 1 {
            pieces.iter().for_each(copy);
        } else {
            self.pool.install(|| pieces.par_iter().for_each(copy));
        }
        let so = self.pe_ptr::<u8>(me, c.out_splits_offsets.offset).cast::<i64>();
        // SAFETY: this PE's out_splits_offsets holds 2 × entries i64s
        // (checked by `shape`), overlaps nothing read here, and no peer
        // reads it during the operation.
        unsafe {
            std::ptr::copy_nonoverlapping(plan.out_splits.as_ptr(), so, c.entries);
            std::ptr::copy_nonoverlapping(plan.out_offsets.as_ptr(), so.add(c.entries), c.entries);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn plan(kind: OpKind, me: usize, splits: &[Vec<i64>], entries: usize, rows: (u64, u64), align: usize) -> Plan {
        plan_exchange(kind, me, splits, entries, rows.0, rows.1, align).unwrap()
    }

    fn fails(kind: OpKind, splits: &[Vec<i64>], entries: usize, rows: (u64, u64), align: usize) -> Error {
        plan_exchange(kind, 0, splits, entries, rows.0, rows.1, align).unwrap_err()
    }

    #[test]
    fn one_d_as_the_module_docs_draw_it() {
        let splits = [vec![2, 1, 0], vec![1, 0, 3], vec![0, 2, 1]];
        let p = plan(OpKind::AllToAllV, 2, &splits, 3, (4, 4), 0);
        assert_eq!((p.out_splits, p.out_offsets), (vec![0, 3, 1], vec![0, 0, 3]));
        let chunk = |src, from, to, rows| Chunk { src, from, to, rows };
        assert_eq!(p.chunks, [chunk(1, 1, 0, 3), chunk(2, 2, 3, 1)]);
    }

    #[test]
    fn two_d_pads_every_expert_block_even_an_empty_one() {
        // 2 PEs × 2 experts; PE 1's expert 1 receives nothing but still
        // takes major_align rows.
        let splits = [vec![1, 1, 1, 0], vec![1, 1, 1, 0]];
        let p = plan(OpKind::AllToAllV2d, 1, &splits, 4, (4, 8), 4);
        assert_eq!((p.out_splits, p.out_offsets), (vec![1, 1, 0, 0], vec![0, 1, 4, 4]));
        let e = fails(OpKind::AllToAllV2d, &splits, 4, (4, 7), 4);
        assert!(matches!(e, Error::LengthMismatch(_)));
        assert_eq!(
            e.to_string().split(": ").last(),
            Some("PE 0 would receive 8 rows (with major_align padding), but its output holds 7 rows")
        );
    }

    #[test]
    fn extreme_splits_and_offsets_fail_without_overflowing() {
        let off = OpKind::AllToAllV2dOffset;
        let e = fails(off, &[vec![i64::MIN, 0]], 1, (10, 10), 0);
        assert!(e.to_string().contains("PE 0's split 0 is negative (-9223372036854775808)"), "{e}");
        let e = fails(off, &[vec![0, i64::MIN]], 1, (10, 10), 0);
        assert!(e.to_string().contains("PE 0's offset 0 is negative"), "{e}");
        let e = fails(off, &[vec![i64::MAX, i64::MAX]], 1, (i64::MAX as u64, 10), 0);
        assert!(
            e.to_string().contains("PE 0's chunk 0 (9223372036854775807 rows from row 9223372036854775807)"),
            "{e}"
        );
        let e = fails(off, &[vec![2, 1, 0, 1]], 2, (10, 10), 0);
        assert!(e.to_string().contains("PE 0's offset 1 (1) starts before the end of its chunk 0 (row 2)"), "{e}");
    }

    #[test]
    fn a_receiver_total_beyond_u64_saturates_into_an_error() {
        // 8 PEs each send i64::MAX rows to PE 0: 8 × (2^63 - 1) rows does
        // not fit a u64; the count saturates and the exchange fails.
        let max = i64::MAX as u64;
        let splits: Vec<Vec<i64>> =
            (0..8).map(|_| (0..8).map(|d| if d == 0 { i64::MAX } else { 0 }).collect()).collect();
        let e = fails(OpKind::AllToAllV, &splits, 8, (max, max), 0);
        assert!(e.to_string().contains("PE 0 would receive 18446744073709551615 rows"), "{e}");
    }
}
