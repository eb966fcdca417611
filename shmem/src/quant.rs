//! Block-scaled FP8 quantization: the reference that an FP8 dispatch
//! matches bit for bit.
//!
//! As DeepEP's FP8 dispatch, and what FP8 grouped GEMMs take: the data is
//! cut into groups of [`GROUP`] consecutive elements (the last one shorter
//! when the length is not a multiple), each group gets one `f32` scale, and
//! each element is stored as e4m3:
//!
//! - `amax` = the largest `|x|` of the group (NaNs ignored, as `fmaxf`
//!   does);
//! - `scale = amax / 448` (one IEEE `f32` division, rounded to nearest);
//!   where that is zero (an all-zero group, or `amax` below 448 × the
//!   smallest `f32` subnormal) the scale is **1**, so the group's values
//!   quantize to (signed) zeros and dequantize to exactly zero;
//! - `q = e4m3(x / scale)`: one IEEE `f32` division, then
//!   [`fp8_e4m3::from_f32`] (round to nearest even, saturating at ±448).
//!   `x / scale` can exceed 448 by a rounding of `scale`: the saturation
//!   takes it back to 448. A NaN quotient is code `0x7f` whatever its
//!   sign: the sign of a NaN that arithmetic makes is the machine's (x86
//!   sets it for `inf / inf`, a GPU does not).
//! - dequantized `x' = f32(q) × scale` (one `f32` multiplication), then
//!   rounded to the output type (RNE for bf16).
//!
//! A group holding an infinity has an infinite scale: its finite elements
//! quantize to zeros and the infinities to NaN, as in DeepEP's kernels
//! (there the scale's inverse is 0 and `inf × 0` is NaN).
//!
//! A device kernel matches this bit for bit if it computes `amax` exactly
//! (a maximum is), divides with IEEE rounding (`__fdiv_rn`, not
//! `--use_fast_math`'s approximate division) and converts with
//! `__NV_SATFINITE`.

use crate::error::{Error, Result};
use crate::fp8::fp8_e4m3;
use half::{bf16, f16};

/// Elements per scale.
pub const GROUP: usize = 128;

/// The largest finite e4m3 value, which a group's `amax` maps to.
pub const E4M3_MAX: f32 = 448.0;

/// The types quantization reads and dequantization writes.
pub trait Unquantized: Copy {
    /// The value, exactly.
    fn to_f32(self) -> f32;
    /// `x` rounded to this type (to nearest, ties to even).
    fn from_f32(x: f32) -> Self;
}

impl Unquantized for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> f32 {
        x
    }
}

macro_rules! half_unquantized {
    ($t:ty) => {
        impl Unquantized for $t {
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
            fn from_f32(x: f32) -> Self {
                <$t>::from_f32(x)
            }
        }
    };
}
half_unquantized!(bf16);
half_unquantized!(f16);

/// Scales for `len` elements: one a group.
pub const fn scales_len(len: usize) -> usize {
    len.div_ceil(GROUP)
}

/// The scale of one group (see the [module docs](self)).
pub fn group_scale(group: &[impl Unquantized]) -> f32 {
    let amax = group.iter().fold(0f32, |m, x| m.max(x.to_f32().abs()));
    let scale = amax / E4M3_MAX;
    if scale == 0.0 {
        1.0
    } else {
        scale
    }
}

/// The code of `x` in a group of scale `scale`.
fn quantize_one(x: f32, scale: f32) -> fp8_e4m3 {
    let y = x / scale;
    if y.is_nan() {
        fp8_e4m3::from_bits(0x7f)
    } else {
        fp8_e4m3::from_f32(y)
    }
}

/// Quantizes `x` into `q` (as many elements) and `scales`
/// ([`scales_len`]`(x.len())` of them).
///
/// # Errors
/// [`Error::LengthMismatch`] when `q` or `scales` have other lengths.
pub fn quantize<T: Unquantized>(x: &[T], q: &mut [fp8_e4m3], scales: &mut [f32]) -> Result<()> {
    check_lengths("quantize", x.len(), q.len(), scales.len())?;
    for ((xs, qs), scale) in x.chunks(GROUP).zip(q.chunks_mut(GROUP)).zip(scales.iter_mut()) {
        *scale = group_scale(xs);
        for (o, &v) in qs.iter_mut().zip(xs) {
            *o = quantize_one(v.to_f32(), *scale);
        }
    }
    Ok(())
}

