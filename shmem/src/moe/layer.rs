//! [`MoeAllToAll`]: token dispatch and combine for a Mixture-of-Experts
//! layer, on top of `all_to_all_v_2d` and `all_to_all_v_2d_offset`.

use crate::buffer::{SymSlice, SymmetricBuffer};
use crate::context::{Context, Stream};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::team::{Desc, OpKind, Team};
use half::{bf16, f16};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Mutex;

/// The sizes a [`MoeAllToAll`] is built for; the same on every PE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    /// Elements per token (the hidden size): one row.
    pub hidden: usize,
    /// Most tokens one PE dispatches in one call.
    pub max_tokens: usize,
    /// Experts on each PE; expert `g` lives on PE `g / experts_per_pe`.
    pub experts_per_pe: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Each expert's block of received rows starts at a multiple of this,
    /// and is at least this long (see [`Team::all_to_all_v_2d`]). 1 by default.
    pub major_align: usize,
}

impl MoeConfig {
    /// A configuration with `major_align` 1.
    pub fn new(hidden: usize, max_tokens: usize, experts_per_pe: usize, top_k: usize) -> MoeConfig {
        MoeConfig { hidden, max_tokens, experts_per_pe, top_k, major_align: 1 }
    }

    /// Sets [`MoeConfig::major_align`].
    pub fn major_align(self, major_align: usize) -> MoeConfig {
        MoeConfig { major_align, ..self }
    }

    /// Rows one PE sends at most: one per (token, slot).
    fn send_rows(&self) -> Option<usize> {
        self.max_tokens.checked_mul(self.top_k)
    }

    /// Rows one PE may receive: every PE's rows, plus each expert's padding
    /// (`max(round_up(r, a), a) ≤ r + a`).
    fn recv_rows(&self, n: usize) -> Option<usize> {
        self.send_rows()?.checked_mul(n)?.checked_add(self.experts_per_pe.checked_mul(self.major_align)?)
    }

    fn check(&self, n: usize) -> Result<()> {
        let c = self;
        if c.hidden == 0 || c.max_tokens == 0 || c.experts_per_pe == 0 || c.top_k == 0 || c.major_align == 0 {
            return Err(Error::Invalid(format!("MoeAllToAll::new: every size must be at least 1, got {c:?}")));
        }
        let elems = |rows: Option<usize>| rows.and_then(|r| r.checked_mul(c.hidden));
        if elems(c.recv_rows(n)).is_none() || c.experts_per_pe.checked_mul(2 * n).is_none() {
            return Err(Error::Invalid(format!("MoeAllToAll::new: the buffers of {c:?} on {n} PEs overflow")));
        }
        Ok(())
    }
}

/// The element types [`MoeAllToAll::combine`] can weigh: the floats. Sums
/// run in [`Element::Acc`]: `f32` for `f16` and `bf16`.
pub trait CombineElement: Element + sealed::Sealed {
    /// `acc + weight × x`, in the accumulator's type (not fused).
    #[doc(hidden)]
    fn weigh(acc: Self::Acc, weight: f32, x: Self) -> Self::Acc;
    #[doc(hidden)]
    fn zero() -> Self::Acc;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! combine_element {
    ($t:ty, $acc:ty) => {
        impl sealed::Sealed for $t {}
        impl CombineElement for $t {
            #[inline]
            fn weigh(acc: $acc, weight: f32, x: $t) -> $acc {
                acc + <$acc>::from(weight) * x.to_acc()
            }
            #[inline]
            fn zero() -> $acc {
                0.0
            }
        }
    };
}

combine_element!(f32, f32);
combine_element!(f64, f64);
combine_element!(f16, f32);
combine_element!(bf16, f32);

/// Where a dispatch put every row: what [`MoeAllToAll::combine`] needs to
/// send the experts' outputs back and undo the routing.
#[derive(Clone, Debug)]
pub struct Layout {
    n_pes: usize,
    config: MoeConfig,
    n_tokens: usize,
    /// Rows received, expert-major: entry `e × n_pes + src`.
    splits: Vec<i64>,
    /// Where each of those chunks starts in the received rows.
    offsets: Vec<i64>,
    /// Received rows, padding included.
    rows: usize,
    /// Rows this PE sent to each global expert (rank-major).
    sent: Vec<i64>,
    /// For each (token, slot) `t × top_k + j`, its row in the send order.
    slot_rows: Vec<usize>,
}

impl Layout {
    /// Tokens this PE dispatched.
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Rows of the dispatched view, padding included.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Rows received per chunk, expert-major: entry `e × n_pes + src` is
    /// what PE `src` sent to local expert `e` (row 0 of the dispatch's
    /// `out_splits_offsets`).
    pub fn splits(&self) -> &[i64] {
        &self.splits
    }

