//! Mixture-of-Experts all-to-all-v: the semantics of PyTorch's
//! `torch.ops.symm_mem.all_to_all_vdev`, `all_to_all_vdev_2d` and
//! `all_to_all_vdev_2d_offset`, and [`MoeAllToAll`] (dispatch by top-k
//! expert ids, combine with weights) on top of them.
//!
//! Data moves in *rows* of `row_len` elements (a token's hidden vector);
//! splits and offsets count rows and live in symmetric `i64` buffers, as
//! PyTorch keeps them on the device. Each PE's `in_splits` is the only
//! routing information; the operation writes `out_splits_offsets` (row 0:
//! splits, row 1: offsets), so no PE needs to know beforehand what it
//! receives.
//!
//! # `all_to_all_v` (1D)
//!
//! `in_splits[j]` rows, packed in PE order, go to PE `j`; each PE receives
//! them packed in source order. 3 PEs, `a`/`b`/`c` the rows of PE 0/1/2:
//!
//! ```text
//! input   PE 0: | a→0 | a→1 | a→2 |     in_splits PE 0: [2, 1, 0]
//!         PE 1: | b→0 | b→1 | b→2 |     in_splits PE 1: [1, 0, 3]
//!         PE 2: | c→0 | c→1 | c→2 |     in_splits PE 2: [0, 2, 1]
//!
//! output  PE 0: | a→0 | b→0 | c→0 |     out splits [2, 1, 0], offsets [0, 2, 3]
//!         PE 1: | a→1 | b→1 | c→1 |     out splits [1, 0, 2], offsets [0, 1, 1]
//!         PE 2: | a→2 | b→2 | c→2 |     out splits [0, 3, 1], offsets [0, 0, 3]
//! ```
//!
//! # `all_to_all_v_2d` (dispatch)
//!
//! With `ne` experts per PE (`in_splits` has `n_pes × ne` entries), the
//! input is *rank-major*: for each destination PE, its experts in order.
//! The output on each PE is *expert-major*: for each of its experts, the
//! chunks from every source PE in PE order. 2 PEs, 2 experts each (global
//! experts 0..4; `cX` from PE 0, `dX` from PE 1, `X` the global expert):
//!
//! ```text
//! input   PE 0: | c0 | c1 | c2 | c3 |        PE 1: | d0 | d1 | d2 | d3 |
//!                 \___PE 0__/ \__PE 1__/
//! output  PE 0: | c0 d0 ·pad· | c1 d1 ·pad· |     (local experts 0, 1)
//!         PE 1: | c2 d2 ·pad· | c3 d3 ·pad· |
//!                 ^ expert block starts at a multiple of major_align
//! ```
//!
//! `out_splits_offsets` is expert-major too: entry `e × n_pes + src` holds
//! the rows of chunk (local expert `e`, source `src`) and where it starts in
//! the output. Each expert's block is `max(round_up(rows, major_align),
//! major_align)` rows long, so an expert that receives nothing still takes
//! `major_align` rows (PyTorch does this because grouped GEMMs reject empty
//! groups) — with `major_align = 1` too. Padding rows are never written.
//!
//! # `all_to_all_v_2d_offset` (combine)
//!
//! The reverse: the input is expert-major as the dispatch left it, chunk
//! `e × n_pes + dst` at row offset `in_splits_offsets[1][…]` with
//! `in_splits_offsets[0][…]` rows (padding between chunks is allowed and
//! never sent); the output is rank-major and packed, entry `src × ne + e`,
//! which puts every row back where the dispatch took it from:
//!
//! ```text
//! input   PE 0: | c0' d0' ·pad· | c1' d1' ·pad· |    PE 1: | c2' d2' ·pad· | c3' d3' ·pad· |
//! output  PE 0: | c0' | c1' | c2' | c3' |             PE 1: | d0' | d1' | d2' | d3' |
//! ```
//!
//! # Checks
//!
//! First the PEs agree on the call: each PE's descriptor (the operation,
//! the element type, its buffers' heap offsets and a hash of their sizes,
//! `row_len` and `major_align`) must equal every other's, and no PE's own
//! arguments may have failed its checks. On the host backend this is an
//! exchange before the call returns. On the GPU backend an eager call
//! agrees on the device, with no host round trip (across nodes, no network
//! round trip on the host): the descriptor travels with the first kernel,
//! which compares every PE's. Where they differ, every PE's kernels skip
//! the call and write nothing, and on each PE the first call that can see
//! it (see [`Team`]: a `copy_to_host`, [`Stream::synchronize`], the next
//! collective, RMA or MoE call) reports an [`Error::CollectiveMismatch`]
//! naming the calls; a PE
//! whose own arguments failed returns its error at once, and the others'
//! mismatch names it and the reason. A call captured in a CUDA graph is
//! checked on each PE only.
//!
//! Then, every PE can read every peer's splits (they are symmetric), so
//! each PE validates the *whole* exchange — negative splits, offsets that
//! are negative, overlap or run backwards, chunks beyond a PE's input,
//! outputs too small for what a PE would receive — in the same order,
//! reaches the same verdict, and fails before anything is written (on the
//! GPU backend on the device: the failure is reported as a mismatch is).
//! PyTorch checks less (a negative split or
//! a short input trips a device assert; an output overflow is not
//! checked).

