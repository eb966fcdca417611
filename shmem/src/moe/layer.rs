//! [`MoeAllToAll`]: deduplicated token dispatch and reducing combine for a
//! Mixture-of-Experts layer, on top of the 1D `all_to_all_v`.
//!
//! # What travels
//!
//! A token routed to several experts of one PE crosses the link to that PE
//! once: the dispatch sends one *wire row* per (token, destination PE) —
//! the token's `hidden` elements, then its metadata (the token's index and,
//! for each of its `top_k` slots, the destination's local expert or -1,
//! and the slot's weight) — rank-major and in token order, through
//! `all_to_all_v`, into the destination's staging area. The destination
//! expands each staged row into the block of every local expert it is
//! routed to. The combine reverses it: for each staged (source, token)
//! row the expert PE sums the token's local experts' outputs with their
//! weights and sends that one partial row back; the source sums the
//! partials of its destinations.
//!
//! ```text
//! wire row:  | hidden × T | pad to 8 | token: i64 | top_k × {local expert or -1: i32, weight: f32} | pad to 16 |
//! ```
//!
//! # FP8 dispatch
//!
//! Built with [`MoeConfig::fp8`] (bf16 exchanges only), the wire row
//! carries the token as e4m3 codes with one `f32` scale per
//! [`quant::GROUP`] elements, quantized on the sender exactly as
//! [`crate::quant`] defines it — about half the bytes of bf16:
//!
//! ```text
//! wire row:  | hidden × e4m3 | pad to 4 | ⌈hidden/128⌉ × f32 scale | pad to 8 | token | slots | pad to 16 |
//! ```
//!
//! The receiver places the codes and scales as they came, in the same
//! expert-major layout ([`Fp8View`]: what an FP8 grouped GEMM takes), and,
//! if asked, their dequantized bf16 values in the usual view. Tokens may
//! also come already quantized, with their scales ([`Fp8Tokens`]). The
//! combine stays in bf16: the experts' outputs go back as bf16 partials,
//! in rows of their own (`hidden × 2` bytes, padded to 16).
//!
//! # Arrivals: starting on rows as they land
//!
//! [`MoeAllToAll::arrivals`] gives each PE's `experts_per_pe × n_pes`
//! `u64` flags, one per (local expert, source PE), and the epoch word. The
//! k-th dispatch of an exchange marks k: on the device path the placement
//! kernel stores a pair's flag with release semantics once that source's
//! rows for that expert are all in the expert's block, so an expert
//! kernel on another stream can wait on it (`shmem::moe_wait_arrival` of
//! [`DEVICE_HEADER`](crate::DEVICE_HEADER)) and start on those rows while
//! the dispatch places the others. A pair that receives no row is marked
//! as well, so a waiter never waits for rows that will not come. Flags
//! only grow: nothing is reset, and replays of a CUDA graph advance the
//! epoch on the device. See [`Arrivals`](super::Arrivals).

use super::nodes::{node_aware_shape, Rails};
use super::Agreement;
use crate::buffer::{SymSlice, SymmetricBuffer};
use crate::context::{Context, Stream};
use crate::dtype::Element;
use crate::error::{Error, Result, RoutingFault};
use crate::fp8::fp8_e4m3;
use crate::gpu::kernels::{decode_fits, decode_words, rank_scratch_len};
use crate::team::{Desc, OpKind, Team};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::atomic::AtomicU8;
use std::sync::Mutex;

pub use super::wire::*;

/// Where a dispatch put every row, on both sides: what
/// [`MoeAllToAll::combine`] needs to weigh the experts' outputs, send them
/// back and finish each token's sum.
///
/// The receiving side: the dispatched view is expert-major — local expert
/// `e`'s block holds the tokens routed to it from every source PE in PE
/// order, each source's in token order, padded to `major_align` — and a
/// received token routed to several local experts is in each of their
/// blocks. [`Layout::received`] lists the distinct (source, token) pairs
/// that arrived, [`Layout::placements`] where each landed and with which
/// weight.
#[derive(Clone, Debug)]
pub struct Layout {
    pub(super) n_pes: usize,
    pub(super) config: MoeConfig,
    pub(super) n_tokens: usize,
    /// View rows per chunk, expert-major: entry `e × n_pes + src`.
    pub(super) splits: Vec<i64>,
    /// Where each of those chunks starts in the view.
    pub(super) offsets: Vec<i64>,
    /// View rows, padding included.
    pub(super) rows: usize,
    /// Wire rows this PE sent to each PE (distinct tokens).
    pub(super) sent: Vec<i64>,
    /// For token `t`, `token_rows[token_start[t]..token_start[t + 1]]`:
    /// its wire rows in send order, which is ascending destination PE.
    pub(super) token_start: Vec<usize>,
    pub(super) token_rows: Vec<usize>,
    /// Wire rows received from each member of the team of the exchange
    /// that staged them: the world, or in the node-aware form the node.
    pub(super) received: Vec<i64>,
    /// Each received row's (source PE, token), by source PE and token.
    pub(super) arrivals: Vec<(usize, usize)>,
    /// Where each of those rows was staged (the identity in the flat form;
    /// the node-aware form stages them by forwarding PE).
    pub(super) staged_at: Vec<usize>,
    /// Wire rows this PE sent in its first exchange to each destination:
    /// PE, or node in the node-aware form (what the combine gets back).
    pub(super) wire_sent: Vec<i64>,
    /// What this PE forwarded in the node-aware form.
    pub(super) forward: Option<Forward>,
    /// For each received row, `top_k` entries: the view row of the slot
    /// and its weight, or `None` for a slot routed elsewhere.
    pub(super) placements: Vec<Option<(usize, f32)>>,
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

    /// View rows per chunk, expert-major: entry `e × n_pes + src` is how
    /// many of PE `src`'s tokens local expert `e` received (row 0 of
    /// [`MoeAllToAll::device_layout`]).
    pub fn splits(&self) -> &[i64] {
        &self.splits
    }

