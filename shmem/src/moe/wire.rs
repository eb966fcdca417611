//! The sizes a [`MoeAllToAll`](super::MoeAllToAll) is built for, and its
//! wire rows: where a row's token, metadata and slots lie, in bytes.

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::quant;
use half::{bf16, f16};

/// The sizes a [`MoeAllToAll`](super::MoeAllToAll) is built for; the same on every PE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    /// Elements per token (the hidden size): one row.
    pub hidden: usize,
    /// Most tokens one PE dispatches in one call.
    pub max_tokens: usize,
    /// Experts on each PE; expert `g` lives on PE `g / experts_per_pe`.
    pub experts_per_pe: usize,
    /// Experts each token is routed to: distinct experts, so at most
    /// `n_pes × experts_per_pe`.
    pub top_k: usize,
    /// Each expert's block of received rows starts at a multiple of this,
    /// and is at least this long (see [`Team::all_to_all_v_2d`](crate::Team::all_to_all_v_2d)). 1 by default.
    pub major_align: usize,
    /// What the dispatch's wire rows carry: the tokens' elements
    /// ([`WireFormat::Native`], the default) or e4m3 codes and scales.
    pub format: WireFormat,
}

/// What a [`MoeAllToAll`](super::MoeAllToAll)'s dispatch sends over the links: each wire row
/// (one per token and destination PE) carries the token, its index and its
/// slots' experts and weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WireFormat {
    /// The tokens' own elements, bit for bit.
    #[default]
    Native,
    /// Block-scaled e4m3: per token `hidden` codes and one `f32` scale per
    /// [`quant::GROUP`] elements, as [`crate::quant`] computes them. For
    /// `MoeAllToAll<bf16>` only.
    E4m3,
}

impl MoeConfig {
    /// A configuration with `major_align` 1.
    pub fn new(hidden: usize, max_tokens: usize, experts_per_pe: usize, top_k: usize) -> MoeConfig {
        MoeConfig { hidden, max_tokens, experts_per_pe, top_k, major_align: 1, format: WireFormat::Native }
    }

    /// Sets [`MoeConfig::format`] to [`WireFormat::E4m3`]: an FP8 dispatch.
    pub fn fp8(self) -> MoeConfig {
        MoeConfig { format: WireFormat::E4m3, ..self }
    }

    /// Scales per token in the FP8 format.
    pub fn scales_per_token(&self) -> usize {
        quant::scales_len(self.hidden)
    }

    /// Sets [`MoeConfig::major_align`].
    pub fn major_align(self, major_align: usize) -> MoeConfig {
        MoeConfig { major_align, ..self }
    }

    /// Wire rows one PE sends at most: one per (token, destination PE).
    pub(super) fn send_rows(&self, n: usize) -> Option<usize> {
        self.max_tokens.checked_mul(self.top_k.min(n))
    }

    /// Wire rows one PE may stage: each source sends each token once.
    pub(super) fn stage_rows(&self, n: usize) -> Option<usize> {
        self.max_tokens.checked_mul(n)
    }

    /// Rows of the dispatched view at most: each staged token in at most
    /// `min(top_k, experts_per_pe)` blocks, plus each block's padding
    /// (`max(round_up(r, a), a) ≤ r + a`).
    pub(super) fn recv_rows(&self, n: usize) -> Option<usize> {
        self.stage_rows(n)?
            .checked_mul(self.top_k.min(self.experts_per_pe))?
            .checked_add(self.experts_per_pe.checked_mul(self.major_align)?)
    }

    pub(super) fn check(&self, n: usize, dtype: crate::dtype::DType) -> Result<()> {
        let c = self;
        let elem = dtype.size();
        if c.hidden == 0 || c.max_tokens == 0 || c.experts_per_pe == 0 || c.top_k == 0 || c.major_align == 0 {
            return Err(Error::Invalid(format!("MoeAllToAll::new: every size must be at least 1, got {c:?}")));
        }
        if c.format == WireFormat::E4m3 && dtype != crate::dtype::DType::BF16 {
            return Err(Error::Invalid(format!(
                "MoeAllToAll::new: the FP8 dispatch takes bf16 tokens, this exchange is of {dtype}"
            )));
        }
        if c.top_k > n.saturating_mul(c.experts_per_pe) {
            return Err(Error::Invalid(format!(
                "MoeAllToAll::new: top_k {} is more than the {} experts of {n} PEs (a token's experts must differ)",
                c.top_k,
                n.saturating_mul(c.experts_per_pe)
            )));
        }
        // The device keeps rows, tokens and slots in 32-bit fields.
        let fits = |x: Option<usize>| x.filter(|&x| x < i32::MAX as usize);
        let wire = Wire::of(c, elem);
        let bytes = wire.map(|w| w.stride.max(w.back_stride));
        let ok = fits(c.recv_rows(n)).is_some()
            && fits(c.max_tokens.checked_mul(c.top_k)).is_some()
            && bytes.and_then(|b| b.checked_mul(c.stage_rows(n)?)).is_some()
            && c.recv_rows(n).and_then(|r| r.checked_mul(c.hidden)?.checked_mul(elem)).is_some()
            && c.experts_per_pe.checked_mul(2 * n).is_some();
        if !ok {
            return Err(Error::Invalid(format!("MoeAllToAll::new: the buffers of {c:?} on {n} PEs overflow")));
        }
        Ok(())
    }
}