use crate::buffer::{Region, SymSlice};
use crate::context::{Context, Stream};
use crate::control::op::{invalid, mismatch};
use crate::desc::AllToAllV as Call;
use crate::dtype::Element;
use crate::error::{Error, Result, RoutingFault};
use crate::gpu::a2av::{a2av_kind, Launch};
use crate::gpu::abi::{
    A2AV_NEGATIVE_OFFSET, A2AV_NEGATIVE_SPLIT, A2AV_OFFSET_BACKWARDS, A2AV_PAST_INPUT, ROUTE_BAD, ROUTE_BAD_WEIGHT,
    ROUTE_EXPERT_OUT_OF_RANGE, ROUTE_FAULT_SHIFT, ROUTE_REPEATED_EXPERT,
};
use crate::gpu::kernels::{DeviceCheckFailure, Kernels};
use crate::team::{Desc, OpKind, Team};

mod arrivals;
mod device;
mod fp8;
mod layer;
mod nodes;
mod route;
mod wire;
pub use arrivals::{Arrivals, DeviceMoeArrivals};
pub use fp8::{Fp8DeviceTokens, Fp8Out, Fp8Tokens, Fp8View};
pub use layer::{CombineElement, Layout, MoeAllToAll, MoeConfig, WireFormat};

/// How the PEs of an all-to-all-v call's team agree on it.
pub(crate) enum Agreement {
    /// The call agrees by itself: on the host backend in an exchange, on
    /// the GPU backend (eagerly) in its first kernel. `pre` is this PE's
    /// own verdict on its arguments (the MoE layer's checks), carried into
    /// the agreement so that a bad call on one PE fails on every PE. With
    /// `wait`, the GPU backend waits for the kernels and fails the call
    /// itself where its agreement failed (for callers that read what it
    /// wrote on the host at once).
    Own { pre: Result<()>, wait: bool },
    /// A caller's agreement covers the call (the node-aware MoE layer's,
    /// over the world): the GPU backend adds none, and its kernels skip
    /// the call where the word at heap offset `skip_if` says that
    /// agreement failed. The call's own checks must then fail on every PE
    /// alike (they see what the caller agreed on).
    Covered { skip_if: Option<usize> },
}

impl Agreement {
    /// The call's own agreement, its result reported by the next
    /// synchronisation on the GPU backend.
    pub(crate) fn own(pre: Result<()>) -> Agreement {
        Agreement::Own { pre, wait: false }
    }
}

/// Byte range of `r` with elements of `elem` bytes.
fn bytes(r: Region, elem: usize) -> (usize, usize) {
    (r.offset, r.offset + r.len * elem)
}

fn overlap(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1 && a.0 < a.1 && b.0 < b.1
}