    /// Where each chunk starts in the dispatched view (row 1 of
    /// [`MoeAllToAll::device_layout`]).
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

    /// The rows PE `src` sent to local expert `e`, in the dispatched view,
    /// in that PE's token order.
    pub fn source_rows(&self, e: usize, src: usize) -> Range<usize> {
        let i = e * self.n_pes + src;
        let start = self.offsets[i] as usize;
        start..start + self.splits[i] as usize
    }

    /// Distinct tokens this PE sent to each PE (in the flat form, its wire
    /// rows: what crossed the links; in the node-aware form the network
    /// carried one row per token and destination node, which the node's
    /// PEs passed on).
    pub fn sent(&self) -> &[i64] {
        &self.sent
    }

    /// Wire rows this PE sent in its first exchange to each destination:
    /// each PE, or in the node-aware form each node.
    pub(super) fn wire_sent(&self) -> &[i64] {
        &self.wire_sent
    }

    /// The distinct tokens this PE received, as (source PE, the source's
    /// token index), by source PE and then token: one entry per wire row.
    pub fn received(&self) -> &[(usize, usize)] {
        &self.arrivals
    }

    /// Where received token `i` (an index into [`Layout::received`]) lies
    /// in the dispatched view: for each of its slots routed to this PE, in
    /// slot order, `(slot, view row, weight)`.
    pub fn placements(&self, i: usize) -> impl Iterator<Item = (usize, usize, f32)> + '_ {
        let k = self.config.top_k;
        self.placements[i * k..(i + 1) * k].iter().enumerate().filter_map(|(j, p)| p.map(|(r, w)| (j, r, w)))
    }
}

/// What a PE of the node-aware form forwarded to its node: the rows its
/// rail peers (and itself) sent for the node, and the rows it made of them.
#[derive(Clone, Debug)]
pub(super) struct Forward {
    /// Rail rows staged from each node.
    pub(super) rail_received: Vec<i64>,
    /// Node rows sent to each PE of the node.
    pub(super) node_sent: Vec<i64>,
    /// For rail row `r`, `fwd_rows[fwd_start[r]..fwd_start[r + 1]]`: its
    /// node rows, by ascending PE.
    pub(super) fwd_start: Vec<usize>,
    pub(super) fwd_rows: Vec<usize>,
}

/// This PE's routing, checked: what it sends where.
pub(super) struct Route {
    /// Distinct tokens to each PE.
    pub(super) sent: Vec<i64>,
    /// Wire rows to each destination: each PE, or in the node-aware form
    /// each node.
    pub(super) wire: Vec<i64>,
    /// Each wire row's (token, destination), in send order.
    pub(super) rows: Vec<(usize, usize)>,
    /// As [`Layout::token_start`] and [`Layout::token_rows`].
    pub(super) token_start: Vec<usize>,
    pub(super) token_rows: Vec<usize>,
}

