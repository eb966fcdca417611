//! [`MoeAllToAll`]'s FP8 dispatch: bf16 tokens quantized on the sender (or
//! tokens already quantized) cross the links as e4m3 codes with one `f32`
//! scale per [`quant::GROUP`] elements; the receiver gets the codes and
//! scales in the expert-major layout, and if asked their bf16 values. The
//! wire row: `| hidden × e4m3 | pad to 4 | ⌈hidden/128⌉ × f32 scale | pad to
//! 8 | token: i64 | top_k × {local expert or -1, weight} | pad to 16 |`.

use super::layer::{DeviceTokens, HostTokens, Layout, MoeAllToAll, WireFormat};
use crate::buffer::SymSlice;
use crate::context::Stream;
use crate::error::{Error, Result};
use crate::fp8::fp8_e4m3;
use crate::quant;
use half::bf16;

/// The tokens of [`MoeAllToAll::dispatch_fp8`].
#[derive(Clone, Copy, Debug)]
pub enum Fp8Tokens<'a> {
    /// `n_tokens × hidden` bf16 elements, quantized on this PE as
    /// [`quant::quantize`] does, a token at a time.
    Bf16(&'a [bf16]),
    /// Tokens already quantized: `n_tokens × hidden` codes and, for each
    /// token, its [`MoeConfig::scales_per_token`](super::MoeConfig::scales_per_token)
    /// scales (token `t`'s group `i` at `t × scales_per_token + i`). They
    /// travel as they are.
    Quantized {
        /// The e4m3 codes.
        codes: &'a [fp8_e4m3],
        /// One scale per group of each token.
        scales: &'a [f32],
    },
}

/// The tokens of [`MoeAllToAll::dispatch_fp8_on_device`]: as
/// [`Fp8Tokens`], in device buffers of `max_tokens` rows.
#[derive(Clone, Copy)]
pub enum Fp8DeviceTokens<'a> {
    /// `max_tokens × hidden` bf16 elements, quantized in the dispatch's
    /// gather kernel.
    Bf16(SymSlice<'a, bf16>),
    /// `max_tokens × hidden` codes and `max_tokens × scales_per_token`
    /// scales.
    Quantized {
        /// The e4m3 codes.
        codes: SymSlice<'a, fp8_e4m3>,
        /// One scale per group of each token.
        scales: SymSlice<'a, f32>,
    },
}

/// What the receiver of an FP8 dispatch gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Out {
    /// The codes and scales only (what an FP8 grouped GEMM takes).
    E4m3,
    /// The codes and scales, and their dequantized bf16 values
    /// (`f32(code) × scale`, rounded to bf16) in the usual view.
    Bf16,
}

/// What an FP8 dispatch received, in the dispatched layout (see
/// [`Layout`]): view row `r` holds codes `r × hidden ..` and scales
/// `r × scales_per_token ..`. Padding rows are not written.
#[derive(Clone, Copy)]
pub struct Fp8View<'a> {
    /// The e4m3 codes: `rows × hidden`.
    pub rows: SymSlice<'a, fp8_e4m3>,
    /// The scales: `rows × scales_per_token`, one per group of
    /// [`quant::GROUP`] elements of a row (the last one shorter when
    /// `hidden` is not a multiple).
    pub scales: SymSlice<'a, f32>,
    /// With [`Fp8Out::Bf16`]: the dequantized rows, `rows × hidden`, in
    /// the exchange's receive buffer (which [`MoeAllToAll::combine`] may
    /// take back as the experts' outputs, written in place).
    pub bf16: Option<SymSlice<'a, bf16>>,
}

