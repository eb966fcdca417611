//! shmem-bench's FP8 rows of the MoE layer (`--fp8`): `layer_dispatch`
//! of dtype `e4m3`, [`MoeAllToAll::dispatch_fp8_on_device`] of bf16
//! tokens, quantized in the gather kernel to e4m3 with one f32 scale per
//! 128 elements, which is what crosses the links; the receiver gets the
//! codes and scales in the expert-major layout ([`Fp8Out::E4m3`]: what
//! an FP8 grouped GEMM takes, no bf16 view). On the same routes and
//! tokens as the bf16 rows (`layer.rs`), one exchange per token count
//! built with [`MoeConfig::fp8`].
//!
//! **Counts**: `bytes` is the bf16 rows' (`tokens × topk × hidden × 2`);
//! `link_bytes` the FP8 wire rows PE 0 sends to other PEs (`hidden`
//! codes, padded to 4, `⌈hidden/128⌉` f32 scales, padded to 8, the
//! token's index and slots, padded to 16); `logical_bytes` the bf16
//! rows' count (distinct tokens PE 0 receives × `hidden × 2`): the same
//! logical payload — the tokens the layer delivers — for both formats, so
//! that the ratio of their logical GB/s is the ratio of their times at the
//! same work. DeepEP's tests count an FP8 dispatch's bytes as the FP8
//! payload instead (`hidden + 4 × hidden/128` a token), which would make
//! a faster FP8 dispatch show less bandwidth than the bf16 one.
//!
//! **Checks**: every view row of a token — each local expert's block,
//! from every source in PE order, each source's in token order (padding
//! rows are not compared) — holds exactly [`shmem::quant::quantize_vec`]
//! of the source's bf16 token: its codes and its scales, bit for bit; and
//! the view's splits and offsets as for the bf16 rows.

use crate::bench::Bench;
use crate::data::{seed, Pattern};
use crate::harness::Case;
use crate::layer::{weight, LayerBytes};
use crate::moe::{routings, Chunk, MoeShape, Routing};
use crate::ops::{Imp, Op};
use crate::report::{note, Row};
use crate::Res;
use shmem::quant::{quantize_vec, scales_len};
use shmem::{bf16, fp8_e4m3, Collectives, Fp8DeviceTokens, Fp8Out, MoeAllToAll, MoeConfig, SymmetricBuffer};

/// The FP8 rows' dtype name.
pub(super) const E4M3: &str = "e4m3";

/// The bytes of an FP8 wire row of `hidden` elements and `topk` slots, as
/// `shmem::moe`'s layer lays it out (see the module's doc).
pub(super) fn fp8_wire_stride(hidden: usize, topk: usize) -> usize {
    let meta = (hidden.next_multiple_of(4) + 4 * scales_len(hidden)).next_multiple_of(8);
    (meta + 8 + 8 * topk).next_multiple_of(16)
}

/// The heap the FP8 exchange takes beyond the bf16 one of the same
/// tokens (`layer::heap_bytes`, whose wire rows are longer): the
/// combine's partials (`tokens × n` rows of `hidden × 2` padded to 16)
/// and the view's codes and scales (`view_rows × (hidden + 4 ×
/// ⌈hidden/128⌉)`), with 4 KiB for each allocation's alignment.
pub(super) fn extra_heap_bytes(tokens: usize, n: usize, hidden: usize, view_rows: usize) -> usize {
    tokens * n * (hidden * 2).next_multiple_of(16) + view_rows * (hidden + 4 * scales_len(hidden)) + 3 * 4096
}

/// Each chunk's row as the receiver must hold it: the codes as `u32`s,
/// then the scales' bits.
fn expected(pattern: &Pattern, chunks: &[Chunk], hidden: usize) -> Vec<u32> {
    let mut want = Vec::with_capacity(chunks.len() * (hidden + scales_len(hidden)));
    for c in chunks {
        let token: Vec<bf16> = pattern.rows(c.src, c.from, 1, hidden).collect();
        let (codes, scales) = quantize_vec(&token);
        want.extend(codes.iter().map(|q| u32::from(q.to_bits())));
        want.extend(scales.iter().map(|x| x.to_bits()));
    }
    want
}

/// The received rows of `chunks` in the codes and scales, as [`expected`].
fn gather_fp8(codes: &[fp8_e4m3], scales: &[f32], chunks: &[Chunk], hidden: usize) -> Res<Vec<u32>> {
    let g = scales_len(hidden);
    let mut got = Vec::with_capacity(chunks.len() * (hidden + g));
    for c in chunks {
        let q = codes.get(c.to * hidden..(c.to + 1) * hidden).ok_or("codes too short")?;
        let sc = scales.get(c.to * g..(c.to + 1) * g).ok_or("scales too short")?;
        got.extend(q.iter().map(|q| u32::from(q.to_bits())));
        got.extend(sc.iter().map(|x| x.to_bits()));
    }
    Ok(got)
}

