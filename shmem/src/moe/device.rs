//! [`MoeAllToAll`]'s device path on the GPU backend: the route and gather
//! kernels, the 1D all-to-all-v of wire rows, the receiver's expansion,
//! the combine's two phases (see `kernels/moe/layer.cu`); and the decode
//! form, a kernel for each (`kernels/moe/decode.cu`), where every PE is
//! reached over NVLink and the configuration fits it. Nothing waits on
//! the host, so a dispatch and a combine can be captured in a CUDA graph.

use super::layer::{CombineElement, DeviceTokens, MoeAllToAll, LAST_DECODE, LAST_EXCHANGE};
use super::nodes::Rails;
use super::Agreement;
use crate::algo::Tuning;
use crate::buffer::SymSlice;
use crate::context::Stream;
use crate::dtype::Element;
use crate::error::Result;
use crate::gpu::abi::{FP8_PRE_QUANTIZED, FP8_QUANTIZE};
use crate::gpu::kernels::{
    combine_lines_fit, dispatch_lines_fit, not_built, source_units, Kernels, MoeLayer, TeamSync,
};
use crate::gpu::GpuWorld;
use crate::team::{Desc, OpKind};
use crate::MoeKernels;
use std::sync::atomic::Ordering;

/// A result as the verdict the agreement carries and the value kept for
/// after it.
fn split<V>(r: Result<V>) -> (Result<()>, Option<V>) {
    match r {
        Ok(v) => (Ok(()), Some(v)),
        Err(e) => (Err(e), None),
    }
}

impl<T: Element> MoeAllToAll<T> {
    /// The kernels' arguments for `phase`, with this exchange's buffers.
    pub(super) fn layer_args(&self, phase: i32) -> MoeLayer {
        let (c, w) = (self.config, self.wire);
        let fp8 = self.fp8.as_ref();
        MoeLayer {
            partials: fp8.map_or(self.stage.offset, |f| f.partials.offset) as u64,
            recv_codes: fp8.map_or(0, |f| f.codes.offset) as u64,
            recv_scales: fp8.map_or(0, |f| f.scales.offset) as u64,
            back_stride: w.back_stride as i64,
            scales_at: w.scales as i64,
            send: self.send.offset as u64,
            stage: self.stage.offset as u64,
            recv: self.recv.offset as u64,
            send_splits: self.send_splits.offset as u64,
            stage_so: self.stage_so.offset as u64,
            back_so: self.back_so.offset as u64,
            view_so: self.dispatch_splits.offset as u64,
            slot_rows: self.slot_rows.offset as u64,
            state: self.state.offset as u64,
            scratch: self.scratch.offset as u64,
            arrivals: self.arrivals.offset as u64,
            decode: self.decode.as_ref().map_or(0, |d| d.words.offset) as u64,
            views: self.decode.as_ref().map_or(0, |d| d.views.offset) as u64,
            data_bytes: w.data as i64,
            meta: w.meta as i64,
            stride: w.stride as i64,
            max_tokens: c.max_tokens as i64,
            hidden: c.hidden as i64,
            top_k: c.top_k as i32,
            ne: c.experts_per_pe as i32,
            major_align: c.major_align as i32,
            phase,
            ..MoeLayer::default()
        }
    }

    /// How the gather writes tokens into wire rows (`MoeLayer::fp8`): it
    /// quantizes them in the FP8 format, else copies them.
    fn gather_mode(&self) -> i32 {
        if self.wire.fp8 {
            FP8_QUANTIZE
        } else {
            0
        }
    }

