//! shmem-bench's MoE layer rows: `layer_dispatch`
//! ([`MoeAllToAll::dispatch_on_device`]) and `layer_combine`
//! ([`MoeAllToAll::combine_on_device`]), shmem only, on the same routing
//! as the 2D rows of `moe.rs` (the same experts drawn for each PE's
//! token), so that `--op moe,moe_layer` puts the layer beside the 2D ops
//! and NCCL in one run. The bench's doc says what the rows measure.
//!
//! **Inputs**: PE `p`'s token `t` is row `t` of the moved pattern (see
//! `moe.rs`), its expert ids the routing's picks for `(p, t)` in the order
//! drawn, its weights powers of two summing to 1 (`1/c` each with `c` the
//! next power of two of top-k, the first slot taking the rest). One
//! [`MoeAllToAll`] per token count, built for exactly that many tokens.
//!
//! **Checks**: the dispatch's view — every token received, in the block
//! of each local expert it is routed to, from every source in PE order and
//! each source's in token order (padding rows are not compared) — and the
//! view's splits and offsets ([`MoeAllToAll::device_layout`]); the
//! combine's output with identity experts (the view itself as the experts'
//! output) against the sums as [`MoeAllToAll`] defines them, computed on
//! the host step by step in the same types: each expert PE's partial in
//! slot order rounded to the element type, the partials summed in PE
//! order and rounded. With these weights that is the token itself in f32.

use crate::args::{Args, Dtype};
use crate::bench::Bench;
use crate::data::{seed, Value};
use crate::harness::{Case, Reader};
use crate::moe::{gather, routings, splits_offsets, Chunk, MoeShape, Routing};
use crate::ops::{Imp, Op};
use crate::report::{note, Row};
use crate::Res;
use shmem::{bf16, f16, Collectives, CombineElement, Element, MoeAllToAll, MoeConfig, SymSlice, SymmetricBuffer};

/// What a layer row counts beside its `bytes`, for PE 0 (whose clock
/// times the rows) in one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LayerBytes {
    /// Wire bytes PE 0 sends to other PEs: the dispatch one wire row (the
    /// token, its metadata and padding) per (token, destination PE other
    /// than itself); the combine one per token it received from another
    /// PE (the partial sum going back).
    pub(super) link: usize,
    /// DeepEP's normal-mode count (`dispatch_bf16_nvl_recv_bytes =
    /// recv_x.numel() × 2`, `combine_bf16_nvl_send_bytes` the same): the
    /// token rows PE 0 receives in the dispatch, one per distinct (source
    /// PE, token) routed to any of its experts, its own tokens included,
    /// times `hidden × element`; the combine sends as many back.
    pub(super) logical: usize,
}

/// The bytes of a wire row of `hidden` elements of `elem` bytes and
/// `topk` slots, as `shmem::moe`'s layer lays it out: the elements padded
/// to 8, the token (i64), `topk` × (expert i32, weight f32), padded to 16.
pub(super) fn wire_stride(hidden: usize, elem: usize, topk: usize) -> usize {
    ((hidden * elem).next_multiple_of(8) + 8 + 8 * topk).next_multiple_of(16)
}

/// A case's parts: run, poison, read, what to find, and the splits'
/// reader and values.
type Parts<'a, T> = (Action<'a>, Action<'a>, Reader<'a, T>, &'a [T], Option<(Reader<'a, i64>, &'a [i64])>);
type Action<'a> = &'a dyn Fn() -> Res;

/// At least the layer kernels' threads a block (its counting scratch is
/// that many u32 per PE and local expert).
const ROUTE_THREADS_BOUND: usize = 1024;

/// The symmetric heap the layer rows take over `n` PEs: at the largest
/// token count, in the widest dtype, what [`MoeAllToAll::new`] allocates
/// (its `memory_bytes`: the wire rows out, `tokens × min(topk, n)`; in,
/// `tokens × n`; the view, `tokens × n × min(topk, experts_per_pe)` rows
/// plus each expert's padding; splits, slot map, scratch and arrival
/// flags; with `--fp8` the FP8 exchange's partials, codes and scales),
/// and the bench's own inputs and output, with 4 KiB for each
/// allocation's alignment. 0 where there is no routing (`--topk` too large).
pub(super) fn heap_bytes(args: &Args, n: usize) -> usize {
    if crate::moe::check(args, n).is_err() {
        return 0;
    }
    let elem = if args.dtype.contains(&Dtype::F32) { size_of::<f32>() } else { size_of::<bf16>() };
    let t = args.tokens.iter().copied().max().unwrap_or(0) as usize;
    let (h, k) = (args.hidden as usize, args.topk as usize);
    let (ne, a) = (args.experts_per_pe as usize, args.major_align as usize);
    let stride = wire_stride(h, elem, k);
    let send = t * k.min(n) * stride;
    let stage = t * n * stride;
    let view = (t * n * k.min(ne) + ne * a) * h * elem;
    let small = (5 * n + 4 * n * ne + 3 + t * k) * 8 + (ROUTE_THREADS_BOUND * (n + ne) + n * ne) * 4;
    let own = 2 * t * h * elem + t * k * (8 + 4) + 8;
    let fp8 = match args.fp8 {
        true => crate::layer_fp8::extra_heap_bytes(t, n, h, t * n * k.min(ne) + ne * a),
        false => 0,
    };
    send + stage + view + small + own + fp8 + 17 * 4096
}