    /// Where each chunk starts in the dispatched view (row 1 of the
    /// dispatch's `out_splits_offsets`).
    pub fn offsets(&self) -> &[i64] {
        &self.offsets
    }

    /// The rows of local expert `e`'s tokens in the dispatched view, from
    /// every source PE in PE order (the padding after them excluded).
    pub fn expert_rows(&self, e: usize) -> Range<usize> {
        let n = self.n_pes;
        let start = self.offsets[e * n] as usize;
        let count: i64 = self.splits[e * n..(e + 1) * n].iter().sum();
        start..start + count as usize
    }

    /// The rows PE `src` sent to local expert `e`, in the dispatched view.
    pub fn source_rows(&self, e: usize, src: usize) -> Range<usize> {
        let i = e * self.n_pes + src;
        let start = self.offsets[i] as usize;
        start..start + self.splits[i] as usize
    }
}

/// A Mixture-of-Experts token exchange: [`dispatch`](MoeAllToAll::dispatch)
/// sends each token to the PEs of its top-k experts, grouped by expert;
/// [`combine`](MoeAllToAll::combine) brings the experts' outputs back and
/// sums them with the routing weights.
///
/// Its symmetric buffers are allocated once, by [`MoeAllToAll::new`]; a
/// call allocates nothing on the symmetric heap. Expert `g` (of
/// `n_pes × experts_per_pe`) lives on PE `g / experts_per_pe` as its local
/// expert `g % experts_per_pe`.
///
/// ```no_run
/// # fn main() -> shmem::Result<()> {
/// use shmem::{MoeAllToAll, MoeConfig};
/// let ctx = shmem::init()?;
/// let s = ctx.stream();
/// let moe = MoeAllToAll::<f32>::new(&ctx, MoeConfig::new(64, 128, 2, 2))?;
/// let tokens = vec![1.0f32; 4 * 64]; // 4 tokens
/// let ids = vec![0i64, 1, 1, 0, 0, 1, 1, 0]; // top-2 experts per token
/// let (rows, layout) = moe.dispatch(&tokens, &ids, &s)?;
/// // … run local expert e on rows layout.expert_rows(e), write the outputs back into `rows` …
/// let out = moe.combine(rows, &layout, &[0.5; 8], &s)?;
/// assert_eq!(out, tokens); // identity experts, weights 1/k
/// # Ok(()) }
/// ```
pub struct MoeAllToAll<T: Element> {
    team: Team,
    config: MoeConfig,
    /// The dispatch's input, and the combine's output.
    send: SymmetricBuffer<T>,
    /// The dispatch's output: the dispatched view.
    recv: SymmetricBuffer<T>,
    in_splits: SymmetricBuffer<i64>,
    /// The dispatch's out splits/offsets, which the combine takes as input.
    dispatch_splits: SymmetricBuffer<i64>,
    combine_splits: SymmetricBuffer<i64>,
    /// Each (token, slot)'s row in send order (the device path's layout).
    slot_rows: SymmetricBuffer<i64>,
    /// The route kernel's counts: `ROUTE_THREADS × experts` `u32`s.
    route_scratch: SymmetricBuffer<u32>,
    /// The host backend's layout of the last `dispatch_on_device`.
    last: Mutex<Option<Layout>>,
}

impl<T: Element> std::fmt::Debug for MoeAllToAll<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoeAllToAll").field("dtype", &T::DTYPE).field("config", &self.config).finish()
    }
}