/// Where the parts of a wire row lie, in bytes (see the `MoeAllToAll`
/// module docs, `moe/layer.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wire {
    /// The token's elements: `hidden × size_of::<T>()`; in the FP8
    /// format its codes, `hidden` bytes.
    pub(crate) data: usize,
    /// The FP8 format's scales: where they start (`hidden` rounded up to
    /// 4); 0 in the native format.
    pub(crate) scales: usize,
    /// Where the metadata starts: the payload's end rounded up to 8.
    pub(crate) meta: usize,
    /// The row's length: a multiple of 16.
    pub(crate) stride: usize,
    /// The combine's rows (a token's bf16 partial): `stride` in the native
    /// format, `hidden × size_of::<T>()` rounded up to 16 in the FP8 one.
    pub(crate) back_stride: usize,
    pub(crate) top_k: usize,
    /// The FP8 format.
    pub(crate) fp8: bool,
}

impl Wire {
    pub(super) fn new<T: Element>(c: &MoeConfig) -> Wire {
        Wire::of(c, size_of::<T>()).expect("checked by MoeConfig::check")
    }

    /// The wire row of `c` for elements of `elem` bytes, or `None` when its
    /// sizes overflow.
    pub(super) fn of(c: &MoeConfig, elem: usize) -> Option<Wire> {
        let row = c.hidden.checked_mul(elem)?;
        let fp8 = c.format == WireFormat::E4m3;
        let (data, scales, end) = if fp8 {
            let scales = c.hidden.checked_next_multiple_of(4)?;
            (c.hidden, scales, scales.checked_add(4 * c.scales_per_token())?)
        } else {
            (row, 0, row)
        };
        let meta = end.checked_next_multiple_of(8)?;
        let stride =
            meta.checked_add(8usize.checked_add(8usize.checked_mul(c.top_k)?)?)?.checked_next_multiple_of(16)?;
        let back_stride = if fp8 { row.checked_next_multiple_of(16)? } else { stride };
        Some(Wire { data, scales, meta, stride, back_stride, top_k: c.top_k, fp8 })
    }

    pub(super) fn token(&self, row: &[u8]) -> usize {
        i64::from_ne_bytes(row[self.meta..self.meta + 8].try_into().expect("8 bytes")) as usize
    }

    /// The (source PE, token) of a row of the node-aware form, whose token
    /// field carries its source in the high 32 bits (see [`ORIGIN_SHIFT`]).
    pub(super) fn origin(&self, row: &[u8]) -> (usize, usize) {
        let field = self.token(row);
        (field >> ORIGIN_SHIFT, field & ((1 << ORIGIN_SHIFT) - 1))
    }

    /// Slot `j`: the destination's local expert (or -1) and the weight.
    pub(super) fn slot(&self, row: &[u8], j: usize) -> (i32, f32) {
        let at = self.meta + 8 + 8 * j;
        let e = i32::from_ne_bytes(row[at..at + 4].try_into().expect("4 bytes"));
        (e, f32::from_ne_bytes(row[at + 4..at + 8].try_into().expect("4 bytes")))
    }

    pub(super) fn set_meta(&self, row: &mut [u8], token: usize, slots: impl Iterator<Item = (i32, f32)>) {
        row[self.meta..self.meta + 8].copy_from_slice(&(token as i64).to_ne_bytes());
        for (j, (e, w)) in slots.enumerate() {
            let at = self.meta + 8 + 8 * j;
            row[at..at + 4].copy_from_slice(&e.to_ne_bytes());
            row[at + 4..at + 8].copy_from_slice(&w.to_ne_bytes());
        }
    }
}

/// Where the node-aware form's wire rows keep their source PE in the token
/// field: above the token (tokens fit 31 bits, checked at construction).
pub(super) const ORIGIN_SHIFT: usize = 32;

/// The bytes of `xs`.
pub(super) fn bytes_of<T: Element>(xs: &[T]) -> &[u8] {
    // SAFETY: Element types are plain data without padding (the trait's
    // contract), so every byte of `xs` is initialised; u8 needs no alignment.
    unsafe { std::slice::from_raw_parts(xs.as_ptr().cast::<u8>(), size_of_val(xs)) }
}

/// Fills `out` from the first bytes of `bytes` (any alignment).
pub(super) fn read_elems<T: Element>(bytes: &[u8], out: &mut [T]) {
    let len = size_of_val(out);
    assert!(bytes.len() >= len, "a wire row holds the token's elements");
    // SAFETY: `bytes` holds `len` bytes (checked) and does not overlap
    // `out`; every bit pattern is a value of an Element type; the copy is
    // bytewise, so the source needs no alignment.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().cast::<u8>(), len) }
}

/// The element types [`MoeAllToAll::combine`](super::MoeAllToAll::combine) can weigh: the floats. Sums
/// run in [`Element::Acc`]: `f32` for `f16` and `bf16`.
pub trait CombineElement: Element + sealed::Sealed {
    /// `acc + weight × x`, in the accumulator's type (not fused).
    #[doc(hidden)]
    fn weigh(acc: Self::Acc, weight: f32, x: Self) -> Self::Acc;
    /// `acc + x`, in the accumulator's type.
    #[doc(hidden)]
    fn add(acc: Self::Acc, x: Self) -> Self::Acc;
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
            fn add(acc: $acc, x: $t) -> $acc {
                acc + x.to_acc()
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