/// A Mixture-of-Experts token exchange with deduplicated dispatch and
/// reducing combine: [`dispatch`](MoeAllToAll::dispatch) sends each token
/// once to each PE that holds one of its top-k experts, and that PE places
/// it in every one of its experts' blocks; [`combine`](MoeAllToAll::combine)
/// weighs and sums a token's experts on each expert PE, sends one row per
/// (token, PE) back, and finishes the sum at the token's PE.
///
/// # The combine's result, exactly
///
/// With `Acc` the accumulator type ([`Element::Acc`]: `f32` for `f16` and
/// `bf16`), for token `t` of this PE:
///
/// 1. on each PE `d` holding some of its experts: `partial_d = T(Σ_j w_j ×
///    out_j)` over the slots `j` routed to `d` in slot order, where `out_j`
///    is expert `j`'s output row for the token, each step `acc + Acc(w_j) ×
///    Acc(out_j)` in `Acc` (a multiply then an add, not fused) from 0, and
///    the sum rounded to `T` once;
/// 2. on this PE: `out[t] = T(Σ_d partial_d)` over those PEs in ascending PE
///    order, each step `acc + Acc(partial_d)` in `Acc` from 0, rounded once.
///
/// In the node-aware form ([`MoeAllToAll::node_aware`]) step 2 runs in two:
/// on the forwarding PE of each node `b`, `sum_b = T(Σ_{d on b}
/// partial_d)` in ascending PE order, rounded once; on this PE, `out[t] =
/// T(Σ_b sum_b)` in ascending node order, rounded once. For a token whose
/// experts are all on one node that is step 2's value; in `f32` and `f64`
/// only the association of the sum changes.
///
/// # Across nodes
///
/// Where the world spans two nodes or more, its ranks node by node, the
/// exchange takes the node-aware form (as the node-aware collectives
/// choose, see [`crate::AcrossNodes`]; [`crate::AcrossNodes::Flat`] at
/// construction keeps the flat one): the dispatch sends one wire row per
/// (token, destination node) to the PE of the same local rank there,
/// which passes it on to the node's PEs that hold the token's experts; the
/// combine sums each node's partials on that PE and sends one row per
/// (token, node) back. The view and the [`Layout`] are the flat form's.
///
/// Both backends compute exactly this, so results match bit for bit.
///
/// # Memory
///
/// Every buffer is a symmetric allocation made by [`MoeAllToAll::new`] and
/// sized from the [`MoeConfig`]; a call allocates nothing on the symmetric
/// heap. [`MoeAllToAll::memory_bytes`] gives their sum. Expert `g` (of
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
/// let weights = vec![0.5f32; 8];
/// let (rows, layout) = moe.dispatch(&tokens, &ids, &weights, &s)?;
/// // … run local expert e on rows layout.expert_rows(e), write the outputs back into `rows` …
/// let out = moe.combine(rows, &layout, &s)?;
/// assert_eq!(out, tokens); // identity experts, weights 1/k
/// # Ok(()) }
/// ```
pub struct MoeAllToAll<T: Element> {
    pub(super) team: Team,
    pub(super) config: MoeConfig,
    pub(super) wire: Wire,
    /// Wire rows out (the dispatch), and the partials that come back (the
    /// combine): `send_rows` rows of `wire.stride` bytes.
    pub(super) send: SymmetricBuffer<u8>,
    /// Wire rows in (the dispatch), and the partials that go back (the
    /// combine): `stage_rows` rows.
    pub(super) stage: SymmetricBuffer<u8>,
    /// The dispatched view: `recv_rows` rows of `hidden`.
    pub(super) recv: SymmetricBuffer<T>,
    /// The dispatch's `in_splits` (`n_pes`).
    pub(super) send_splits: SymmetricBuffer<i64>,
    /// The dispatch's out splits/offsets (`2 × n_pes`); its splits are the
    /// combine's `in_splits`.
    pub(super) stage_so: SymmetricBuffer<i64>,
    /// The combine's out splits/offsets (`2 × n_pes`).
    pub(super) back_so: SymmetricBuffer<i64>,
    /// The view's splits and offsets (`2 × n_pes × experts_per_pe`).
    pub(super) dispatch_splits: SymmetricBuffer<i64>,
    /// The device path's wire row of each (token, slot).
    pub(super) slot_rows: SymmetricBuffer<i64>,
    /// The device path's state: the token count of the last dispatch.
    pub(super) state: SymmetricBuffer<i64>,
    /// The device path's counting scratch.
    pub(super) scratch: SymmetricBuffer<u32>,
    /// The FP8 format's buffers: the combine's partials before they go
    /// back (`stage_rows` rows of `wire.back_stride`; the native format
    /// writes them over the staged rows, which the FP8 format's shorter
    /// rows cannot hold), and the view's codes (`recv_rows × hidden`) and
    /// scales (`recv_rows × scales_per_token`).
    pub(super) fp8: Option<Fp8Buffers>,
    /// The arrival flags, the epoch word and the device path's placement
    /// counters (see [`MoeAllToAll::arrivals`]).
    pub(super) arrivals: SymmetricBuffer<u64>,
    /// The decode form's buffers, where the configuration fits its kernels
    /// (see `moe/device.rs`).
    pub(super) decode: Option<DecodeBuffers>,
    /// The form of the last device dispatch, which its combine takes:
    /// [`LAST_NONE`], [`LAST_EXCHANGE`] or [`LAST_DECODE`].
    pub(super) last_form: AtomicU8,
    /// The host backend's layout of the last `dispatch_on_device`.
    last: Mutex<Option<Layout>>,
    /// The node-aware form's rails (see `nodes.rs`); `None` in the flat
    /// form, where `send`, `stage` and their splits carry the only
    /// exchange, over the world. In the node-aware form they carry the
    /// node stage, over the node.
    pub(super) rails: Option<Rails>,
}

/// An exchange of wire rows: input, output, splits, out splits/offsets.
pub(super) type WireBuffers<'a> = (SymSlice<'a, u8>, SymSlice<'a, u8>, SymSlice<'a, i64>, SymSlice<'a, i64>);

/// [`MoeAllToAll::last_form`]: no device dispatch yet, the exchange
/// form's, the decode form's.
pub(super) const LAST_NONE: u8 = 0;
pub(super) const LAST_EXCHANGE: u8 = 1;
pub(super) const LAST_DECODE: u8 = 2;

/// The decode form's buffers: its words (the operation counter, the
/// blocks of every operation so far, and per PE the operation it began,
/// its blocks done and what it sent; zeroed),
/// and the view row of each slot of each staged row (`n × max_tokens ×
/// top_k`, which its combine reads).
pub(super) struct DecodeBuffers {
    pub(super) words: SymmetricBuffer<u64>,
    pub(super) views: SymmetricBuffer<i32>,
}

/// The buffers only the FP8 format needs (see [`MoeAllToAll`]'s fields).
pub(super) struct Fp8Buffers {
    pub(super) partials: SymmetricBuffer<u8>,
    pub(super) codes: SymmetricBuffer<fp8_e4m3>,
    pub(super) scales: SymmetricBuffer<f32>,
}

impl<T: Element> std::fmt::Debug for MoeAllToAll<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoeAllToAll").field("dtype", &T::DTYPE).field("config", &self.config).finish()
    }
}