impl<T: Element> MoeAllToAll<T> {
    /// Allocates the buffers for `config` over the world.
    ///
    /// # Collective
    /// Every PE calls it with the same `config` (checked).
    pub fn new(ctx: &Context, config: MoeConfig) -> Result<MoeAllToAll<T>> {
        let team = ctx.world();
        team.check()?;
        let n = team.n_pes();
        let valid = config.check(n);
        let c = config;
        let mut desc = Desc::new(OpKind::MoeSetup);
        desc.dtype = Some(T::DTYPE);
        desc.args = [c.hidden, c.max_tokens, c.experts_per_pe, c.top_k, c.major_align].map(|x| x as u64);
        let rows = team.exchange(&desc, valid.as_ref().err())?;
        valid?;
        team.agree(&rows)?;
        let (send_rows, recv_rows) = (c.send_rows().unwrap_or(0), c.recv_rows(n).unwrap_or(0));
        let entries = n * c.experts_per_pe;
        Ok(MoeAllToAll {
            send: ctx.alloc(send_rows * c.hidden)?,
            recv: ctx.alloc(recv_rows * c.hidden)?,
            in_splits: ctx.alloc(entries)?,
            dispatch_splits: ctx.alloc(2 * entries)?,
            combine_splits: ctx.alloc(2 * entries)?,
            slot_rows: ctx.alloc(send_rows)?,
            route_scratch: ctx.alloc(crate::gpu::kernels::ROUTE_THREADS * entries)?,
            last: Mutex::new(None),
            team,
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> MoeConfig {
        self.config
    }

    /// Sends each token to the PEs of its experts and returns what this PE
    /// received, grouped by local expert, as a view of the receive buffer
    /// (valid until the next dispatch), with its [`Layout`].
    ///
    /// `tokens` holds `n_tokens ≤ max_tokens` rows of `hidden` elements;
    /// `topk_expert_ids[t × top_k + j]` is the global expert of token `t`'s
    /// slot `j`. In the view, local expert `e`'s rows are
    /// [`Layout::expert_rows`]: the rows from every source PE in PE order,
    /// each source's in (token, slot) order, as `all_to_all_v_2d` lays
    /// them out (with `major_align` padding after each expert).
    ///
    /// # Errors
    /// An expert id out of range, or sizes that do not fit the
    /// configuration: the error on this PE, and a collective mismatch on
    /// the others; nothing is sent.
    ///
    /// # Collective
    /// Every PE calls it (with its own tokens).
    pub fn dispatch(
        &self,
        tokens: &[T],
        topk_expert_ids: &[i64],
        stream: &Stream,
    ) -> Result<(SymSlice<'_, T>, Layout)> {
        let (pre, routed) = match self.route(tokens, topk_expert_ids) {
            Ok((sent, slot_rows)) => (self.fill_send(tokens, &sent, &slot_rows, stream), Some((sent, slot_rows))),
            Err(e) => (Err(e), None),
        };
        let buffers =
            ((&self.send).into(), (&self.recv).into(), (&self.in_splits).into(), (&self.dispatch_splits).into());
        let c = &self.config;
        self.team.all_to_all_v_any(OpKind::AllToAllV2d, buffers, c.hidden, c.major_align, pre, stream)?;
        let (sent, slot_rows) = routed.expect("the exchange fails on a PE whose routing failed");
        let n = self.team.n_pes();
        let entries = n * c.experts_per_pe;
        let so = self.dispatch_splits.copy_to_host(stream)?;
        let (splits, offsets) = (so[..entries].to_vec(), so[entries..].to_vec());
        // The last expert's block ends the received rows: it starts where
        // its first chunk does and is padded as every block is.
        let last = (c.experts_per_pe - 1) * n;
        let tail = splits[last..].iter().sum::<i64>() as usize;
        let rows = offsets[last] as usize + tail.div_ceil(c.major_align).max(1) * c.major_align;
        let layout = Layout {
            n_pes: n,
            config: *c,
            n_tokens: topk_expert_ids.len() / c.top_k,
            splits,
            offsets,
            rows,
            sent,
            slot_rows,
        };
        Ok((self.recv.slice(0..rows * c.hidden), layout))
    }

    /// [`MoeAllToAll::dispatch`] with everything on the device, so that it
    /// can be captured in a CUDA graph: `tokens` holds `max_tokens` rows,
    /// `topk_expert_ids` `max_tokens × top_k` ids, and `n_tokens` one
    /// count, all read on the device when the operation runs. Returns the
    /// whole receive buffer; [`MoeAllToAll::device_layout`] says where each
    /// expert's rows lie in it. Pair with [`MoeAllToAll::combine_on_device`].
    ///
    /// # Errors
    /// Buffers too small for the configuration, at once. On the GPU backend
    /// a token count above `max_tokens` or an expert id out of range is
    /// found on the device: nothing is sent, and the next MoE call (or
    /// [`Context::check_device`]) fails on every PE, naming the pair.
    ///
    /// # Collective
    /// Every PE calls it.
    pub fn dispatch_on_device<'a, 'b, 'c>(
        &self,
        tokens: impl Into<SymSlice<'a, T>>,
        topk_expert_ids: impl Into<SymSlice<'b, i64>>,
        n_tokens: impl Into<SymSlice<'c, i64>>,
        stream: &Stream,
    ) -> Result<SymSlice<'_, T>> {
        let (tokens, ids, count) = (tokens.into(), topk_expert_ids.into(), n_tokens.into());
        let c = self.config;
        let slots = c.max_tokens * c.top_k;
        let pre = self.check_sizes(&[
            ("tokens", tokens.len(), c.max_tokens * c.hidden, "max_tokens × hidden"),
            ("topk_expert_ids", ids.len(), slots, "max_tokens × top_k"),
            ("n_tokens", count.len(), 1, "one count"),
        ]);
        let buffers =
            ((&self.send).into(), (&self.recv).into(), (&self.in_splits).into(), (&self.dispatch_splits).into());
        let Some(g) = self.team.ctx.gpu.as_ref() else {
            // The host backend: the host path on the buffers' contents.
            let n = match pre.and_then(|_| self.host_count(count, stream)) {
                Ok(n) => n,
                Err(e) => {
                    self.team.all_to_all_v_any(
                        OpKind::AllToAllV2d,
                        buffers,
                        c.hidden,
                        c.major_align,
                        Err(e),
                        stream,
                    )?;
                    unreachable!("the exchange fails on a PE whose arguments failed");
                }
            };
            let host_tokens = tokens.buf.slice(tokens.start..tokens.start + n * c.hidden).copy_to_host(stream)?;
            let host_ids = ids.buf.slice(ids.start..ids.start + n * c.top_k).copy_to_host(stream)?;
            let (_, layout) = self.dispatch(&host_tokens, &host_ids, stream)?;
            let rows: Vec<i64> = layout.slot_rows.iter().map(|&r| r as i64).collect();
            self.slot_rows.slice(0..rows.len()).copy_from_host(&rows, stream)?;
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(layout);
            return Ok((&self.recv).into());
        };
        let pre = pre.and_then(|_| {
            let k = g.kernels.as_ref().ok_or_else(crate::gpu::kernels::not_built)?;
            let t = k.team(self.team.state.slot, &self.team.state.members, false)?;
            let r = crate::gpu::kernels::MoeRoute {
                ids: ids.region(&self.team.ctx)?.offset as u64,
                n_tokens: count.region(&self.team.ctx)?.offset as u64,
                splits: self.in_splits.offset as u64,
                slot_rows: self.slot_rows.offset as u64,
                scratch: self.route_scratch.offset as u64,
                tokens: tokens.region(&self.team.ctx)?.offset as u64,
                send: self.send.offset as u64,
                row_bytes: (c.hidden * size_of::<T>()) as u64,
                max_tokens: c.max_tokens as i64,
                top_k: c.top_k as i32,
                experts: (self.team.n_pes() * c.experts_per_pe) as i32,
            };
            k.moe_route(t, r, g.stream(stream).cu_stream())
        });
        self.team.all_to_all_v_any(OpKind::AllToAllV2d, buffers, c.hidden, c.major_align, pre, stream)?;
        Ok((&self.recv).into())
    }

    /// The last dispatch's out_splits_offsets, on the device: entry
    /// `e × n_pes + src` of row 0 is what PE `src` sent to local expert `e`,
    /// of row 1 where those rows start in the dispatched view (see
    /// [`Layout`]).
    pub fn device_layout(&self) -> SymSlice<'_, i64> {
        (&self.dispatch_splits).into()
    }

