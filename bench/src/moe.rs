//! shmem-bench's MoE rows: `dispatch` ([`Context::all_to_all_v_2d`]),
//! `combine` ([`Context::all_to_all_v_2d_offset`], the dispatch's reverse)
//! and `all_to_all_v` ([`Context::all_to_all_v`]), and NCCL's grouped
//! sends and receives of the same rows per peer. The bench's doc says what
//! the rows measure.
//!
//! **Routing**: each of a PE's tokens goes to `topk` distinct experts of
//! the `n_pes × experts_per_pe`, drawn uniformly from a fixed seed of (PE,
//! token): every PE computes every PE's splits, so it knows what each
//! receives, and a token count's routes are the first ones of a larger
//! count. The dispatch's input is the `tokens × topk` rows already sorted
//! by expert, as PyTorch's `all_to_all_vdev_2d` takes them.
//!
//! [`Context::all_to_all_v_2d`]: shmem::Context::all_to_all_v_2d
//! [`Context::all_to_all_v_2d_offset`]: shmem::Context::all_to_all_v_2d_offset
//! [`Context::all_to_all_v`]: shmem::Context::all_to_all_v

use crate::args::{Args, Dtype};
use crate::bench::Bench;
use crate::data::{mix, seed, Pattern, Value};
use crate::harness::Case;
use crate::nccl::{DeviceBuf, Nccl};
use crate::ops::{Imp, Op};
use crate::report::{note, Row};
use crate::Res;
use shmem::algo::moe_lines_fit;
use shmem::{bf16, f16, Collectives, SymmetricBuffer};

/// The MoE rows' parameters (from the command line; in their JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MoeShape {
    pub(super) tokens: usize,
    pub(super) hidden: usize,
    pub(super) experts_per_pe: usize,
    pub(super) topk: usize,
    pub(super) major_align: usize,
}

impl MoeShape {
    pub(super) fn new(args: &Args, tokens: u64) -> MoeShape {
        MoeShape {
            tokens: tokens as usize,
            hidden: args.hidden as usize,
            experts_per_pe: args.experts_per_pe as usize,
            topk: args.topk as usize,
            major_align: args.major_align as usize,
        }
    }

    /// Rows each PE sends in the dispatch: one per token and expert.
    fn rows(&self) -> usize {
        self.tokens * self.topk
    }

    /// The rows' `bytes`: what each PE sends in the dispatch.
    pub(super) fn bytes(&self, elem: usize) -> usize {
        self.rows() * self.hidden * elem
    }
}

/// The routes' seed, mixed with PE and token.
const ROUTE_SEED: u64 = 0x6d6f_655f_726f_7574;

/// A run of rows in an output: `rows` rows of PE `src`'s dispatch input
/// from row `from` lie at row `to`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    pub(super) src: usize,
    pub(super) from: usize,
    pub(super) to: usize,
    pub(super) rows: usize,
}

/// Every PE's routing at one token count.
pub(super) struct Routing {
    pub(super) shape: MoeShape,
    pub(super) n: usize,
    /// `counts[p][g]`: rows PE `p` sends to global expert `g`, which is
    /// expert `g % experts_per_pe` of PE `g / experts_per_pe` (the
    /// dispatch's rank-major order).
    counts: Vec<Vec<usize>>,
    /// `picks[p][t × topk + j]`: the global expert of PE `p`'s token `t`
    /// in slot `j`, in the order drawn (the MoE layer's expert ids).
    pub(super) picks: Vec<Vec<usize>>,
}

/// Whether the MoE rows can be made over `n` PEs: a token's experts
/// are distinct.
pub(super) fn check(args: &Args, n: usize) -> Res {
    let experts = n * args.experts_per_pe as usize;
    match args.topk as usize <= experts {
        true => Ok(()),
        false => Err(format!(
            "--topk {} is more than the {experts} experts ({n} PEs × --experts-per-pe {})",
            args.topk, args.experts_per_pe
        )
        .into()),
    }
}