/// Slot `j`'s weight of `topk`: powers of two summing to 1.
pub(super) fn weight(topk: usize, j: usize) -> f32 {
    let c = topk.next_power_of_two() as f32;
    if j == 0 {
        1.0 - (topk - 1) as f32 / c
    } else {
        1.0 / c
    }
}

impl Routing {
    /// The PEs that hold one of PE `p`'s token `t`'s experts, ascending.
    pub(super) fn dests(&self, p: usize, t: usize) -> Vec<usize> {
        let (k, ne) = (self.shape.topk, self.shape.experts_per_pe);
        let mut d: Vec<usize> = self.picks[p][t * k..(t + 1) * k].iter().map(|&g| g / ne).collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// Whether PE `p`'s token `t` goes to global expert `g`.
    fn routes(&self, p: usize, t: usize, g: usize) -> bool {
        let k = self.shape.topk;
        self.picks[p][t * k..(t + 1) * k].contains(&g)
    }

    /// PE `me`'s dispatched view: one chunk of one token row per (local
    /// expert, source, token) in the layer's order, and the view's rows
    /// with padding.
    pub(super) fn layer_view(&self, me: usize) -> (Vec<Chunk>, usize) {
        let (n, ne, a) = (self.n, self.shape.experts_per_pe, self.shape.major_align);
        let mut chunks = Vec::new();
        let mut at = 0;
        for e in 0..ne {
            let block = at;
            for src in 0..n {
                for t in (0..self.shape.tokens).filter(|&t| self.routes(src, t, me * ne + e)) {
                    chunks.push(Chunk { src, from: t, to: at, rows: 1 });
                    at += 1;
                }
            }
            at = block + (at - block).div_ceil(a).max(1) * a;
        }
        (chunks, at)
    }

    /// The view's splits and offsets (`device_layout`): entry `e × n + src`.
    pub(super) fn layer_so(&self, me: usize) -> Vec<i64> {
        let (n, ne, a) = (self.n, self.shape.experts_per_pe, self.shape.major_align);
        let mut per = Vec::with_capacity(n * ne);
        let mut at = 0;
        for e in 0..ne {
            let block = at;
            for src in 0..n {
                let rows = (0..self.shape.tokens).filter(|&t| self.routes(src, t, me * ne + e)).count();
                per.push(Chunk { src, from: 0, to: at, rows });
                at += rows;
            }
            at = block + (at - block).div_ceil(a).max(1) * a;
        }
        splits_offsets(&per)
    }

    /// PE 0's counts for `op` (see [`LayerBytes`]), of `elem`-byte elements.
    fn layer_bytes(&self, op: Op, elem: usize) -> LayerBytes {
        self.layer_bytes_of(op, wire_stride(self.shape.hidden, elem, self.shape.topk), elem)
    }

    /// PE 0's counts for `op` with wire rows of `stride` bytes, the
    /// logical count in `elem`-byte elements.
    pub(super) fn layer_bytes_of(&self, op: Op, stride: usize, elem: usize) -> LayerBytes {
        let (n, h) = (self.n, self.shape.hidden);
        let to_zero = |src: usize| (0..self.shape.tokens).filter(|&t| self.dests(src, t).contains(&0)).count();
        let received: usize = (0..n).map(to_zero).sum();
        let link_rows = match op {
            Op::LayerDispatch => {
                (0..self.shape.tokens).map(|t| self.dests(0, t).iter().filter(|&&d| d != 0).count()).sum()
            }
            _ => received - to_zero(0),
        };
        LayerBytes { link: link_rows * stride, logical: received * h * elem }
    }
}

/// The combine's result for PE `me`'s tokens with identity experts, as
/// [`MoeAllToAll`] defines it (see the module's doc): in the node-aware
/// form the partials summed by nodes of `per_node` PEs first, each node's
/// sum rounded (`per_node` = `n` in the flat form).
fn expected_combine<T: Value + CombineElement>(r: &Routing, tokens: &[T], me: usize, per_node: usize) -> Vec<T> {
    let (h, k, ne) = (r.shape.hidden, r.shape.topk, r.shape.experts_per_pe);
    let picks = &r.picks[me];
    let mut out = Vec::with_capacity(tokens.len());
    for t in 0..r.shape.tokens {
        let dests = r.dests(me, t);
        let slots: Vec<Vec<usize>> =
            dests.iter().map(|&d| (0..k).filter(|&j| picks[t * k + j] / ne == d).collect()).collect();
        for &x in &tokens[t * h..(t + 1) * h] {
            let mut acc = T::zero();
            // (node, the sum of its partials so far); destinations ascend.
            let mut node: Option<(usize, T::Acc)> = None;
            for (&d, s) in dests.iter().zip(&slots) {
                let partial = T::from_acc(s.iter().fold(T::zero(), |a, &j| T::weigh(a, weight(k, j), x)));
                node = match node {
                    Some((b, sum)) if b == d / per_node => Some((b, T::add(sum, partial))),
                    other => {
                        if let Some((_, sum)) = other {
                            acc = T::add(acc, T::from_acc(sum));
                        }
                        Some((d / per_node, T::add(T::zero(), partial)))
                    }
                };
            }
            if let Some((_, sum)) = node {
                acc = T::add(acc, T::from_acc(sum));
            }
            out.push(T::from_acc(acc));
        }
    }
    out
}

impl Bench<'_> {
    /// shmem's rows of the layer `ops`, in every dtype.
    pub(super) fn moe_layer(&self, ops: &[Op]) -> Res<Vec<Row>> {
        let mut rows = Vec::new();
        if !ops.iter().any(|&op| self.runs(Imp::Shmem, op, 0)) {
            return Ok(rows);
        }
        for dtype in self.dtypes(Op::LayerDispatch) {
            rows.extend(match dtype {
                Dtype::F32 => self.layer_typed::<f32>(ops)?,
                Dtype::F16 => self.layer_typed::<f16>(ops)?,
                Dtype::Bf16 => self.layer_typed::<bf16>(ops)?,
            });
        }
        // After the bf16 rows, whose exchanges are freed by then.
        if self.args.fp8 && ops.contains(&Op::LayerDispatch) {
            rows.extend(self.layer_fp8()?);
        }
        Ok(rows)
    }