/// Writes into `x` the values `q` and `scales` stand for.
///
/// # Errors
/// [`Error::LengthMismatch`] when `q` or `scales` do not fit `x`.
pub fn dequantize<T: Unquantized>(q: &[fp8_e4m3], scales: &[f32], x: &mut [T]) -> Result<()> {
    check_lengths("dequantize", x.len(), q.len(), scales.len())?;
    for ((xs, qs), &scale) in x.chunks_mut(GROUP).zip(q.chunks(GROUP)).zip(scales) {
        for (o, &v) in xs.iter_mut().zip(qs) {
            *o = T::from_f32(v.to_f32() * scale);
        }
    }
    Ok(())
}

/// [`quantize`] into new vectors: the codes and the scales.
pub fn quantize_vec<T: Unquantized>(x: &[T]) -> (Vec<fp8_e4m3>, Vec<f32>) {
    let (mut q, mut scales) = (vec![fp8_e4m3::default(); x.len()], vec![0.0; scales_len(x.len())]);
    quantize(x, &mut q, &mut scales).expect("lengths made to fit");
    (q, scales)
}

/// [`dequantize`] into a new vector.
///
/// # Errors
/// [`Error::LengthMismatch`] when `scales` do not fit `q`.
pub fn dequantize_vec<T: Unquantized + Default>(q: &[fp8_e4m3], scales: &[f32]) -> Result<Vec<T>> {
    let mut x = vec![T::default(); q.len()];
    dequantize(q, scales, &mut x)?;
    Ok(x)
}