impl Bench<'_> {
    /// shmem's FP8 `layer_dispatch` rows (see the module's doc).
    pub(super) fn layer_fp8(&self) -> Res<Vec<Row>> {
        let (me, n, s, ctx) = (self.ctx.my_pe(), self.ctx.n_pes(), &self.s, self.ctx);
        let (op, hidden, g) = (Op::LayerDispatch, self.args.hidden as usize, scales_len(self.args.hidden as usize));
        let mut rows = Vec::new();
        for r in &routings(self.args, n)? {
            let shape: MoeShape = r.shape;
            let (tokens, k) = (shape.tokens, shape.topk);
            if !self.runs(Imp::Shmem, op, shape.bytes(2)) {
                continue;
            }
            let config = MoeConfig::new(hidden, tokens, shape.experts_per_pe, k).major_align(shape.major_align).fp8();
            // Every PE fails alike (the same allocator): skip them all.
            let made = (|| -> Res<_> {
                let moe = MoeAllToAll::<bf16>::new(ctx, config)?;
                let bufs: (SymmetricBuffer<bf16>, SymmetricBuffer<i64>, SymmetricBuffer<f32>, SymmetricBuffer<i64>) =
                    (ctx.alloc(tokens * hidden)?, ctx.alloc(tokens * k)?, ctx.alloc(tokens * k)?, ctx.alloc(1)?);
                Ok((moe, bufs))
            })();
            let (moe, (input, ids, weights, count)) = match made {
                Ok(m) => m,
                Err(e) => {
                    if me == 0 {
                        note(format_args!("MoE layer {E4M3} rows of {tokens} tokens skipped: {e}"));
                    }
                    continue;
                }
            };
            // The bf16 rows' tokens (the same seed), quantized by the dispatch.
            let pattern = Pattern::moved::<bf16>(n, seed(Op::MoeLayer, "bf16", tokens))?;
            let own: Vec<bf16> = pattern.rows(me, 0, tokens, hidden).collect();
            input.copy_from_host(&own, s)?;
            ids.copy_from_host(&r.picks[me].iter().map(|&g| g as i64).collect::<Vec<_>>(), s)?;
            weights.copy_from_host(&(0..tokens * k).map(|i| weight(k, i % k)).collect::<Vec<_>>(), s)?;
            count.copy_from_host(&[tokens as i64], s)?;
            let view = moe.fp8_received().ok_or("an FP8 exchange has FP8 buffers")?;
            let (chunks, view_rows) = r.layer_view(me);
            let want = expected(&pattern, &chunks, hidden);
            let want_so = r.layer_so(me);
            let run = || -> Res {
                let tokens = Fp8DeviceTokens::Bf16((&input).into());
                moe.dispatch_fp8_on_device(tokens, &ids, &weights, &count, Fp8Out::E4m3, s)?;
                Ok(())
            };
            let poison = || -> Res {
                self.poison_with(view.rows, view_rows * hidden, fp8_e4m3::from_bits(0xff))?;
                self.poison_with(view.scales, view_rows * g, f32::NAN)?;
                self.poison_with(moe.device_layout(), want_so.len(), -1i64)
            };
            let read = || -> Res<Vec<u32>> {
                let codes = self.read_prefix_of(view.rows, view_rows * hidden, fp8_e4m3::from_bits(0xff))?;
                let scales = self.read_prefix_of(view.scales, view_rows * g, f32::NAN)?;
                gather_fp8(&codes, &scales, &chunks, hidden)
            };
            let read_so = || self.read_prefix_of(moe.device_layout(), want_so.len(), -1);
            let settings = Imp::Shmem.settings(self.args.tuning()).expect("a shmem row");
            ctx.set_collectives(Collectives { moe_local_blocks: self.args.moe_local_blocks, ..settings });
            let case = Case {
                op,
                imp: Imp::Shmem,
                dtype: Some(E4M3),
                bytes: shape.bytes(2),
                run: &run,
                poison: &poison,
                read: &read,
                want: &want,
                moe: Some(shape),
                splits: Some((&read_so, &want_so[..])),
                matmul: None,
                layer: Some(self.fp8_bytes(r)),
            };
            let measured = self.measure(&case, &mut rows);
            ctx.set_collectives(Collectives::default());
            measured?;
        }
        Ok(rows)
    }

    /// PE 0's counts of the FP8 dispatch: its wire rows on the link, the
    /// bf16 tokens' logical count (see the module's doc).
    fn fp8_bytes(&self, r: &Routing) -> LayerBytes {
        let stride = fp8_wire_stride(r.shape.hidden, r.shape.topk);
        r.layer_bytes_of(Op::LayerDispatch, stride, size_of::<bf16>())
    }
}