    /// `Ok` when every buffer holds at least what the configuration needs.
    fn check_sizes(&self, sizes: &[(&str, usize, usize, &str)]) -> Result<()> {
        for &(name, len, want, what) in sizes {
            if len < want {
                return Err(Error::LengthMismatch(format!(
                    "MoeAllToAll: {name} has {len} elements, fewer than {what} ({want}) of {:?}",
                    self.config
                )));
            }
        }
        Ok(())
    }

    /// The token count in `count` (host backend), checked.
    fn host_count(&self, count: SymSlice<'_, i64>, stream: &Stream) -> Result<usize> {
        let n = count.buf.slice(count.start..count.start + 1).copy_to_host(stream)?[0];
        usize::try_from(n).ok().filter(|&n| n <= self.config.max_tokens).ok_or_else(|| {
            Error::Invalid(format!(
                "MoeAllToAll::dispatch_on_device: n_tokens is {n}, not in 0..={}",
                self.config.max_tokens
            ))
        })
    }

    /// Checks the routing and sorts the (token, slot) pairs by global
    /// expert: returns the rows per expert and each slot's send row.
    fn route(&self, tokens: &[T], ids: &[i64]) -> Result<(Vec<i64>, Vec<usize>)> {
        let c = &self.config;
        let experts = self.team.n_pes() * c.experts_per_pe;
        let n_tokens = tokens.len() / c.hidden;
        if tokens.len() % c.hidden != 0 || n_tokens > c.max_tokens {
            return Err(Error::LengthMismatch(format!(
                "MoeAllToAll::dispatch: {} token elements are not at most max_tokens ({}) rows of hidden ({})",
                tokens.len(),
                c.max_tokens,
                c.hidden
            )));
        }
        if ids.len() != n_tokens * c.top_k {
            return Err(Error::LengthMismatch(format!(
                "MoeAllToAll::dispatch: {} expert ids for {n_tokens} tokens, expected {n_tokens} × top_k ({})",
                ids.len(),
                c.top_k
            )));
        }
        let mut sent = vec![0i64; experts];
        for (slot, &id) in ids.iter().enumerate() {
            let g = usize::try_from(id).ok().filter(|&g| g < experts).ok_or_else(|| {
                Error::Invalid(format!(
                    "MoeAllToAll::dispatch: token {} slot {} routes to expert {id}, but experts are 0..{experts} \
                     ({} PEs × {} experts per PE)",
                    slot / c.top_k,
                    slot % c.top_k,
                    self.team.n_pes(),
                    c.experts_per_pe
                ))
            })?;
            sent[g] += 1;
        }
        // A counting sort, stable in (token, slot) order.
        let mut next: Vec<usize> = sent
            .iter()
            .scan(0usize, |at, &k| {
                let start = *at;
                *at += k as usize;
                Some(start)
            })
            .collect();
        let slot_rows = ids
            .iter()
            .map(|&g| {
                let row = next[g as usize];
                next[g as usize] += 1;
                row
            })
            .collect();
        Ok((sent, slot_rows))
    }