/// `u32`s of the device path's counting scratch on `n` PEs: the flat
/// form's, or the largest of the node-aware form's stages (`shape`: nodes
/// and PEs a node): the rail's route (nodes as destinations of
/// `L × experts_per_pe` experts), the node's, and the receiver's, which
/// also keeps where each source's rows start and end; the flat form's
/// also the tables of its route over many blocks.
pub(super) fn scratch_len(c: &MoeConfig, n: usize, shape: Option<(usize, usize)>) -> usize {
    let route = |dests: usize, ne: usize| crate::gpu::kernels::ROUTE_THREADS * (dests + ne) + dests * ne;
    match shape {
        None => route(n, c.experts_per_pe).max(rank_scratch_len(c.max_tokens, c.experts_per_pe, n)),
        Some((nodes, l)) => route(nodes, l * c.experts_per_pe).max(route(n, c.experts_per_pe) + 2 * n),
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
        let shape = node_aware_shape(&team);
        let valid = config.check(n, T::DTYPE).and_then(|_| match shape {
            // The node stage's rows and slots, in the device's 32-bit fields.
            Some((nodes, per_node)) => {
                let fits = |x: Option<usize>| x.is_some_and(|x| x < i32::MAX as usize);
                let rows = config.node_send_rows(nodes, per_node);
                let bytes = rows.zip(Wire::of(&config, size_of::<T>())).and_then(|(r, w)| r.checked_mul(w.stride));
                let slots = config.rail_stage_rows(nodes).and_then(|r| r.checked_mul(config.top_k));
                if fits(rows) && fits(slots) && bytes.is_some() {
                    Ok(())
                } else {
                    Err(Error::Invalid(format!(
                        "MoeAllToAll::new: the buffers of {config:?} on {nodes} nodes overflow"
                    )))
                }
            }
            None => Ok(()),
        });
        let c = config;
        let mut desc = Desc::new(OpKind::MoeSetup);
        desc.dtype = Some(T::DTYPE);
        desc.args = [c.hidden, c.max_tokens, c.experts_per_pe, c.top_k, c.major_align].map(|x| x as u64);
        // The format rides the top bit of the alignment (far above any size).
        desc.args[4] |= u64::from(c.format == WireFormat::E4m3) << 63;
        // So does the form (every PE must take the same).
        desc.args[4] |= u64::from(shape.is_some()) << 62;
        let rows = team.exchange(&desc, valid.as_ref().err())?;
        valid?;
        team.agree(&rows)?;
        let wire = Wire::new::<T>(&c);
        let rows = |r: Option<usize>| r.expect("checked by MoeConfig::check");
        let entries = n * c.experts_per_pe;
        let rails = match shape {
            Some(s) => Some(Rails::new(ctx, &c, (wire.stride, wire.back_stride, wire.fp8), s)?),
            None => None,
        };
        // The node stage forwards each staged rail row to each PE of the node.
        let send_rows = match shape {
            Some((nodes, per_node)) => rows(c.node_send_rows(nodes, per_node)),
            None => rows(c.send_rows(n)),
        };
        let fp8 = if wire.fp8 {
            let recv = rows(c.recv_rows(n));
            Some(Fp8Buffers {
                partials: ctx.alloc(rows(c.stage_rows(n)) * wire.back_stride)?,
                codes: ctx.alloc(recv * c.hidden)?,
                scales: ctx.alloc(recv * c.scales_per_token())?,
            })
        } else {
            None
        };
        let decode = if shape.is_none() && decode_fits(c.max_tokens, c.top_k, c.experts_per_pe, n) {
            Some(DecodeBuffers {
                words: ctx.alloc_zeroed(decode_words(n, c.experts_per_pe))?,
                views: ctx.alloc(n * c.max_tokens * c.top_k)?,
            })
        } else {
            None
        };
        Ok(MoeAllToAll {
            send: ctx.alloc(send_rows * wire.stride.max(wire.back_stride))?,
            stage: ctx.alloc(rows(c.stage_rows(n)) * wire.stride)?,
            recv: ctx.alloc(rows(c.recv_rows(n)) * c.hidden)?,
            send_splits: ctx.alloc(n)?,
            stage_so: ctx.alloc(2 * n)?,
            back_so: ctx.alloc(2 * n)?,
            dispatch_splits: ctx.alloc(2 * entries)?,
            slot_rows: ctx.alloc(c.max_tokens * c.top_k)?,
            state: ctx.alloc(2)?,
            scratch: ctx.alloc_zeroed(scratch_len(&c, n, shape))?,
            arrivals: ctx.alloc_zeroed(super::arrivals::arrival_words(c.experts_per_pe, n))?,
            decode,
            last_form: AtomicU8::new(LAST_NONE),
            last: Mutex::new(None),
            rails,
            fp8,
            wire,
            team,
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> MoeConfig {
        self.config
    }

    /// Bytes of symmetric memory this exchange holds on each PE: the sum of
    /// the buffers [`MoeAllToAll::new`] allocated.
    ///
    /// The bulk is three buffers, each as large as the largest dispatch
    /// needs: the wire rows out (`max_tokens × min(top_k, n_pes)`), the
    /// wire rows in (`max_tokens × n_pes`) and the dispatched view (every
    /// staged token in up to `min(top_k, experts_per_pe)` blocks, plus each
    /// block's padding). The rest (splits, the device path's slot map and
    /// counting scratch, the arrival flags, the decode form's words and
    /// each staged slot's view row) is small: for rows of a few
    /// hundred elements or more the total stays within twice the bytes the
    /// largest dispatch sends, receives and returns as its view.
    pub fn memory_bytes(&self) -> usize {
        let i64s =
            self.send_splits.len + self.stage_so.len + self.back_so.len + self.dispatch_splits.len + self.state.len;
        let fp8 = self.fp8.as_ref().map_or(0, |f| f.partials.len + f.codes.len + f.scales.len * size_of::<f32>());
        let decode =
            self.decode.as_ref().map_or(0, |d| d.words.len * size_of::<u64>() + d.views.len * size_of::<i32>());
        self.send.len
            + self.stage.len
            + self.recv.len * size_of::<T>()
            + (i64s + self.slot_rows.len + self.arrivals.len) * size_of::<i64>()
            + self.scratch.len * size_of::<u32>()
            + fp8
            + decode
            + self.rails.as_ref().map_or(0, Rails::memory_bytes)
    }

    /// Whether this exchange takes the node-aware form, where a token
    /// crosses the network at most once per destination node (see
    /// [`MoeAllToAll`]): chosen at construction, as the node-aware
    /// collectives choose ([`crate::AcrossNodes`]).
    pub fn node_aware(&self) -> bool {
        self.rails.is_some()
    }

    /// Members of the team of the exchange that stages the rows the view
    /// is made of: the world, or in the node-aware form the node.
    pub(super) fn stage_members(&self) -> usize {
        self.rails.as_ref().map_or(self.team.n_pes(), |r| r.per_node)
    }

    /// The combine's exchange: the partials (the staged rows in the native
    /// format) back into `send`.
    pub(super) fn back_buffers(&self) -> WireBuffers<'_> {
        let partials = self.fp8.as_ref().map_or(&self.stage, |f| &f.partials);
        let send =
            self.send.slice(0..self.send.len / self.wire.stride.max(self.wire.back_stride) * self.wire.back_stride);
        let m = self.stage_members();
        (partials.into(), send, self.stage_so.slice(0..m), self.back_so.slice(0..2 * m))
    }

    /// The dispatch's exchange: wire rows from `send` into `stage`.
    pub(super) fn out_buffers(&self) -> WireBuffers<'_> {
        let send = self.send.slice(0..self.send.len / self.wire.stride.max(self.wire.back_stride) * self.wire.stride);
        let m = self.stage_members();
        (send, (&self.stage).into(), self.send_splits.slice(0..m), self.stage_so.slice(0..2 * m))
    }

    /// Sends each token once to each PE that holds one of its experts and
    /// returns what this PE received, grouped by local expert, as a view of
    /// the receive buffer (valid until the next dispatch), with its
    /// [`Layout`].
    ///
    /// `tokens` holds `n_tokens ≤ max_tokens` rows of `hidden` elements;
    /// `topk_expert_ids[t × top_k + j]` is the global expert of token `t`'s
    /// slot `j` (a token's experts distinct), `topk_weights[t × top_k + j]`
    /// its weight (finite), which travels with the token for the combine.
    /// In the view, local expert `e`'s rows are [`Layout::expert_rows`]:
    /// the tokens from every source PE in PE order, each source's in token
    /// order, with `major_align` padding after each expert (as
    /// `all_to_all_v_2d` lays them out); a token routed to several local
    /// experts is in each of their blocks, but crossed the link once.
    ///
    /// # Errors
    /// An expert id out of range or repeated within a token's top-k, more
    /// tokens than `max_tokens`, a weight that is NaN or infinite
    /// ([`Error::BadRouting`]), or sizes that do not fit the configuration:
    /// the error on this PE, and on the others a collective mismatch that
    /// names this PE and the fault; nothing is sent or written.
    ///
    /// # Collective
    /// Every PE calls it (with its own tokens).
    pub fn dispatch(
        &self,
        tokens: &[T],
        topk_expert_ids: &[i64],
        topk_weights: &[f32],
        stream: &Stream,
    ) -> Result<(SymSlice<'_, T>, Layout)> {
        let r = self.dispatch_host(HostTokens::Plain(tokens), topk_expert_ids, topk_weights, true, stream);
        let layout = self.team.ctx.report(r)?;
        Ok((self.recv.slice(0..layout.rows * self.config.hidden), layout))
    }

    /// The dispatch on the host: route, fill and exchange the wire rows,
    /// expand them into the view (in the FP8 format: the codes and scales,
    /// and the bf16 values where `dequantize`).
    pub(super) fn dispatch_host(
        &self,
        tokens: HostTokens<'_, T>,
        ids: &[i64],
        weights: &[f32],
        dequantize: bool,
        stream: &Stream,
    ) -> Result<Layout> {
        let (c, stride) = (&self.config, self.wire.stride);
        let n_tokens = ids.len() / c.top_k;
        if let Some(r) = &self.rails {
            // Rail rows to each node, the forwarders' node rows, the view.
            let group = c.experts_per_pe * r.per_node;
            let route = self.route(&tokens, ids, weights, group);
            let pre = match &route {
                Ok(rt) => {
                    let to = (&r.send, (&r.splits).into());
                    self.fill_send(&tokens, ids, weights, rt, (group, Some(self.team.my_pe())), to, stream)
                }
                Err(e) => Err(clone_error(e)),
            };
            self.agree_world(OpKind::MoeDispatch, pre, true, stream)?;
            let route = route.expect("the agreement fails on a PE whose routing failed");
            let covered = || Agreement::Covered { skip_if: None };
            r.rail.all_to_all_v_any(OpKind::AllToAllV, self.rail_out_buffers(), stride, 0, covered(), stream)?;
            let forward = self.forward_host(stream)?;
            r.node.all_to_all_v_any(OpKind::AllToAllV, self.out_buffers(), stride, 0, covered(), stream)?;
            return self.expand(route, Some(forward), n_tokens, dequantize, stream);
        }
        let route = self.route(&tokens, ids, weights, c.experts_per_pe);
        let pre = match &route {
            Ok(r) => {
                let to = (&self.send, (&self.send_splits).into());
                self.fill_send(&tokens, ids, weights, r, (c.experts_per_pe, None), to, stream)
            }
            Err(e) => Err(clone_error(e)),
        };
        // Waited for: the view is expanded on the host at once.
        let own = Agreement::Own { pre, wait: true };
        self.team.all_to_all_v_any(OpKind::AllToAllV, self.out_buffers(), stride, 0, own, stream)?;
        let route = route.expect("the exchange fails on a PE whose routing failed");
        self.expand(route, None, n_tokens, dequantize, stream)
    }

    /// [`MoeAllToAll::dispatch`] with everything on the device, so that it
    /// can be captured in a CUDA graph: `tokens` holds `max_tokens` rows,
    /// `topk_expert_ids` and `topk_weights` `max_tokens × top_k` entries,
    /// and `n_tokens` one count, all read on the device when the operation
    /// runs. Returns the whole receive buffer; [`MoeAllToAll::device_layout`]
    /// says where each expert's rows lie in it. Pair with
    /// [`MoeAllToAll::combine_on_device`], which takes the weights and the
    /// token count from this dispatch.
    ///
    /// # Errors
    /// Buffers too small for the configuration: the error on this PE at
    /// once, and on the others a collective mismatch that names this PE and
    /// the reason (on the GPU backend, which agrees on an eager call on the
    /// device, from the first call that can see it once the call has run:
    /// see [`crate::Team`]; nothing is sent or written); so do PEs whose
    /// calls differ. A bad routing (as for [`MoeAllToAll::dispatch`]): on
    /// the host backend at once, as `dispatch` reports it; on the GPU
    /// backend it is found on the device: nothing is sent or written, and
    /// the first call that can see it (a `copy_to_host` of the view, the
    /// next collective, RMA or MoE call, [`Context::check_device`]) fails
    /// on every PE, naming the PE and the fault.
    ///
    /// # Collective
    /// Every PE calls it.
    pub fn dispatch_on_device<'a, 'b, 'c, 'd>(
        &self,
        tokens: impl Into<SymSlice<'a, T>>,
        topk_expert_ids: impl Into<SymSlice<'b, i64>>,
        topk_weights: impl Into<SymSlice<'c, f32>>,
        n_tokens: impl Into<SymSlice<'d, i64>>,
        stream: &Stream,
    ) -> Result<SymSlice<'_, T>> {
        let (tokens, ids, weights, count) =
            (tokens.into(), topk_expert_ids.into(), topk_weights.into(), n_tokens.into());
        let r = self.dispatch_device(DeviceTokens::Plain(tokens), ids, weights, count, true, stream);
        self.team.ctx.report(r)?;
        Ok((&self.recv).into())
    }

    /// The dispatch on the device (the host backend: the host path on the
    /// buffers' contents).
    pub(super) fn dispatch_device(
        &self,
        tokens: DeviceTokens<'_, T>,
        ids: SymSlice<'_, i64>,
        weights: SymSlice<'_, f32>,
        count: SymSlice<'_, i64>,
        dequantize: bool,
        stream: &Stream,
    ) -> Result<()> {
        let c = self.config;
        let (h, g, slots) = (c.hidden, c.scales_per_token(), c.max_tokens * c.top_k);
        let mut sizes = vec![
            ("topk_expert_ids", ids.len(), slots, "max_tokens × top_k"),
            ("topk_weights", weights.len(), slots, "max_tokens × top_k"),
            ("n_tokens", count.len(), 1, "one count"),
        ];
        match &tokens {
            DeviceTokens::Plain(t) => sizes.insert(0, ("tokens", t.len(), c.max_tokens * h, "max_tokens × hidden")),
            DeviceTokens::Codes(q, sc) => {
                sizes.insert(0, ("codes", q.len(), c.max_tokens * h, "max_tokens × hidden"));
                sizes.insert(1, ("scales", sc.len(), c.max_tokens * g, "max_tokens × scales_per_token"));
            }
        }
        let pre = self.check_sizes(&sizes);
        if let Some(gpu) = self.team.ctx.backend.gpu() {
            return self.dispatch_gpu(gpu, pre, tokens, ids, weights, count, dequantize, stream);
        }
        let n = match pre.and_then(|_| self.host_count(count, stream)) {
            Ok(n) => n,
            Err(e) => return Err(self.fail_all(e, OpKind::MoeDispatch, self.out_buffers(), self.wire.stride, stream)),
        };
        let host_ids = head(&ids, n * c.top_k).read(stream)?;
        let host_weights = head(&weights, n * c.top_k).read(stream)?;
        let layout = match tokens {
            DeviceTokens::Plain(t) => {
                let t = head(&t, n * h).read(stream)?;
                self.dispatch_host(HostTokens::Plain(&t), &host_ids, &host_weights, dequantize, stream)?
            }
            DeviceTokens::Codes(q, sc) => {
                let (q, sc) = (head(&q, n * h).read(stream)?, head(&sc, n * g).read(stream)?);
                self.dispatch_host(HostTokens::Codes(&q, &sc), &host_ids, &host_weights, dequantize, stream)?
            }
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(layout);
        Ok(())
    }

    /// The last dispatch's view layout, on the device: entry
    /// `e × n_pes + src` of row 0 is how many of PE `src`'s tokens local
    /// expert `e` received, of row 1 where those rows start in the
    /// dispatched view (see [`Layout::splits`] and [`Layout::offsets`]).
    pub fn device_layout(&self) -> SymSlice<'_, i64> {
        (&self.dispatch_splits).into()
    }

    /// The receive buffer the dispatches lay their view out in: what
    /// [`MoeAllToAll::dispatch_on_device`] returns, as the last dispatch
    /// left it.
    pub fn device_view(&self) -> SymSlice<'_, T> {
        (&self.recv).into()
    }

    /// `e`, after failing the agreement the other PEs enter (the flat
    /// form's exchange over `buffers`, the node-aware form's agreement on
    /// the layer's call `kind`) so that they fail too, naming this PE.
    pub(super) fn fail_all(
        &self,
        e: Error,
        kind: OpKind,
        buffers: WireBuffers<'_>,
        stride: usize,
        stream: &Stream,
    ) -> Error {
        let failed = if self.rails.is_some() {
            self.agree_world(kind, Err(e), false, stream).map(drop)
        } else {
            self.team.all_to_all_v_any(OpKind::AllToAllV, buffers, stride, 0, Agreement::own(Err(e)), stream)
        };
        failed.err().unwrap_or_else(|| Error::Invalid("MoeAllToAll: a failed call's exchange succeeded".into()))
    }

    /// `Ok` when every buffer holds at least what the configuration needs.
    pub(super) fn check_sizes(&self, sizes: &[(&str, usize, usize, &str)]) -> Result<()> {
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
        let n = count.buf.slice(count.start..count.start + 1).read(stream)?[0];
        usize::try_from(n).ok().filter(|&n| n <= self.config.max_tokens).ok_or_else(|| Error::BadRouting {
            fault: RoutingFault::TooManyTokens,
            detail: format!("MoeAllToAll::dispatch_on_device: n_tokens is {n}, not in 0..={}", self.config.max_tokens),
        })
    }
}