fn check_lengths(what: &str, len: usize, codes: usize, scales: usize) -> Result<()> {
    if codes != len || scales != scales_len(len) {
        return Err(Error::LengthMismatch(format!(
            "{what}: {len} values want {len} codes and {} scales (one per {GROUP}), got {codes} and {scales}",
            scales_len(len)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic spread of magnitudes and signs (a small LCG).
    fn values(n: usize, seed: u64, magnitude: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
                let e = ((s >> 20) % 16) as i32 - 8;
                (u * 2.0 - 1.0) * magnitude * 2f32.powi(e)
            })
            .collect()
    }

    /// The group's largest element maps to ±448 and the scale is amax/448.
    #[test]
    fn scales_follow_the_group_maximum() {
        let mut x = values(300, 1, 0.1); // |x| < 0.1 × 2^8
        x[17] = -50.0; // the first group's amax
        let (q, scales) = quantize_vec(&x);
        assert_eq!(scales.len(), 3);
        assert_eq!(scales[0], 50.0 / 448.0);
        assert_eq!(q[17].to_bits(), 0xfe, "-amax quantizes to -448");
        for (g, s) in scales.iter().enumerate() {
            let group = &x[g * GROUP..((g + 1) * GROUP).min(x.len())];
            let amax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(*s, amax / 448.0, "group {g}");
        }
    }

    /// Each element is the e4m3 rounding of x/scale, so the dequantized
    /// value is within half an e4m3 step (relative 2⁻⁴ for normals, 2⁻⁹ ×
    /// scale absolute for subnormals) of x.
    fn round_trip_within_rounding<T: Unquantized + Default + std::fmt::Debug>(x: &[T], output_ulp: f32) {
        let (q, scales) = quantize_vec(x);
        let back: Vec<f32> = dequantize_vec::<f32>(&q, &scales).unwrap();
        let back_t: Vec<T> = dequantize_vec(&q, &scales).unwrap();
        for (i, ((&v, &b), &bt)) in x.iter().zip(&back).zip(&back_t).enumerate() {
            let (v, s) = (v.to_f32(), scales[i / GROUP]);
            let bound = (v.abs() * 2f32.powi(-4)).max(s * 2f32.powi(-10)) * (1.0 + 1e-6);
            assert!((b - v).abs() <= bound, "{i}: {v} came back as {b} (scale {s})");
            assert_eq!(q[i], fp8_e4m3::from_f32(v / s), "{i}");
            let rounded = T::from_f32(b).to_f32();
            assert_eq!(bt.to_f32(), rounded, "{i}: the output type's rounding of the f32 result");
            // Plus half an f16 subnormal step, where f16 results get that small.
            assert!((rounded - b).abs() <= b.abs() * output_ulp + 2f32.powi(-25));
        }
    }

    #[test]
    fn round_trips_f32_and_bf16() {
        for (seed, magnitude) in [(2, 1.0), (3, 1e-3), (4, 1e4), (5, 1e-20)] {
            let x = values(1000, seed, magnitude);
            round_trip_within_rounding(&x, 0.0);
            let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            round_trip_within_rounding(&xb, 2f32.powi(-8));
            let xh: Vec<f16> = values(1000, seed, 1.0).iter().map(|&v| f16::from_f32(v)).collect();
            round_trip_within_rounding(&xh, 2f32.powi(-11));
        }
    }

    /// Values that are e4m3 codes times a power-of-two scale come back exactly.
    #[test]
    fn representable_values_are_exact() {
        let codes: Vec<f32> =
            (0..=255u8).map(|c| fp8_e4m3::from_bits(c).to_f32()).filter(|v| !v.is_nan()).take(GROUP).collect();
        // Each group holds +448 (code 0x7e) so its scale is exactly 2^k.
        for k in [-20, -3, 0, 5] {
            let mut x: Vec<f32> = codes.iter().map(|v| v * 2f32.powi(k)).collect();
            x[1] = 448.0 * 2f32.powi(k);
            let (q, scales) = quantize_vec(&x);
            assert_eq!(scales[0], 2f32.powi(k));
            assert_eq!(dequantize_vec::<f32>(&q, &scales).unwrap(), x);
        }
    }

    #[test]
    fn zero_groups_nans_and_infinities() {
        let mut x = vec![0f32; 2 * GROUP + 5];
        x[3] = -0.0;
        x[GROUP] = 2.0;
        x[GROUP + 1] = f32::NAN;
        x[2 * GROUP] = f32::INFINITY;
        x[2 * GROUP + 1] = 1.0;
        let (q, scales) = quantize_vec(&x);
        assert_eq!(scales, [1.0, 2.0 / 448.0, f32::INFINITY], "zero group: scale 1; NaN ignored");
        assert!(q[..GROUP].iter().enumerate().all(|(i, c)| c.to_bits() == if i == 3 { 0x80 } else { 0 }));
        assert_eq!(q[GROUP].to_bits(), 0x7e);
        assert_eq!(q[GROUP + 1].to_bits(), 0x7f, "NaN: the positive NaN");
        assert_eq!(q[2 * GROUP].to_bits(), 0x7f, "inf / inf: the positive NaN");
        assert_eq!(q[2 * GROUP + 1].to_bits(), 0, "finite / inf");
        let back = dequantize_vec::<f32>(&q, &scales).unwrap();
        assert!(back[..GROUP].iter().all(|&v| v == 0.0));
        assert_eq!(back[GROUP], 2.0);
        // A tiny non-zero amax whose scale would underflow: scale 1.
        assert_eq!(group_scale(&[f32::from_bits(1)]), 1.0);
    }

    #[test]
    fn lengths_are_checked() {
        let x = vec![1f32; GROUP + 1];
        let mut q = vec![fp8_e4m3::default(); GROUP + 1];
        assert!(matches!(quantize(&x, &mut q, &mut [0.0; 1]), Err(Error::LengthMismatch(_))));
        assert!(matches!(quantize(&x, &mut q[..GROUP], &mut [0.0; 2]), Err(Error::LengthMismatch(_))));
        assert!(quantize(&x, &mut q, &mut [0.0; 2]).is_ok());
        assert!(matches!(dequantize_vec::<bf16>(&q, &[1.0]), Err(Error::LengthMismatch(_))));
        let (q, s) = quantize_vec::<f32>(&[]);
        assert!(q.is_empty() && s.is_empty());
    }
}