impl Routing {
    fn new(args: &Args, tokens: u64, n: usize) -> Res<Routing> {
        check(args, n)?;
        let shape = MoeShape::new(args, tokens);
        let experts = n * shape.experts_per_pe;
        let mut counts = vec![vec![0; experts]; n];
        let mut picks = vec![Vec::with_capacity(shape.tokens * shape.topk); n];
        let mut picked = Vec::with_capacity(shape.topk);
        for (p, (counts, picks)) in counts.iter_mut().zip(&mut picks).enumerate() {
            for t in 0..shape.tokens {
                let key = mix(mix(ROUTE_SEED ^ p as u64) ^ t as u64);
                picked.clear();
                let mut draw = 0;
                while picked.len() < shape.topk {
                    let g = (mix(key ^ draw) % experts as u64) as usize;
                    draw += 1;
                    if !picked.contains(&g) {
                        picked.push(g);
                        counts[g] += 1;
                    }
                }
                picks.extend_from_slice(&picked);
            }
        }
        Ok(Routing { shape, n, counts, picks })
    }

    /// First row of PE `p`'s dispatch input that goes to global expert `g`.
    fn start(&self, p: usize, g: usize) -> usize {
        self.counts[p][..g].iter().sum()
    }

    /// Rows PE `p` sends PE `q` (to all of its experts).
    fn to_pe(&self, p: usize, q: usize) -> usize {
        let ne = self.shape.experts_per_pe;
        self.counts[p][q * ne..(q + 1) * ne].iter().sum()
    }

    /// PE `me`'s output after `op`, in the order of its out_splits_offsets,
    /// and its rows with padding.
    fn chunks(&self, op: Op, me: usize) -> (Vec<Chunk>, usize) {
        let (n, ne) = (self.n, self.shape.experts_per_pe);
        let mut chunks = Vec::new();
        let mut at = 0;
        match op {
            // Expert-major, each expert's block padded to major_align rows.
            Op::Dispatch => {
                for e in 0..ne {
                    let block = at;
                    for src in 0..n {
                        let g = me * ne + e;
                        let rows = self.counts[src][g];
                        chunks.push(Chunk { src, from: self.start(src, g), to: at, rows });
                        at += rows;
                    }
                    let align = self.shape.major_align;
                    at = block + (at - block).div_ceil(align).max(1) * align;
                }
            }
            // Every row back where this PE's dispatch took it from.
            Op::Combine => {
                for g in 0..n * ne {
                    let (from, rows) = (self.start(me, g), self.counts[me][g]);
                    chunks.push(Chunk { src: me, from, to: from, rows });
                    at = from + rows;
                }
            }
            // Packed in source order.
            _ => {
                for src in 0..n {
                    let rows = self.to_pe(src, me);
                    chunks.push(Chunk { src, from: self.start(src, me * ne), to: at, rows });
                    at += rows;
                }
            }
        }
        (chunks, at)
    }

    /// The rows of `op`'s output: the most any PE receives, so that every
    /// PE passes the same slice.
    fn out_rows(&self, op: Op) -> usize {
        (0..self.n).map(|p| self.chunks(op, p).1).max().unwrap_or(0)
    }
}

/// The routings of the token counts.
pub(super) fn routings(args: &Args, n: usize) -> Res<Vec<Routing>> {
    args.tokens.iter().map(|&t| Routing::new(args, t, n)).collect()
}

/// The largest dispatch input and output, in rows, over `routings`.
fn most_rows(routings: &[Routing]) -> (usize, usize) {
    let most = |f: &dyn Fn(&Routing) -> usize| routings.iter().map(f).max().unwrap_or(0);
    (most(&|r| r.shape.rows()), most(&|r| r.out_rows(Op::Dispatch).max(r.out_rows(Op::AllToAllV))))
}

/// The symmetric heap the MoE rows take over `n` PEs: at the largest
/// token count, in the widest dtype, the dispatch's input and the
/// combine's output (`tokens × topk` rows each) and the dispatch's output
/// (the most any PE receives, with padding; the routing is known before
/// `init`). The splits fit in the bench's slack. 0 where there is no
/// routing (`--topk` too large: the MoE rows fail later, saying so).
pub(super) fn heap_bytes(args: &Args, n: usize) -> usize {
    let elem = if args.dtype.contains(&Dtype::F32) { size_of::<f32>() } else { size_of::<bf16>() };
    let Ok(routings) = routings(args, n) else { return 0 };
    let (rows, out) = most_rows(&routings);
    (2 * rows + out) * args.hidden as usize * elem
}

/// `out_splits_offsets` of an output of `chunks`: splits, then offsets.
pub(super) fn splits_offsets(chunks: &[Chunk]) -> Vec<i64> {
    chunks.iter().map(|c| c.rows as i64).chain(chunks.iter().map(|c| c.to as i64)).collect()
}