    /// Writes the tokens in send order and the splits.
    fn fill_send(&self, tokens: &[T], sent: &[i64], slot_rows: &[usize], stream: &Stream) -> Result<()> {
        let (h, k) = (self.config.hidden, self.config.top_k);
        let mut rows = crate::dtype::zeroed_vec::<T>(slot_rows.len() * h);
        for (slot, &r) in slot_rows.iter().enumerate() {
            let t = slot / k;
            rows[r * h..(r + 1) * h].copy_from_slice(&tokens[t * h..(t + 1) * h]);
        }
        self.send.slice(0..rows.len()).copy_from_host(&rows, stream)?;
        self.in_splits.copy_from_host(sent, stream)
    }
}

impl<T: CombineElement> MoeAllToAll<T> {
    /// [`MoeAllToAll::combine`] with everything on the device, after
    /// [`MoeAllToAll::dispatch_on_device`] (capturable in a CUDA graph with
    /// it): `expert_outputs` as for `combine`, `topk_weights` holds
    /// `max_tokens × top_k` weights, `n_tokens` the same count the dispatch
    /// read, and `out` (at least `max_tokens` rows) gets each token's
    /// weighted sum, in token order.
    ///
    /// # Errors
    /// Buffers too small for the configuration; on the host backend, no
    /// `dispatch_on_device` before.
    ///
    /// # Collective
    /// Every PE calls it.
    pub fn combine_on_device<'a, 'b, 'c, 'd>(
        &self,
        expert_outputs: impl Into<SymSlice<'a, T>>,
        topk_weights: impl Into<SymSlice<'b, f32>>,
        n_tokens: impl Into<SymSlice<'c, i64>>,
        out: impl Into<SymSlice<'d, T>>,
        stream: &Stream,
    ) -> Result<()> {
        let (outputs, weights, count, out) = (expert_outputs.into(), topk_weights.into(), n_tokens.into(), out.into());
        let c = self.config;
        let pre = self.check_sizes(&[
            ("topk_weights", weights.len(), c.max_tokens * c.top_k, "max_tokens × top_k"),
            ("n_tokens", count.len(), 1, "one count"),
            ("out", out.len(), c.max_tokens * c.hidden, "max_tokens × hidden"),
        ]);
        let Some(g) = self.team.ctx.gpu.as_ref() else {
            let layout = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let pre = pre.and_then(|_| {
                layout.clone().ok_or_else(|| {
                    Error::Invalid("MoeAllToAll::combine_on_device: no dispatch_on_device before it".into())
                })
            });
            let layout = match pre {
                Ok(l) => l,
                Err(e) => {
                    let buffers =
                        (outputs, (&self.send).into(), (&self.dispatch_splits).into(), (&self.combine_splits).into());
                    self.team.all_to_all_v_any(OpKind::AllToAllV2dOffset, buffers, c.hidden, 0, Err(e), stream)?;
                    unreachable!("the exchange fails on a PE whose arguments failed");
                }
            };
            let n = layout.n_tokens;
            let w = weights.buf.slice(weights.start..weights.start + n * c.top_k).copy_to_host(stream)?;
            let sums = self.combine(outputs, &layout, &w, stream)?;
            return out.buf.slice(out.start..out.start + sums.len()).copy_from_host(&sums, stream);
        };
        let whole_rows = outputs.buf.len.saturating_sub(outputs.start) / c.hidden * c.hidden;
        let outputs = outputs.buf.slice(outputs.start..outputs.start + whole_rows);
        let buffers = (outputs, (&self.send).into(), (&self.dispatch_splits).into(), (&self.combine_splits).into());
        self.team.all_to_all_v_any(OpKind::AllToAllV2dOffset, buffers, c.hidden, 0, pre, stream)?;
        let k = g.kernels.as_ref().ok_or_else(crate::gpu::kernels::not_built)?;
        let ctx = &self.team.ctx;
        let m = crate::gpu::kernels::MoeCombine {
            back: self.send.offset as u64,
            slot_rows: self.slot_rows.offset as u64,
            weights: weights.region(ctx)?.offset as u64,
            n_tokens: count.region(ctx)?.offset as u64,
            out: out.region(ctx)?.offset as u64,
            max_tokens: c.max_tokens as i64,
            hidden: c.hidden as i64,
            top_k: c.top_k as i32,
            _pad: 0,
        };
        let t = k.team(self.team.state.slot, &self.team.state.members, false)?;
        k.moe_combine(T::DTYPE, t, m, g.stream(stream).cu_stream())
    }