/// The error of a failed device-side check (see `kernels/moe/a2av.cuh`).
pub(crate) fn device_check_error(f: DeviceCheckFailure) -> Error {
    let kind = [OpKind::AllToAllV, OpKind::AllToAllV2d, OpKind::AllToAllV2dOffset]
        .get(f.kind as usize)
        .copied()
        .unwrap_or(OpKind::AllToAllV);
    let (pe, i, v, limit) = (f.pe, f.index, f.value, f.limit);
    let what = match f.class {
        A2AV_NEGATIVE_SPLIT if i == 0 && v == ROUTE_BAD => format!(
            "MoeAllToAll::dispatch_on_device: PE {pe} had {} (its token count is negative or above max_tokens)",
            RoutingFault::TooManyTokens.describe()
        ),
        A2AV_NEGATIVE_SPLIT if i == 0 && (ROUTE_BAD - (3 << ROUTE_FAULT_SHIFT)..ROUTE_BAD).contains(&v) => {
            let code = ROUTE_BAD - v;
            let fault = match code >> ROUTE_FAULT_SHIFT {
                ROUTE_EXPERT_OUT_OF_RANGE => RoutingFault::ExpertOutOfRange,
                ROUTE_REPEATED_EXPERT => RoutingFault::RepeatedExpert,
                ROUTE_BAD_WEIGHT => RoutingFault::NonFiniteWeight,
                _ => RoutingFault::NonFiniteWeight,
            };
            format!(
                "MoeAllToAll::dispatch_on_device: PE {pe} had {}, at (token, slot) pair {} (token × top_k + slot)",
                fault.describe(),
                (code & ((1 << ROUTE_FAULT_SHIFT) - 1)) - 1
            )
        }
        A2AV_NEGATIVE_SPLIT => format!("PE {pe}'s split {i} is negative ({v})"),
        A2AV_NEGATIVE_OFFSET => format!("PE {pe}'s offset {i} is negative ({v})"),
        A2AV_OFFSET_BACKWARDS => format!(
            "PE {pe}'s offset {i} ({v}) starts before the end of its previous chunk: offsets must be ascending and \
             chunks must not overlap"
        ),
        A2AV_PAST_INPUT => format!("PE {pe}'s chunk {i} ({v} rows) runs past its input of {limit} rows"),
        _ => {
            let padding = if kind == OpKind::AllToAllV2d { " (with major_align padding)" } else { "" };
            format!("PE {pe} would receive {v} rows{padding}, but its output holds {limit} rows")
        }
    };
    let more =
        if f.count > 1 { format!(" ({} operations failed since the last check)", f.count) } else { String::new() };
    let msg = format!("checked on the device, nothing was written: {what}{more}");
    if f.class >= A2AV_PAST_INPUT {
        mismatch(kind, msg)
    } else {
        invalid(kind, msg)
    }
}

impl Team {
    /// `all_to_all_vdev`: sends `in_splits[j]` rows of `input` (packed in
    /// PE order) to PE `j`, which stores the rows from every PE packed in
    /// source order in `output`, and writes `out_splits_offsets`: row 0
    /// the rows received from each PE, row 1 where they start (an exclusive
    /// prefix sum). See the [module docs](crate::moe) for a picture.
    ///
    /// `in_splits` has `n_pes` entries, `out_splits_offsets` `2 × n_pes`;
    /// `input` and `output` hold whole rows of `row_len` elements.
    ///
    /// # Errors
    /// On every PE, with nothing written, when any PE's splits are negative,
    /// exceed its input, or would overflow a receiver's output, or when the
    /// sizes do not fit together, or the PEs' calls differ. On the GPU
    /// backend the splits are checked, and an eager call agreed on, on the
    /// device: the call returns, and the failure is reported later (see
    /// [Checks](crate::moe#checks)); a PE's own bad arguments fail its call
    /// at once.
    ///
    /// # Collective
    /// Every PE of the team calls it with the same buffers and `row_len`.
    pub fn all_to_all_v<'a, 'b, 'c, 'd, T: Element>(
        &self,
        input: impl Into<SymSlice<'a, T>>,
        output: impl Into<SymSlice<'b, T>>,
        in_splits: impl Into<SymSlice<'c, i64>>,
        out_splits_offsets: impl Into<SymSlice<'d, i64>>,
        row_len: usize,
        stream: &Stream,
    ) -> Result<()> {
        let args = (input.into(), output.into(), in_splits.into(), out_splits_offsets.into());
        let r = self.all_to_all_v_any(OpKind::AllToAllV, args, row_len, 0, Agreement::own(Ok(())), stream);
        self.ctx.report(r)
    }

    /// `all_to_all_vdev_2d`, the MoE dispatch: `in_splits` (`n_pes × ne`
    /// entries) splits `input` rank-major — for each destination PE, its
    /// `ne` experts in order — and each PE receives its experts' rows
    /// expert-major: for each local expert, the chunks of every source PE
    /// in PE order, each expert's block starting at a multiple of
    /// `major_align` rows and at least `major_align` rows long, even when
    /// empty (as PyTorch). `out_splits_offsets` (`2 × n_pes × ne`) gets the
    /// received splits and their row offsets, entry `e × n_pes + src`.
    /// See the [module docs](crate::moe) for a picture.
    ///
    /// # Errors
    /// As [`Team::all_to_all_v`]; padding counts towards the output's size.
    ///
    /// # Collective
    /// Every PE of the team calls it with the same buffers, `row_len` and
    /// `major_align`.
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v_2d<'a, 'b, 'c, 'd, T: Element>(
        &self,
        input: impl Into<SymSlice<'a, T>>,
        output: impl Into<SymSlice<'b, T>>,
        in_splits: impl Into<SymSlice<'c, i64>>,
        out_splits_offsets: impl Into<SymSlice<'d, i64>>,
        row_len: usize,
        major_align: usize,
        stream: &Stream,
    ) -> Result<()> {
        let args = (input.into(), output.into(), in_splits.into(), out_splits_offsets.into());
        let r = self.all_to_all_v_any(OpKind::AllToAllV2d, args, row_len, major_align, Agreement::own(Ok(())), stream);
        self.ctx.report(r)
    }