impl MoeAllToAll<bf16> {
    /// The FP8 dispatch: as [`MoeAllToAll::dispatch`], but the tokens
    /// cross the links as e4m3 codes and scales — quantized here from bf16,
    /// or already quantized — and the receiver gets the codes and scales
    /// (and, with [`Fp8Out::Bf16`], their bf16 values), grouped by local
    /// expert as the returned [`Layout`] says. The codes and scales are bit
    /// for bit what [`quant::quantize`] gives for each token. Combine with
    /// [`MoeAllToAll::combine`] on bf16 expert outputs.
    ///
    /// # Errors
    /// An exchange not built with [`MoeConfig::fp8`](super::MoeConfig::fp8)
    /// ([`Error::Invalid`], before anything is exchanged). Pre-quantized
    /// tokens without their scales (fewer or more than `n_tokens ×
    /// scales_per_token`: [`Error::LengthMismatch`]), and whatever
    /// `dispatch` refuses: the error on this PE, on the others a
    /// collective mismatch naming this PE and the cause; nothing is sent
    /// or written.
    ///
    /// # Collective
    /// Every PE calls it (with its own tokens).
    pub fn dispatch_fp8(
        &self,
        tokens: Fp8Tokens<'_>,
        topk_expert_ids: &[i64],
        topk_weights: &[f32],
        out: Fp8Out,
        stream: &Stream,
    ) -> Result<(Fp8View<'_>, Layout)> {
        self.check_fp8("dispatch_fp8")?;
        let host = match tokens {
            Fp8Tokens::Bf16(x) => HostTokens::Plain(x),
            Fp8Tokens::Quantized { codes, scales } => HostTokens::Codes(codes, scales),
        };
        let r = self.dispatch_host(host, topk_expert_ids, topk_weights, out == Fp8Out::Bf16, stream);
        let layout = self.team.ctx.report(r)?;
        Ok((self.fp8_view(layout.rows(), out), layout))
    }

    /// [`MoeAllToAll::dispatch_fp8`] with everything on the device (as
    /// [`MoeAllToAll::dispatch_on_device`]; capturable): on the GPU backend
    /// the gather kernel quantizes each token (`kernels/moe/quant.cuh`, bit for
    /// bit [`quant`]) and the expansion places codes and scales and, with
    /// [`Fp8Out::Bf16`], dequantizes. Returns the whole receive buffers;
    /// [`MoeAllToAll::device_layout`] says where each expert's rows lie.
    ///
    /// # Errors
    /// As [`MoeAllToAll::dispatch_on_device`]; a scales buffer shorter
    /// than `max_tokens × scales_per_token` (missing scales) fails at once
    /// on this PE and as a collective mismatch on the others, nothing
    /// written.
    ///
    /// # Collective
    /// Every PE calls it.
    pub fn dispatch_fp8_on_device<'b, 'c, 'd>(
        &self,
        tokens: Fp8DeviceTokens<'_>,
        topk_expert_ids: impl Into<SymSlice<'b, i64>>,
        topk_weights: impl Into<SymSlice<'c, f32>>,
        n_tokens: impl Into<SymSlice<'d, i64>>,
        out: Fp8Out,
        stream: &Stream,
    ) -> Result<Fp8View<'_>> {
        self.check_fp8("dispatch_fp8_on_device")?;
        let tokens = match tokens {
            Fp8DeviceTokens::Bf16(x) => DeviceTokens::Plain(x),
            Fp8DeviceTokens::Quantized { codes, scales } => DeviceTokens::Codes(codes, scales),
        };
        let (ids, weights, count) = (topk_expert_ids.into(), topk_weights.into(), n_tokens.into());
        let r = self.dispatch_device(tokens, ids, weights, count, out == Fp8Out::Bf16, stream);
        self.team.ctx.report(r)?;
        Ok(self.fp8_view(self.recv.len / self.config.hidden, out))
    }

    /// The whole FP8 receive buffers (codes, scales, and the bf16 receive
    /// buffer), or `None` for an exchange without the FP8 format: what
    /// the last FP8 dispatch left, in its layout.
    pub fn fp8_received(&self) -> Option<Fp8View<'_>> {
        self.fp8.as_ref().map(|_| self.fp8_view(self.recv.len / self.config.hidden, Fp8Out::Bf16))
    }

    fn check_fp8(&self, what: &str) -> Result<()> {
        if self.config.format != WireFormat::E4m3 {
            return Err(Error::Invalid(format!(
                "MoeAllToAll::{what}: this exchange sends {:?} rows; build it with MoeConfig::fp8()",
                self.config.format
            )));
        }
        Ok(())
    }

    /// The first `rows` rows of the FP8 view.
    fn fp8_view(&self, rows: usize, out: Fp8Out) -> Fp8View<'_> {
        let f = self.fp8.as_ref().expect("the FP8 format's buffers");
        let (h, g) = (self.config.hidden, quant::scales_len(self.config.hidden));
        Fp8View {
            rows: f.codes.slice(0..rows * h),
            scales: f.scales.slice(0..rows * g),
            bf16: (out == Fp8Out::Bf16).then(|| self.recv.slice(0..rows * h)),
        }
    }
}