impl Pattern {
    /// A pattern for data that is moved, never summed: `r` takes as many
    /// values (up to 2^16) as stay exact in `T`.
    pub(super) fn moved<T: Value>(n: usize, seed: u64) -> Res<Pattern> {
        if n >= T::EXACT {
            return Err(format!("{n} PEs cannot be told apart in {}: use f32", T::NAME).into());
        }
        let m = ((T::EXACT - n) / n + 1).min(1 << 16);
        Ok(Pattern { n, m: m as u64, seed: mix(seed) })
    }

    /// `rows` rows of `hidden` elements of PE `pe`'s input, from row `from`.
    pub(super) fn rows<T: Value>(
        &self,
        pe: usize,
        from: usize,
        rows: usize,
        hidden: usize,
    ) -> impl Iterator<Item = T> + '_ {
        (from * hidden..(from + rows) * hidden).map(move |i| self.value(pe, i))
    }

    /// The data rows of `chunks`, in order.
    pub(super) fn chunks<T: Value>(&self, chunks: &[Chunk], hidden: usize) -> Vec<T> {
        chunks.iter().flat_map(|c| self.rows(c.src, c.from, c.rows, hidden)).collect()
    }
}

/// The data rows of `chunks` in `out`, in order (padding left out).
pub(super) fn gather<T: Value>(out: &[T], chunks: &[Chunk], hidden: usize) -> Res<Vec<T>> {
    let mut rows = Vec::with_capacity(chunks.iter().map(|c| c.rows * hidden).sum());
    for c in chunks {
        rows.extend_from_slice(out.get(c.to * hidden..(c.to + c.rows) * hidden).ok_or("output too short")?);
    }
    Ok(rows)
}

/// The MoE rows' symmetric buffers, at their largest.
struct Buffers<T: Value> {
    /// The dispatch's and all_to_all_v's input; what the combine brings back.
    tokens: SymmetricBuffer<T>,
    /// The dispatch's and all_to_all_v's output; the combine's input.
    experts: SymmetricBuffer<T>,
    /// The combine's output.
    back: SymmetricBuffer<T>,
    /// The dispatch's in_splits: `n_pes × experts_per_pe`.
    splits_2d: SymmetricBuffer<i64>,
    /// all_to_all_v's in_splits: `n_pes`.
    splits_1d: SymmetricBuffer<i64>,
    /// The dispatch's out_splits_offsets, the combine's in_splits_offsets.
    so_2d: SymmetricBuffer<i64>,
    /// The combine's out_splits_offsets.
    so_back: SymmetricBuffer<i64>,
    /// all_to_all_v's out_splits_offsets.
    so_1d: SymmetricBuffer<i64>,
}

/// shmem's MoE rows, in order: the default form, the line kernel, the
/// two-kernel form and forced RMA.
const FORMS: [Imp; 4] = [Imp::Shmem, Imp::ShmemLines, Imp::Shmem2k, Imp::ShmemRma];