    /// The source's arguments over `base`: the caller's tokens (or, where
    /// they come quantized, their codes and scales), routing and count.
    fn source_args(
        &self,
        tokens: DeviceTokens<'_, T>,
        (ids, weights, count): (SymSlice<'_, i64>, SymSlice<'_, f32>, SymSlice<'_, i64>),
        base: MoeLayer,
    ) -> Result<MoeLayer> {
        let ctx = &self.team.ctx;
        let (tokens, token_scales, fp8) = match tokens {
            DeviceTokens::Plain(x) => (x.region(ctx)?.offset, 0, self.gather_mode()),
            DeviceTokens::Codes(q, s) => (q.region(ctx)?.offset, s.region(ctx)?.offset, FP8_PRE_QUANTIZED),
        };
        Ok(MoeLayer {
            tokens: tokens as u64,
            token_scales: token_scales as u64,
            ids: ids.region(ctx)?.offset as u64,
            weights: weights.region(ctx)?.offset as u64,
            n_tokens: count.region(ctx)?.offset as u64,
            fp8,
            ..base
        })
    }

    /// `dispatch_on_device` (and its FP8 form) on the GPU backend: route
    /// and gather (quantizing, in the FP8 format, tokens that are not
    /// yet), the exchange of wire rows, the expansion into the view (the
    /// FP8 format's codes and scales, and their bf16 values where
    /// `dequantize`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_gpu(
        &self,
        g: &GpuWorld,
        pre: Result<()>,
        tokens: DeviceTokens<'_, T>,
        ids: SymSlice<'_, i64>,
        weights: SymSlice<'_, f32>,
        count: SymSlice<'_, i64>,
        dequantize: bool,
        stream: &Stream,
    ) -> Result<()> {
        let (c, n) = (self.config, self.team.n_pes());
        let st = g.stream(stream.cuda_stream()).cu_stream();
        let fp8 = self.gather_mode();
        if let Some(r) = &self.rails {
            return self.dispatch_nodes_gpu(g, r, pre, tokens, (ids, weights, count), dequantize, stream);
        }
        if let Some(t) = self.decode_form(g)? {
            self.last_form.store(LAST_DECODE, Ordering::Relaxed);
            let k = g.kernels.as_ref().ok_or_else(not_built)?;
            let tuning = self.team.ctx.collectives.lock().unwrap_or_else(|e| e.into_inner()).tuning;
            let lines = (fp8 == 0 && self.dispatch_lines(k, &t, &tuning)) as i32;
            let m = pre.and_then(|_| {
                let m = MoeLayer { fp8, dequantize: i32::from(dequantize), lines, ..self.layer_args(0) };
                self.source_args(tokens, (ids, weights, count), m)
            });
            return self.decode_launch(g, t, OpKind::MoeDispatch, m, stream);
        }
        self.last_form.store(LAST_EXCHANGE, Ordering::Relaxed);
        let pre = pre.and_then(|_| {
            let k = g.kernels.as_ref().ok_or_else(not_built)?;
            let t = k.team(self.team.state.slot, &self.team.state.members, false)?;
            let m = self.source_args(tokens, (ids, weights, count), self.layer_args(0))?;
            k.moe_route(t, m, source_units(c.max_tokens, c.top_k), st)
        });
        let own = Agreement::own(pre);
        self.team.all_to_all_v_any(OpKind::AllToAllV, self.out_buffers(), self.wire.stride, 0, own, stream)?;
        let k = g.kernels.as_ref().ok_or_else(not_built)?;
        let t = k.team(self.team.state.slot, &self.team.state.members, false)?;
        let m = MoeLayer { fp8, dequantize: i32::from(dequantize), ..self.layer_args(1) };
        k.moe_route(t, m, n * c.max_tokens, st)
    }
}

impl<T: CombineElement> MoeAllToAll<T> {
    /// `combine_on_device` on the GPU backend: the expert side's partials,
    /// the exchange back, the source's sums.
    pub(super) fn combine_gpu(
        &self,
        g: &GpuWorld,
        pre: Result<()>,
        outputs: SymSlice<'_, T>,
        out: SymSlice<'_, T>,
        stream: &Stream,
    ) -> Result<()> {
        let (c, n, ctx) = (self.config, self.team.n_pes(), &self.team.ctx);
        let st = g.stream(stream.cuda_stream()).cu_stream();
        if let Some(r) = &self.rails {
            return self.combine_nodes_gpu(g, r, pre, outputs, out, stream);
        }
        let args = |phase| -> Result<MoeLayer> {
            Ok(MoeLayer {
                outputs: outputs.region(ctx)?.offset as u64,
                out: out.region(ctx)?.offset as u64,
                ..self.layer_args(phase)
            })
        };
        if self.last_form.load(Ordering::Relaxed) == LAST_DECODE {
            let k = g.kernels.as_ref().ok_or_else(not_built)?;
            let settings = *self.team.ctx.collectives.lock().unwrap_or_else(|e| e.into_inner());
            let t = k.team(self.team.state.slot, &self.team.state.members, settings.force_rma)?;
            let lines = self.combine_lines(k, &t, &settings.tuning) as i32;
            let m = pre.and_then(|_| args(1)).map(|m| MoeLayer { lines, ..m });
            return self.decode_launch(g, t, OpKind::MoeCombine, m, stream);
        }
        let pre = pre.and_then(|_| {
            let k = g.kernels.as_ref().ok_or_else(not_built)?;
            let t = k.team(self.team.state.slot, &self.team.state.members, false)?;
            k.moe_combine(T::DTYPE, t, args(0)?, n * c.max_tokens, st)
        });
        let own = Agreement::own(pre);
        self.team.all_to_all_v_any(OpKind::AllToAllV, self.back_buffers(), self.wire.back_stride, 0, own, stream)?;
        let k = g.kernels.as_ref().ok_or_else(not_built)?;
        let t = k.team(self.team.state.slot, &self.team.state.members, false)?;
        k.moe_combine(T::DTYPE, t, args(1)?, c.max_tokens, st)
    }
}