/// A dispatch's tokens on the host.
pub(super) enum HostTokens<'a, T> {
    /// Rows of the exchange's elements.
    Plain(&'a [T]),
    /// e4m3 codes and their scales (the FP8 format).
    Codes(&'a [fp8_e4m3], &'a [f32]),
}

impl<T> HostTokens<'_, T> {
    /// Elements (codes) of the tokens.
    pub(super) fn len(&self) -> usize {
        match self {
            HostTokens::Plain(x) => x.len(),
            HostTokens::Codes(q, _) => q.len(),
        }
    }
}

/// A dispatch's tokens in device buffers.
pub(super) enum DeviceTokens<'a, T: Element> {
    /// Rows of the exchange's elements.
    Plain(SymSlice<'a, T>),
    /// e4m3 codes and their scales (the FP8 format).
    Codes(SymSlice<'a, fp8_e4m3>, SymSlice<'a, f32>),
}

/// `xs` as a slice of `B`, which is `A`: the FP8 format is for bf16
/// exchanges only (checked at construction), where the generic code meets
/// the quantizer's bf16.
pub(super) fn same_type<A: Element, B: Element>(xs: &[A]) -> &[B] {
    assert_eq!(A::DTYPE, B::DTYPE, "the FP8 format is for bf16 exchanges");
    // SAFETY: A and B are the same type (an Element's DTYPE names its
    // type, checked just above), so the cast changes nothing.
    unsafe { std::slice::from_raw_parts(xs.as_ptr().cast::<B>(), xs.len()) }
}