impl Bench<'_> {
    /// shmem's rows of the MoE `ops`, in every dtype.
    pub(super) fn moe(&self, ops: &[Op]) -> Res<Vec<Row>> {
        let mut rows = Vec::new();
        if !FORMS.iter().any(|&imp| ops.iter().any(|&op| self.runs(imp, op, 0))) {
            return Ok(rows);
        }
        for dtype in self.dtypes(Op::Dispatch) {
            rows.extend(match dtype {
                Dtype::F32 => self.moe_typed::<f32>(ops)?,
                Dtype::F16 => self.moe_typed::<f16>(ops)?,
                Dtype::Bf16 => self.moe_typed::<bf16>(ops)?,
            });
        }
        Ok(rows)
    }

    /// The MoE buffers for `routings`, each at its largest.
    ///
    /// # Collective
    fn moe_buffers<T: Value>(&self, routings: &[Routing]) -> Res<Buffers<T>> {
        let (rows, out) = most_rows(routings);
        let (hidden, entries) = (self.args.hidden as usize, self.ctx.n_pes() * self.args.experts_per_pe as usize);
        let ctx = self.ctx;
        Ok(Buffers {
            tokens: ctx.alloc(rows * hidden)?,
            experts: ctx.alloc(out * hidden)?,
            back: ctx.alloc(rows * hidden)?,
            splits_2d: ctx.alloc(entries)?,
            splits_1d: ctx.alloc(ctx.n_pes())?,
            so_2d: ctx.alloc(2 * entries)?,
            so_back: ctx.alloc(2 * entries)?,
            so_1d: ctx.alloc(2 * ctx.n_pes())?,
        })
    }

    fn moe_typed<T: Value>(&self, ops: &[Op]) -> Res<Vec<Row>> {
        let (me, n, s, ctx) = (self.ctx.my_pe(), self.ctx.n_pes(), &self.s, self.ctx);
        let (hidden, elem) = (self.args.hidden as usize, size_of::<T>());
        let mut rows = Vec::new();
        let routings = routings(self.args, n)?;
        // Every PE fails alike (the same allocator): skip them all.
        let b = match self.moe_buffers::<T>(&routings) {
            Ok(b) => b,
            Err(e) => {
                if me == 0 {
                    note(format_args!("MoE {} rows skipped: {e}", T::NAME));
                }
                return Ok(rows);
            }
        };
        for r in &routings {
            let shape = r.shape;
            let pattern = Pattern::moved::<T>(n, seed(Op::Moe, T::NAME, shape.tokens))?;
            let own: Vec<T> = pattern.rows(me, 0, shape.rows(), hidden).collect();
            b.tokens.slice(..own.len()).copy_from_host(&own, s)?;
            b.splits_2d.copy_from_host(&r.counts[me].iter().map(|&c| c as i64).collect::<Vec<_>>(), s)?;
            b.splits_1d.copy_from_host(&(0..n).map(|q| r.to_pe(me, q) as i64).collect::<Vec<_>>(), s)?;
            for &op in ops {
                let (input, output, splits, out_so) = match op {
                    Op::Dispatch => (&b.tokens, &b.experts, &b.splits_2d, &b.so_2d),
                    Op::Combine => (&b.experts, &b.back, &b.so_2d, &b.so_back),
                    _ => (&b.tokens, &b.experts, &b.splits_1d, &b.so_1d),
                };
                let in_len = match op {
                    Op::Combine => r.out_rows(Op::Dispatch) * hidden,
                    _ => own.len(),
                };
                let out_len = r.out_rows(op) * hidden;
                if op == Op::Combine {
                    // The dispatch's output and out_splits_offsets as they
                    // should be, padding poisoned: it is never sent.
                    let (sent, _) = r.chunks(Op::Dispatch, me);
                    let mut experts = vec![T::POISON; in_len];
                    for c in &sent {
                        let rows = &mut experts[c.to * hidden..(c.to + c.rows) * hidden];
                        rows.iter_mut().zip(pattern.rows(c.src, c.from, c.rows, hidden)).for_each(|(x, v)| *x = v);
                    }
                    b.experts.slice(..in_len).copy_from_host(&experts, s)?;
                    b.so_2d.copy_from_host(&splits_offsets(&sent), s)?;
                }
                let (chunks, _) = r.chunks(op, me);
                let want = pattern.chunks::<T>(&chunks, hidden);
                let want_so = splits_offsets(&chunks);
                let run = || -> Res {
                    let (i, o) = (input.slice(..in_len), output.slice(..out_len));
                    match op {
                        Op::Dispatch => ctx.all_to_all_v_2d(i, o, splits, out_so, hidden, shape.major_align, s)?,
                        Op::Combine => ctx.all_to_all_v_2d_offset(i, o, splits, out_so, hidden, s)?,
                        _ => ctx.all_to_all_v(i, o, splits, out_so, hidden, s)?,
                    }
                    Ok(())
                };
                let poison = || {
                    self.poison(output, out_len)?;
                    self.poison(out_so, out_so.len())
                };
                let read = || gather(&output.slice(..out_len).copy_to_host(s)?, &chunks, hidden);
                let read_so = || Ok(out_so.copy_to_host(s)?);
                // As selected, the line kernel where the input fits.
                let ne = self.args.experts_per_pe as usize;
                let fits = moe_lines_fit(n, ne, op == Op::Combine, in_len * elem);
                for imp in FORMS {
                    if !self.runs(imp, op, shape.bytes(elem)) || (imp == Imp::ShmemLines && !fits) {
                        continue;
                    }
                    let settings = imp.settings(self.args.tuning()).expect("a shmem row");
                    // Every PE, between operations (after the last agreement).
                    ctx.set_collectives(Collectives { moe_local_blocks: self.args.moe_local_blocks, ..settings });
                    let case = Case {
                        op,
                        imp,
                        dtype: Some(T::NAME),
                        bytes: shape.bytes(elem),
                        run: &run,
                        poison: &poison,
                        read: &read,
                        want: &want,
                        moe: Some(shape),
                        splits: Some((&read_so, &want_so)),
                        matmul: None,
                        layer: None,
                    };
                    let measured = self.measure(&case, &mut rows);
                    ctx.set_collectives(Collectives::default());
                    measured?;
                }
            }
        }
        Ok(rows)
    }

    /// NCCL's rows of the MoE `ops`, in every dtype: one group of sends
    /// and receives of the same rows per peer as shmem's, packed by peer,
    /// on plain device buffers (`torch.distributed.all_to_all_single`
    /// with splits). The dispatch and all_to_all_v send each peer its
    /// rows; the combine sends back what they brought.
    pub(super) fn moe_nccl(&self, nccl: &Nccl, ops: &[Op]) -> Res<Vec<Row>> {
        let mut rows = Vec::new();
        for dtype in self.dtypes(Op::Dispatch) {
            rows.extend(match dtype {
                Dtype::F32 => self.moe_nccl_typed::<f32>(nccl, ops)?,
                Dtype::F16 => self.moe_nccl_typed::<f16>(nccl, ops)?,
                Dtype::Bf16 => self.moe_nccl_typed::<bf16>(nccl, ops)?,
            });
        }
        Ok(rows)
    }

    fn moe_nccl_typed<T: Value>(&self, nccl: &Nccl, ops: &[Op]) -> Res<Vec<Row>> {
        let (me, n) = (self.ctx.my_pe(), self.ctx.n_pes());
        let (hidden, elem) = (self.args.hidden as usize, size_of::<T>());
        let ne = self.args.experts_per_pe as usize;
        let mut rows = Vec::new();
        let routings = routings(self.args, n)?;
        // This PE's rows, or what it receives, whichever is more.
        let most = routings.iter().map(|r| r.shape.rows().max(r.chunks(Op::AllToAllV, me).1)).max().unwrap_or(0);
        let src = DeviceBuf::new(&nccl.stream, most * hidden * elem)?;
        let dst = DeviceBuf::new(&nccl.stream, most * hidden * elem)?;
        let elements = |v: &[(usize, usize)]| v.iter().map(|&(at, rows)| (at * hidden, rows * hidden)).collect();
        for r in &routings {
            let shape = r.shape;
            let pattern = Pattern::moved::<T>(n, seed(Op::Moe, T::NAME, shape.tokens))?;
            // (first row, rows) per peer: of this PE's rows, and of what it receives.
            let own: Vec<(usize, usize)> = (0..n).map(|q| (r.start(me, q * ne), r.to_pe(me, q))).collect();
            let (received, _) = r.chunks(Op::AllToAllV, me);
            let theirs: Vec<(usize, usize)> = received.iter().map(|c| (c.to, c.rows)).collect();
            let own_rows: Vec<T> = pattern.rows(me, 0, shape.rows(), hidden).collect();
            let their_rows: Vec<T> = pattern.chunks(&received, hidden);
            for &op in ops.iter().filter(|&&op| self.runs(Imp::Nccl, op, shape.bytes(elem))) {
                let (send, recv, input, want) = match op {
                    Op::Combine => (&theirs, &own, &their_rows, &own_rows),
                    _ => (&own, &theirs, &own_rows, &their_rows),
                };
                let (send, recv): (Vec<_>, Vec<_>) = (elements(send), elements(recv));
                src.write(input)?;
                let case = Case {
                    op,
                    imp: Imp::Nccl,
                    dtype: Some(T::NAME),
                    bytes: shape.bytes(elem),
                    run: &|| nccl.send_recv(op, T::NCCL, elem, &dst, &src, &send, &recv),
                    poison: &|| dst.poison(want.len() * elem),
                    read: &|| dst.read::<T>(want.len()),
                    want,
                    moe: Some(shape),
                    splits: None,
                    matmul: None,
                    layer: None,
                };
                self.measure(&case, &mut rows)?;
            }
        }
        Ok(rows)
    }
}