/// The most bytes of rows for the team's `n × max_tokens` tokens (rows of
/// 7168 bf16: 14 KiB) for which the decode form sends its combine's
/// partials, and its dispatch's rows, in lines by default. Lines carry a
/// flag in every 64 bytes and 1/7 more bytes, and nothing waits for a
/// count of blocks, so they win where latency rules and lose where the
/// link does (`docs/tuning.md`).
pub(crate) const COMBINE_LINES_MAX_BYTES: usize = 2 << 20;
pub(crate) const DISPATCH_LINES_MAX_BYTES: usize = 512 << 10;

impl<T: Element> MoeAllToAll<T> {
    /// Whether this call takes the decode form: the configuration fits it
    /// (its buffers were allocated), every member is reached over NVLink,
    /// the kernels' grid fits the GPUs and the MoE kernels are left to
    /// choose ([`MoeKernels::Auto`]); the same on every PE.
    /// The team's view for its kernel where it does, else `None`.
    fn decode_form(&self, g: &GpuWorld) -> Result<Option<TeamSync>> {
        let settings = *self.team.ctx.collectives.lock().unwrap_or_else(|e| e.into_inner());
        let Some(k) = g.kernels.as_ref().filter(|_| self.decode.is_some() && settings.moe == MoeKernels::Auto) else {
            return Ok(None);
        };
        let t = k.team(self.team.state.slot, &self.team.state.members, settings.force_rma)?;
        Ok((t.nvlink() && k.decode_blocks().is_some()).then_some(t))
    }

    /// Whether the decode form's combine sends its partials in lines
    /// (`MoeLayer::lines`): on the world team (the low-latency buffers are
    /// the world's), where no PE shares its GPU ([`Kernels::lines`]), a
    /// member's partials for one source fit one sender's buffer
    /// ([`combine_lines_fit`]) and the most a PE sends, a partial for each
    /// of the team's `n × max_tokens` tokens, is within
    /// [`Tuning::moe_layer_lines_max_bytes`] where it is set, else
    /// [`COMBINE_LINES_MAX_BYTES`]. The same on every PE.
    fn combine_lines(&self, k: &Kernels, t: &TeamSync, tuning: &Tuning) -> bool {
        let (c, n) = (self.config, self.team.n_pes());
        let row_bytes = c.hidden * size_of::<T>();
        self.lines_serve(k, t, tuning.moe_layer_lines_max_bytes.unwrap_or(COMBINE_LINES_MAX_BYTES), row_bytes)
            && combine_lines_fit(n, c.max_tokens, row_bytes)
    }

    /// Whether the decode form's dispatch in the native format sends its
    /// rows in lines (`MoeLayer::lines`): as [`MoeAllToAll::combine_lines`],
    /// with this PE's rows for a member (at most `max_tokens` records of a
    /// metadata line and the row's) and the head within one sender's
    /// buffer ([`dispatch_lines_fit`]).
    fn dispatch_lines(&self, k: &Kernels, t: &TeamSync, tuning: &Tuning) -> bool {
        let (c, n) = (self.config, self.team.n_pes());
        let row_bytes = c.hidden * size_of::<T>();
        self.lines_serve(k, t, tuning.moe_layer_lines_max_bytes.unwrap_or(DISPATCH_LINES_MAX_BYTES), row_bytes)
            && dispatch_lines_fit(n, c.max_tokens, row_bytes, c.experts_per_pe)
    }