/// The first `len` elements of `s`.
fn head<'a, E: Element>(s: &SymSlice<'a, E>, len: usize) -> SymSlice<'a, E> {
    s.buf.slice(s.start..s.start + len)
}

/// Bytes of wire rows above which the host fills them in parallel.
pub(super) const PARALLEL_BYTES: usize = 1 << 17;

/// A copy of a routing error, for the exchange (which reports it) while
/// the routing result is kept.
fn clone_error(e: &Error) -> Error {
    match e {
        Error::BadRouting { fault, detail } => Error::BadRouting { fault: *fault, detail: detail.clone() },
        Error::LengthMismatch(m) => Error::LengthMismatch(m.clone()),
        other => Error::Invalid(other.to_string()),
    }
}

impl<T: CombineElement> MoeAllToAll<T> {
    /// [`MoeAllToAll::combine`] with everything on the device, after
    /// [`MoeAllToAll::dispatch_on_device`] (capturable in a CUDA graph with
    /// it): `expert_outputs` has the dispatched layout and holds at least
    /// as many rows as the whole receive buffer (the dispatch's returned
    /// view, written in place, does); the weights and the token count are
    /// the dispatch's. `out` (at least `max_tokens` rows) gets each token's
    /// result (see [`MoeAllToAll`] for the exact sum), in token order; the
    /// rows past the token count are not written.
    ///
    /// On the GPU, where every PE is reached over NVLink and the
    /// configuration fits the decode form (up to 256 tokens a PE), the
    /// combine is one kernel whose blocks wait for one another and for the
    /// other PEs'; from 32 tokens a PE (`max_tokens`) it takes a block on
    /// every SM (up to 128; the dispatch on at most half, leaving the rest
    /// to kernels that wait on its arrivals). A kernel on another stream
    /// that holds SMs until something after the combine happens would
    /// stall it. On the world team, where no GPU is shared and the rows
    /// for the team's `n × max_tokens` tokens are small (by default up to
    /// 2 MiB for the combine's partials, 512 KiB for the dispatch's rows,
    /// [`crate::Tuning::moe_layer_lines_max_bytes`]), the rows go in the
    /// low-latency protocol's 128-byte lines, which share its buffers and
    /// epochs with the low-latency collectives.
    ///
    /// # Errors
    /// Buffers too small for the configuration; on the host backend, no
    /// `dispatch_on_device` before: reported as
    /// [`MoeAllToAll::dispatch_on_device`] reports them. After a dispatch
    /// that failed on the device, nothing is written, and the failure is
    /// reported as the dispatch says.
    ///
    /// # Collective
    /// Every PE calls it.
    pub fn combine_on_device<'a, 'b>(
        &self,
        expert_outputs: impl Into<SymSlice<'a, T>>,
        out: impl Into<SymSlice<'b, T>>,
        stream: &Stream,
    ) -> Result<()> {
        let r = self.combine_device(expert_outputs.into(), out.into(), stream);
        self.team.ctx.report(r)
    }