    /// Overwrites the first `len` elements of this PE's `slice` with
    /// poison (on the host backend, the whole slice).
    fn poison_slice<T: Value>(&self, slice: SymSlice<'_, T>, len: usize) -> Res {
        self.poison_with(slice, len, T::POISON)
    }

    /// As [`Bench::poison_slice`], `poison` being the all-ones bytes the
    /// GPU writes, as an element (for the host backend).
    pub(super) fn poison_with<E: Element>(&self, slice: SymSlice<'_, E>, len: usize, poison: E) -> Res {
        match (self.s.cuda_stream(), slice.device_ptr()?) {
            (Some(stream), Some(ptr)) => {
                if len > slice.len() {
                    return Err(format!("poisoning {len} elements of a slice of {}", slice.len()).into());
                }
                // SAFETY: the first `len` elements (checked above) of this
                // PE's copy of a live allocation, ordered on the stream.
                let set = unsafe {
                    cudarc::driver::result::memset_d8_async(ptr, 0xFF, len * size_of::<E>(), stream.cu_stream())
                };
                Ok(set?)
            }
            _ => Ok(slice.copy_from_host(&vec![poison; slice.len()], &self.s)?),
        }
    }

    /// The first `len` elements of this PE's `slice`.
    fn read_prefix<T: Value>(&self, slice: SymSlice<'_, T>, len: usize) -> Res<Vec<T>> {
        self.read_prefix_of(slice, len, T::POISON)
    }