    /// `all_to_all_vdev_2d_offset`, the MoE combine: the reverse of
    /// [`Team::all_to_all_v_2d`]. `in_splits_offsets` (`2 × n_pes × ne`)
    /// gives each chunk of `input`, expert-major (entry `e × n_pes + dst`:
    /// rows of local expert `e` for PE `dst`), by its rows (row 0) and
    /// starting row (row 1); rows between chunks are padding and are not
    /// sent. Each PE receives rank-major, packed: entry `src × ne + e` of
    /// `out_splits_offsets` is what PE `src`'s expert `e` sent back, and
    /// where it starts. See the [module docs](crate::moe) for a picture.
    ///
    /// # Errors
    /// As [`Team::all_to_all_v`], and when any PE's offsets are negative or
    /// out of order (a chunk starting before the previous one ends).
    ///
    /// # Collective
    /// Every PE of the team calls it with the same buffers and `row_len`.
    pub fn all_to_all_v_2d_offset<'a, 'b, 'c, 'd, T: Element>(
        &self,
        input: impl Into<SymSlice<'a, T>>,
        output: impl Into<SymSlice<'b, T>>,
        in_splits_offsets: impl Into<SymSlice<'c, i64>>,
        out_splits_offsets: impl Into<SymSlice<'d, i64>>,
        row_len: usize,
        stream: &Stream,
    ) -> Result<()> {
        let args = (input.into(), output.into(), in_splits_offsets.into(), out_splits_offsets.into());
        let r = self.all_to_all_v_any(OpKind::AllToAllV2dOffset, args, row_len, 0, Agreement::own(Ok(())), stream);
        self.ctx.report(r)
    }