    /// [`MoeAllToAll::combine_on_device`], leaving an earlier failure the
    /// device found for the caller to report.
    fn combine_device(&self, outputs: SymSlice<'_, T>, out: SymSlice<'_, T>, stream: &Stream) -> Result<()> {
        let c = self.config;
        let pre = self.check_sizes(&[
            ("expert_outputs", outputs.len(), self.recv.len, "the receive buffer's rows × hidden"),
            ("out", out.len(), c.max_tokens * c.hidden, "max_tokens × hidden"),
        ]);
        if let Some(g) = self.team.ctx.backend.gpu() {
            return self.combine_gpu(g, pre, outputs, out, stream);
        }
        let layout = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let pre = pre.and_then(|_| {
            layout
                .ok_or_else(|| Error::Invalid("MoeAllToAll::combine_on_device: no dispatch_on_device before it".into()))
        });
        let layout = match pre {
            Ok(l) => l,
            Err(e) => {
                return Err(self.fail_all(e, OpKind::MoeCombine, self.back_buffers(), self.wire.back_stride, stream))
            }
        };
        let sums = self.combine_host(outputs, &layout, stream)?;
        out.buf.slice(out.start..out.start + sums.len()).copy_from_host(&sums, stream)
    }

    /// Weighs and sums each received token's local experts' outputs, sends
    /// one row per (token, PE) back to the PEs that dispatched them, and
    /// returns, for each of this PE's tokens in its original order, the sum
    /// of those rows: `Σ_j topk_weights[t × top_k + j] × output(t, j)`,
    /// computed exactly as the [type's docs](MoeAllToAll) define it.
    ///
    /// `expert_outputs` has the dispatched layout: each token's output where
    /// the dispatch put the token, in the block of each of its experts. It
    /// is the dispatched view itself, written in place, or a slice of
    /// another buffer holding at least [`Layout::rows`] rows; only the rows
    /// of tokens are read, not the padding.
    ///
    /// # Errors
    /// A layout of another configuration, or too few expert outputs: the
    /// error on this PE, a collective mismatch on the others; layouts of
    /// different dispatches on different PEs: an error where it shows.
    ///
    /// # Collective
    /// Every PE calls it, with the layout of the same dispatch.
    pub fn combine<'a>(
        &self,
        expert_outputs: impl Into<SymSlice<'a, T>>,
        layout: &Layout,
        stream: &Stream,
    ) -> Result<Vec<T>> {
        let r = self.combine_host(expert_outputs.into(), layout, stream);
        self.team.ctx.report(r)
    }

    /// [`MoeAllToAll::combine`], leaving an earlier failure the device
    /// found for the caller to report.
    fn combine_host(&self, outputs: SymSlice<'_, T>, layout: &Layout, stream: &Stream) -> Result<Vec<T>> {
        let (c, w, n) = (&self.config, self.wire, self.team.n_pes());
        let h = c.hidden;
        let pre = if layout.config != *c || layout.n_pes != n || layout.forward.is_some() != self.rails.is_some() {
            Err(Error::Invalid(format!(
                "MoeAllToAll::combine: the layout is of a dispatch with {:?} on {} PEs{}, this exchange has {c:?} on \
                 {n} PEs{}",
                layout.config,
                layout.n_pes,
                if layout.forward.is_some() { " (node-aware)" } else { "" },
                if self.rails.is_some() { " (node-aware)" } else { "" },
            )))
        } else if outputs.len() < layout.rows * h {
            Err(Error::LengthMismatch(format!(
                "MoeAllToAll::combine: expert_outputs has {} elements, the layout needs {} rows of {h}",
                outputs.len(),
                layout.rows,
            )))
        } else {
            self.expert_partials(outputs, layout, stream)
        };
        let partials = if self.rails.is_some() {
            self.agree_world(OpKind::MoeCombine, pre, true, stream)?;
            self.combine_nodes_host(layout, stream)?
        } else {
            // Waited for: what came back is read on the host at once.
            let own = Agreement::Own { pre, wait: true };
            self.team.all_to_all_v_any(OpKind::AllToAllV, self.back_buffers(), w.back_stride, 0, own, stream)?;
            // What came back must be what this PE sent: otherwise the PEs
            // combined layouts of different dispatches.
            let back = self.back_so.slice(0..n).read(stream)?;
            if back != layout.wire_sent {
                return Err(Error::CollectiveMismatch(format!(
                    "MoeAllToAll::combine: PE {} got back {back:?} rows from each PE but sent {:?}: the PEs passed \
                     layouts of different dispatches",
                    self.team.my_pe(),
                    layout.wire_sent
                )));
            }
            self.send.slice(0..layout.token_rows.len() * w.back_stride).read(stream)?
        };
        let mut out = crate::dtype::zeroed_vec::<T>(layout.n_tokens * h);
        let finish = |(t, token): (usize, &mut [T])| {
            let mut acc = vec![T::zero(); h];
            let mut row = crate::dtype::zeroed_vec::<T>(h);
            for &r in &layout.token_rows[layout.token_start[t]..layout.token_start[t + 1]] {
                read_elems(&partials[r * w.back_stride..(r + 1) * w.back_stride], &mut row);
                acc.iter_mut().zip(&row).for_each(|(a, &x)| *a = T::add(*a, x));
            }
            token.iter_mut().zip(acc).for_each(|(o, a)| *o = T::from_acc(a));
        };
        if out.len() < 1 << 15 {
            out.chunks_mut(h).enumerate().for_each(finish);
        } else {
            self.team.ctx.pool.install(|| out.par_chunks_mut(h).enumerate().for_each(finish));
        }
        Ok(out)
    }

    /// The expert side: each received token's weighted sum of its local
    /// experts' outputs, into its staged row, and the splits to send back.
    fn expert_partials(&self, outputs: SymSlice<'_, T>, layout: &Layout, stream: &Stream) -> Result<()> {
        let (c, w) = (&self.config, self.wire);
        let h = c.hidden;
        let rows = outputs.buf.slice(outputs.start..outputs.start + layout.rows * h).read(stream)?;
        let mut bytes = vec![0u8; layout.arrivals.len() * w.back_stride];
        // Each staged row's received token (the partials go back in staging order).
        let mut token_of = vec![0; layout.staged_at.len()];
        layout.staged_at.iter().enumerate().for_each(|(i, &at)| token_of[at] = i);
        let weigh = |(at, out): (usize, &mut [u8])| {
            let mut acc = vec![T::zero(); h];
            for (_, r, weight) in layout.placements(token_of[at]) {
                acc.iter_mut().zip(&rows[r * h..(r + 1) * h]).for_each(|(a, &x)| *a = T::weigh(*a, weight, x));
            }
            let partial: Vec<T> = acc.into_iter().map(T::from_acc).collect();
            out[..h * size_of::<T>()].copy_from_slice(bytes_of(&partial));
        };
        if bytes.len() < PARALLEL_BYTES {
            bytes.chunks_mut(w.back_stride).enumerate().for_each(weigh);
        } else {
            self.team.ctx.pool.install(|| bytes.par_chunks_mut(w.back_stride).enumerate().for_each(weigh));
        }
        self.back_buffers().0.buf.slice(0..bytes.len()).copy_from_host(&bytes, stream)?;
        debug_assert_eq!(layout.received.len(), self.stage_members());
        self.stage_so.slice(0..layout.received.len()).copy_from_host(&layout.received, stream)
    }
}