    /// As [`Bench::read_prefix`], for any element type (`fill` stands in
    /// for what is not read yet).
    pub(super) fn read_prefix_of<T: Element>(&self, slice: SymSlice<'_, T>, len: usize, fill: T) -> Res<Vec<T>> {
        if len > slice.len() {
            return Err(format!("reading {len} elements of a slice of {}", slice.len()).into());
        }
        match (self.s.cuda_stream(), slice.device_ptr()?) {
            (Some(stream), Some(ptr)) => {
                let mut out = vec![fill; len];
                // SAFETY: `len` elements (checked above) of a live
                // allocation into as many host elements; the stream is
                // synchronized before `out` is read or dropped.
                unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut out, ptr, stream.cu_stream())? };
                stream.synchronize()?;
                Ok(out)
            }
            _ => {
                let mut all = slice.copy_to_host(&self.s)?;
                all.truncate(len);
                Ok(all)
            }
        }
    }

    fn layer_typed<T: Value + CombineElement>(&self, ops: &[Op]) -> Res<Vec<Row>> {
        let (me, n, s, ctx) = (self.ctx.my_pe(), self.ctx.n_pes(), &self.s, self.ctx);
        let (hidden, elem) = (self.args.hidden as usize, size_of::<T>());
        let mut rows = Vec::new();
        for r in &routings(self.args, n)? {
            let shape: MoeShape = r.shape;
            let (tokens, k) = (shape.tokens, shape.topk);
            let config = MoeConfig::new(hidden, tokens, shape.experts_per_pe, k).major_align(shape.major_align);
            // Every PE fails alike (the same allocator): skip them all.
            let made = (|| -> Res<_> {
                let moe = MoeAllToAll::<T>::new(ctx, config)?;
                let bufs: (SymmetricBuffer<T>, SymmetricBuffer<i64>, SymmetricBuffer<f32>) =
                    (ctx.alloc(tokens * hidden)?, ctx.alloc(tokens * k)?, ctx.alloc(tokens * k)?);
                let (count, out): (SymmetricBuffer<i64>, SymmetricBuffer<T>) =
                    (ctx.alloc(1)?, ctx.alloc(tokens * hidden)?);
                Ok((moe, bufs, count, out))
            })();
            let (moe, (input, ids, weights), count, out) = match made {
                Ok(m) => m,
                Err(e) => {
                    if me == 0 {
                        note(format_args!("MoE layer {} rows of {tokens} tokens skipped: {e}", T::NAME));
                    }
                    continue;
                }
            };
            let pattern = crate::data::Pattern::moved::<T>(n, seed(Op::MoeLayer, T::NAME, tokens))?;
            let own: Vec<T> = pattern.rows(me, 0, tokens, hidden).collect();
            input.copy_from_host(&own, s)?;
            ids.copy_from_host(&r.picks[me].iter().map(|&g| g as i64).collect::<Vec<_>>(), s)?;
            weights.copy_from_host(&(0..tokens * k).map(|i| weight(k, i % k)).collect::<Vec<_>>(), s)?;
            count.copy_from_host(&[tokens as i64], s)?;
            let dispatch = || moe.dispatch_on_device(&input, &ids, &weights, &count, s);
            // The view (the whole receive buffer) and the expert outputs
            // the combine reads: the same, the experts being the identity.
            let view = dispatch()?;
            let (chunks, view_rows) = r.layer_view(me);
            let want_view = pattern.chunks::<T>(&chunks, hidden);
            let want_so = r.layer_so(me);
            let per_node = if moe.node_aware() { ctx.node().n_pes() } else { n };
            let want_out = expected_combine(r, &own, me, per_node);
            // The automatic form (the decode form where it fits), and with
            // `--impl shmem-lines` the exchange form beside it.
            for (op, imp) in ops.iter().flat_map(|&op| [(op, Imp::Shmem), (op, Imp::ShmemLines)]) {
                if !self.runs(imp, op, shape.bytes(elem)) {
                    continue;
                }
                let settings = imp.settings(self.args.tuning()).expect("a shmem row");
                let (run, poison, read, want, splits): Parts<'_, T> = match op {
                    Op::LayerDispatch => (
                        &|| Ok(dispatch().map(|_| ())?),
                        &|| {
                            self.poison_slice(view, view_rows * hidden)?;
                            self.poison_slice(moe.device_layout(), want_so.len())
                        },
                        &|| gather(&self.read_prefix(view, view_rows * hidden)?, &chunks, hidden),
                        &want_view,
                        Some((&|| self.read_prefix(moe.device_layout(), want_so.len()), &want_so[..])),
                    ),
                    _ => (
                        &|| Ok(moe.combine_on_device(view, &out, s)?),
                        &|| self.poison(&out, out.len()),
                        &|| Ok(out.copy_to_host(s)?),
                        &want_out,
                        None,
                    ),
                };
                ctx.set_collectives(Collectives { moe_local_blocks: self.args.moe_local_blocks, ..settings });
                if op == Op::LayerCombine {
                    // The view as the dispatch leaves it (in this form),
                    // whatever ran before.
                    dispatch()?;
                }
                let case = Case {
                    op,
                    imp,
                    dtype: Some(T::NAME),
                    bytes: shape.bytes(elem),
                    run,
                    poison,
                    read,
                    want,
                    moe: Some(shape),
                    splits,
                    matmul: None,
                    layer: Some(r.layer_bytes(op, elem)),
                };
                let measured = self.measure(&case, &mut rows);
                ctx.set_collectives(Collectives::default());
                measured?;
            }
        }
        Ok(rows)
    }
}