    /// What both phases' lines need: the world team (the low-latency
    /// buffers are the world's) over NVLink, no PE sharing its GPU
    /// ([`Kernels::lines`]), and rows of `row_bytes` for each of the
    /// team's `n × max_tokens` tokens within `most` bytes
    /// ([`Tuning::moe_layer_lines_max_bytes`] where it is set). The same on every
    /// PE.
    fn lines_serve(&self, k: &Kernels, t: &TeamSync, most: usize, row_bytes: usize) -> bool {
        self.team.state.slot == 0
            && k.lines()
            && t.nvlink()
            && self.team.n_pes().saturating_mul(self.config.max_tokens).saturating_mul(row_bytes) <= most
    }

    /// The decode form's kernel on `t` with `m` (its phase the call's), agreed on
    /// the device first where the call is eager (`kind`: the call's); `m`
    /// an error: this PE's call failed its checks, and its peers fail the
    /// agreement with it.
    fn decode_launch(
        &self,
        g: &GpuWorld,
        t: TeamSync,
        kind: OpKind,
        m: Result<MoeLayer>,
        stream: &Stream,
    ) -> Result<()> {
        let team = &self.team;
        let k = g.kernels.as_ref().ok_or_else(not_built)?;
        let st = g.stream(stream.cuda_stream());
        if crate::gpu::capturing(st) {
            return k.moe_decode(T::DTYPE, t, m?, st.cu_stream());
        }
        let mut desc = Desc::new(kind);
        desc.dtype = Some(T::DTYPE);
        let words = self.decode.as_ref().map_or(0, |d| d.words.offset);
        desc.args = [self.send.offset, self.stage.offset, self.recv.offset, words, 0].map(|x| x as u64);
        let (epoch, row) = team.device_row(&desc, m.as_ref().err());
        match m {
            Ok(m) => k.moe_decode(T::DTYPE, t.agreeing(epoch, row), m, st.cu_stream()),
            Err(e) => {
                // The peers' agreement waits for this PE's row.
                let _ = team.agree_alone((epoch, row), stream);
                if kind == OpKind::MoeDispatch {
                    // As the peers' kernels mark their failed dispatch: a
                    // combine after it writes nothing here either.
                    let _ = self.stage_so.slice(0..1).copy_from_host(&[-1], stream);
                }
                Err(e)
            }
        }
    }

    /// The rail stage's arguments: destinations are nodes of
    /// `L × experts_per_pe` experts, the rows name this PE.
    fn rail_args(&self, r: &Rails, phase: i32) -> MoeLayer {
        MoeLayer {
            send: r.send.offset as u64,
            stage: r.stage.offset as u64,
            send_splits: r.splits.offset as u64,
            stage_so: r.stage_so.offset as u64,
            back_so: r.back_so.offset as u64,
            ne: (self.config.experts_per_pe * r.per_node) as i32,
            origin: self.team.my_pe() as i32 + 1,
            ..self.layer_args(phase)
        }
    }

    /// The node stage's arguments on the forwarder and the receiver: the
    /// rail's staged rows as tokens, the world's PEs as the view's sources.
    fn node_args(&self, r: &Rails, phase: i32) -> MoeLayer {
        MoeLayer {
            forward_in: r.stage.offset as u64,
            forward_so: r.stage_so.offset as u64,
            slot_rows: r.slot_rows.offset as u64,
            state: r.state.offset as u64,
            view_n: self.team.n_pes() as i32,
            ..self.layer_args(phase)
        }
    }