    /// Sends the experts' outputs back to the PEs that dispatched the
    /// tokens and returns, for each of this PE's tokens in its original
    /// order, `Σ_j topk_weights[t × top_k + j] × output(t, j)`, summed over
    /// the slots `j = 0..top_k` in order, in `f32` for `f16`/`bf16`.
    ///
    /// `expert_outputs` has the dispatched layout: the row of every token
    /// where the dispatch put it. It is the dispatched view itself, written
    /// in place, or a slice of another symmetric buffer that starts at the
    /// same element on every PE and holds at least [`Layout::rows`] rows;
    /// only the rows of tokens are read, not the padding.
    ///
    /// # Errors
    /// A layout of another configuration, or weights of the wrong length:
    /// the error on this PE, a collective mismatch on the others; layouts
    /// of different dispatches on different PEs: an error where it shows.
    ///
    /// # Collective
    /// Every PE calls it, with the layout of the same dispatch.
    pub fn combine<'a>(
        &self,
        expert_outputs: impl Into<SymSlice<'a, T>>,
        layout: &Layout,
        topk_weights: &[f32],
        stream: &Stream,
    ) -> Result<Vec<T>> {
        let (c, n) = (&self.config, self.team.n_pes());
        let outputs: SymSlice<'a, T> = expert_outputs.into();
        let pre = if layout.config != *c || layout.n_pes != n {
            Err(Error::Invalid(format!(
                "MoeAllToAll::combine: the layout is of a dispatch with {:?} on {} PEs, this exchange has {c:?} on \
                 {n} PEs",
                layout.config, layout.n_pes
            )))
        } else if topk_weights.len() != layout.n_tokens * c.top_k {
            Err(Error::LengthMismatch(format!(
                "MoeAllToAll::combine: {} weights for {} tokens, expected tokens × top_k ({})",
                topk_weights.len(),
                layout.n_tokens,
                c.top_k
            )))
        } else if outputs.len() < layout.rows * c.hidden {
            Err(Error::LengthMismatch(format!(
                "MoeAllToAll::combine: expert_outputs has {} elements, the layout needs {} rows of {}",
                outputs.len(),
                layout.rows,
                c.hidden
            )))
        } else {
            self.dispatch_splits.copy_from_host(&[&layout.splits[..], &layout.offsets[..]].concat(), stream)
        };
        // The PEs' views differ in length; the operation wants the same
        // region everywhere: the whole rows up to the buffer's end (only
        // the rows the layout names, checked above to lie in the view, are read).
        let whole_rows = outputs.buf.len.saturating_sub(outputs.start) / c.hidden * c.hidden;
        let outputs = outputs.buf.slice(outputs.start..outputs.start + whole_rows);
        let buffers = (outputs, (&self.send).into(), (&self.dispatch_splits).into(), (&self.combine_splits).into());
        self.team.all_to_all_v_any(OpKind::AllToAllV2dOffset, buffers, c.hidden, 0, pre, stream)?;
        // What came back must be what this PE sent: otherwise the PEs
        // combined layouts of different dispatches.
        let back = self.combine_splits.slice(0..layout.sent.len()).copy_to_host(stream)?;
        if back != layout.sent {
            return Err(Error::CollectiveMismatch(format!(
                "MoeAllToAll::combine: PE {} got back {back:?} rows per expert but sent {:?}: the PEs passed layouts \
                 of different dispatches",
                self.team.my_pe(),
                layout.sent
            )));
        }
        let h = c.hidden;
        let rows = self.send.slice(0..layout.slot_rows.len() * h).copy_to_host(stream)?;
        let mut out = crate::dtype::zeroed_vec::<T>(layout.n_tokens * h);
        let weigh = |(t, token): (usize, &mut [T])| {
            let mut acc = vec![T::zero(); h];
            for j in 0..c.top_k {
                let slot = t * c.top_k + j;
                let (w, r) = (topk_weights[slot], layout.slot_rows[slot]);
                for (a, &x) in acc.iter_mut().zip(&rows[r * h..(r + 1) * h]) {
                    *a = T::weigh(*a, w, x);
                }
            }
            for (o, a) in token.iter_mut().zip(acc) {
                *o = T::from_acc(a);
            }
        };
        if out.len() < 1 << 15 {
            out.chunks_mut(h).enumerate().for_each(weigh);
        } else {
            self.team.ctx.pool.install(|| out.par_chunks_mut(h).enumerate().for_each(weigh));
        }
        Ok(out)
    }
}