    /// The three operations, agreed as `agreement` says.
    pub(crate) fn all_to_all_v_any<T: Element>(
        &self,
        kind: OpKind,
        (input, output, splits, out_so): (SymSlice<'_, T>, SymSlice<'_, T>, SymSlice<'_, i64>, SymSlice<'_, i64>),
        row_len: usize,
        major_align: usize,
        agreement: Agreement,
        stream: &Stream,
    ) -> Result<()> {
        self.check()?;
        let n = self.n_pes();
        let (pre, wait, skip_if) = match agreement {
            Agreement::Own { pre, wait } => (Some(pre), wait, None),
            Agreement::Covered { skip_if } => (None, false, skip_if),
        };
        let own = pre.is_some();
        let local = pre.unwrap_or(Ok(())).and_then(|_| {
            let call = Call {
                kind,
                input: input.region(&self.ctx)?,
                output: output.region(&self.ctx)?,
                splits: splits.region(&self.ctx)?,
                out_splits_offsets: out_so.region(&self.ctx)?,
                row_len,
                major_align,
                entries: 0,
            };
            self.shape::<T>(call, n)
        });
        let mut desc = Desc::new(kind);
        desc.dtype = Some(T::DTYPE);
        if let Ok(c) = &local {
            let sizes = [c.input.len, c.output.len, c.splits.len, c.out_splits_offsets.len, row_len, major_align];
            let hash = sizes
                .iter()
                .fold(0x9e37_79b9_7f4a_7c15u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3).rotate_left(29));
            desc.args = [
                c.input.offset as u64,
                c.output.offset as u64,
                c.splits.offset as u64,
                c.out_splits_offsets.offset as u64,
                hash,
            ];
        }
        if let Some(host) = self.host() {
            let rows = self.exchange(&desc, local.as_ref().err())?;
            let call = local?;
            self.agree(&rows)?;
            return host.all_to_all_v::<T>(&call);
        }
        let row = |err: Option<&Error>| self.device_row(&desc, err);
        let on = stream.cuda_stream();
        let r = self.on_gpu(|t| t.all_to_all_v::<T>(local, Launch { own, wait, skip_if }, row, on));
        r.expect("the gpu backend, where not the host's")
    }

    /// Checks sizes and overlaps of this PE's arguments; fills `entries`.
    fn shape<T: Element>(&self, mut c: Call, n: usize) -> Result<Call> {
        let kind = c.kind;
        if c.row_len == 0 {
            return Err(invalid(kind, "row_len must be at least 1"));
        }
        if kind == OpKind::AllToAllV2d && c.major_align == 0 {
            return Err(invalid(kind, "major_align must be at least 1"));
        }
        for (name, r) in [("input", c.input), ("output", c.output)] {
            if r.len % c.row_len != 0 {
                return Err(mismatch(kind, format!("{name} has {} elements, not whole rows of {}", r.len, c.row_len)));
            }
        }
        let (so_len, splits_len) = (c.out_splits_offsets.len, c.splits.len);
        c.entries = match kind {
            OpKind::AllToAllV => {
                if splits_len != n {
                    return Err(mismatch(
                        kind,
                        format!("in_splits has {splits_len} entries, expected {n} (one per PE)"),
                    ));
                }
                n
            }
            OpKind::AllToAllV2d => {
                if splits_len == 0 || splits_len % n != 0 {
                    return Err(mismatch(
                        kind,
                        format!("in_splits has {splits_len} entries, expected n_pes ({n}) × experts per PE (≥ 1)"),
                    ));
                }
                splits_len
            }
            _ => {
                if splits_len == 0 || splits_len % (2 * n) != 0 {
                    return Err(mismatch(
                        kind,
                        format!(
                            "in_splits_offsets has {splits_len} entries, expected 2 × n_pes ({n}) × experts per PE \
                             (≥ 1)"
                        ),
                    ));
                }
                splits_len / 2
            }
        };
        if so_len != 2 * c.entries {
            return Err(mismatch(
                kind,
                format!("out_splits_offsets has {so_len} entries, expected 2 × {} (splits, then offsets)", c.entries),
            ));
        }
        let elem = size_of::<T>();
        let (input, output) = (bytes(c.input, elem), bytes(c.output, elem));
        let (splits, out_so) = (bytes(c.splits, 8), bytes(c.out_splits_offsets, 8));
        let clash = [
            (output, input, "output and input"),
            (output, splits, "output and the input splits"),
            (output, out_so, "output and out_splits_offsets"),
            (out_so, input, "out_splits_offsets and input"),
            (out_so, splits, "out_splits_offsets and the input splits"),
        ];
        if let Some((_, _, what)) = clash.iter().find(|(a, b, _)| overlap(*a, *b)) {
            return Err(invalid(kind, format!("{what} overlap")));
        }
        let ne = c.experts_per_pe(n);
        if self.ctx.backend.gpu().is_some() && !Kernels::a2av_fits(n, ne, a2av_kind(kind)) {
            return Err(invalid(
                kind,
                format!("{n} PEs × {ne} experts per PE is more than the device kernels' staging takes"),
            ));
        }
        Ok(c)
    }
}

/// The world team's MoE all-to-all-v.
impl Context {
    /// [`Team::all_to_all_v`] over the world.
    ///
    /// # Collective
    pub fn all_to_all_v<'a, 'b, 'c, 'd, T: Element>(
        &self,
        input: impl Into<SymSlice<'a, T>>,
        output: impl Into<SymSlice<'b, T>>,
        in_splits: impl Into<SymSlice<'c, i64>>,
        out_splits_offsets: impl Into<SymSlice<'d, i64>>,
        row_len: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.world().all_to_all_v(input, output, in_splits, out_splits_offsets, row_len, stream)
    }

    /// [`Team::all_to_all_v_2d`] over the world.
    ///
    /// # Collective
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v_2d<'a, 'b, 'c, 'd, T: Element>(
        &self,
        input: impl Into<SymSlice<'a, T>>,
        output: impl Into<SymSlice<'b, T>>,
        in_splits: impl Into<SymSlice<'c, i64>>,
        out_splits_offsets: impl Into<SymSlice<'d, i64>>,
        row_len: usize,
        major_align: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.world().all_to_all_v_2d(input, output, in_splits, out_splits_offsets, row_len, major_align, stream)
    }

    /// [`Team::all_to_all_v_2d_offset`] over the world.
    ///
    /// # Collective
    pub fn all_to_all_v_2d_offset<'a, 'b, 'c, 'd, T: Element>(
        &self,
        input: impl Into<SymSlice<'a, T>>,
        output: impl Into<SymSlice<'b, T>>,
        in_splits_offsets: impl Into<SymSlice<'c, i64>>,
        out_splits_offsets: impl Into<SymSlice<'d, i64>>,
        row_len: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.world().all_to_all_v_2d_offset(input, output, in_splits_offsets, out_splits_offsets, row_len, stream)
    }
}