    /// The node-aware dispatch on the GPU backend: the rail route and
    /// gather, the rail's exchange, the forwarder's route and gather over
    /// the node, the node's exchange, the receiver's expansion.
    #[allow(clippy::too_many_arguments)]
    fn dispatch_nodes_gpu(
        &self,
        g: &GpuWorld,
        r: &Rails,
        pre: Result<()>,
        tokens: DeviceTokens<'_, T>,
        (ids, weights, count): (SymSlice<'_, i64>, SymSlice<'_, f32>, SymSlice<'_, i64>),
        dequantize: bool,
        stream: &Stream,
    ) -> Result<()> {
        let (c, w) = (self.config, self.wire);
        let st = g.stream(stream.cuda_stream()).cu_stream();
        let fp8 = self.gather_mode();
        let source = pre.and_then(|()| {
            g.kernels.as_ref().ok_or_else(not_built)?;
            self.source_args(tokens, (ids, weights, count), self.rail_args(r, 0))
        });
        let (pre, source) = split(source);
        let skip_if = self.agree_world(OpKind::MoeDispatch, pre, false, stream)?;
        let m = source.expect("the agreement fails on a PE whose arguments failed");
        let k = g.kernels.as_ref().ok_or_else(not_built)?;
        let rail = k.team(r.rail.state.slot, &r.rail.state.members, false)?;
        let node = k.team(r.node.state.slot, &r.node.state.members, false)?;
        let covered = || Agreement::Covered { skip_if };
        k.moe_route(rail, m, source_units(c.max_tokens, c.top_k), st)?;
        r.rail.all_to_all_v_any(OpKind::AllToAllV, self.rail_out_buffers(), w.stride, 0, covered(), stream)?;
        let forwarded = c.rail_stage_rows(r.nodes).unwrap_or(0) * c.top_k;
        k.moe_route(node, MoeLayer { fp8, ..self.node_args(r, 0) }, forwarded, st)?;
        r.node.all_to_all_v_any(OpKind::AllToAllV, self.out_buffers(), w.stride, 0, covered(), stream)?;
        let m = MoeLayer { fp8, dequantize: i32::from(dequantize), ..self.node_args(r, 1) };
        k.moe_route(node, m, self.team.n_pes() * c.max_tokens, st)
    }
}

impl<T: CombineElement> MoeAllToAll<T> {
    /// The node-aware combine on the GPU backend: the expert side's
    /// partials, the node's exchange back, the forwarder's sums, the
    /// rail's exchange back, the source's sums.
    fn combine_nodes_gpu(
        &self,
        g: &GpuWorld,
        r: &Rails,
        pre: Result<()>,
        outputs: SymSlice<'_, T>,
        out: SymSlice<'_, T>,
        stream: &Stream,
    ) -> Result<()> {
        let (c, ctx, w) = (self.config, &self.team.ctx, self.wire);
        let st = g.stream(stream.cuda_stream()).cu_stream();
        let regions = pre.and_then(|()| {
            g.kernels.as_ref().ok_or_else(not_built)?;
            Ok((outputs.region(ctx)?.offset as u64, out.region(ctx)?.offset as u64))
        });
        let (pre, regions) = split(regions);
        let skip_if = self.agree_world(OpKind::MoeCombine, pre, false, stream)?;
        let (outputs, out) = regions.expect("the agreement fails on a PE whose arguments failed");
        let covered = || Agreement::Covered { skip_if };
        let k = g.kernels.as_ref().ok_or_else(not_built)?;
        let rail = k.team(r.rail.state.slot, &r.rail.state.members, false)?;
        let node = k.team(r.node.state.slot, &r.node.state.members, false)?;
        let experts = MoeLayer { outputs, ..self.node_args(r, 0) };
        k.moe_combine(T::DTYPE, node, experts, self.team.n_pes() * c.max_tokens, st)?;
        r.node.all_to_all_v_any(OpKind::AllToAllV, self.back_buffers(), w.back_stride, 0, covered(), stream)?;
        let sums = r.partials.as_ref().map_or(&r.stage, |p| p);
        let forward = MoeLayer {
            out: sums.offset as u64,
            out_stride: w.back_stride as i64,
            next_so: r.back_so.offset as u64,
            fail_splits: r.stage_so.offset as u64,
            ..self.node_args(r, 1)
        };
        let rows = c.rail_stage_rows(r.nodes).unwrap_or(0);
        k.moe_combine(T::DTYPE, node, forward, rows, st)?;
        r.rail.all_to_all_v_any(OpKind::AllToAllV, self.rail_back_buffers(), w.back_stride, 0, covered(), stream)?;
        k.moe_combine(T::DTYPE, rail, MoeLayer { out, ..self.rail_args(r, 1) }, c.max_tokens, st)
    }
}
