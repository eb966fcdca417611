//! The OCP 8-bit floating-point formats as storage types, with bit-exact
//! conversions from and to `f32`.
//!
//! - [`fp8_e4m3`]: 4 exponent bits (bias 7), 3 mantissa bits, the "fn"
//!   variant: no infinities, one NaN pattern per sign (`S.1111.111`),
//!   largest finite ±448, smallest subnormal 2⁻⁹.
//! - [`fp8_e5m2`]: 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like:
//!   ±infinity (`S.11111.00`), NaN (`S.11111.{01,10,11}`), largest finite
//!   ±57344, smallest subnormal 2⁻¹⁶.
//!
//! Both encoders round to nearest, ties to even, and **saturate**: a finite
//! value beyond the largest finite one, and an infinity, become the largest
//! finite value of its sign (CUDA's `__NV_SATFINITE`, what FP8 GEMM inputs
//! use; e5m2 so never produces an infinity from a conversion, though it
//! decodes one). A NaN stays a NaN of the same sign, in the canonical
//! pattern `S.1111111` of both formats. These are storage types: symmetric
//! memory moves them, reductions refuse them.

use std::fmt;

/// One 8-bit float format: its field widths and special codes (sign bit
/// clear).
struct Format {
    mantissa_bits: u32,
    bias: i32,
    /// The largest finite value's code.
    max_code: u8,
    /// The canonical NaN.
    nan_code: u8,
    /// Whether `S.1…1.00` is an infinity (e5m2) rather than a finite value.
    has_inf: bool,
}

const E4M3: Format = Format { mantissa_bits: 3, bias: 7, max_code: 0x7e, nan_code: 0x7f, has_inf: false };
const E5M2: Format = Format { mantissa_bits: 2, bias: 15, max_code: 0x7b, nan_code: 0x7f, has_inf: true };

/// `2^k` for the `k` an f32 holds as a normal number.
fn pow2(k: i32) -> f32 {
    debug_assert!((-126..=127).contains(&k));
    f32::from_bits(((k + 127) as u32) << 23)
}

/// `v >> s`, rounded to nearest, ties to even (`0 < s < 32`).
fn shift_rne(v: u32, s: u32) -> u32 {
    let (q, rem, half) = (v >> s, v & ((1 << s) - 1), 1 << (s - 1));
    q + u32::from(rem > half || (rem == half && q & 1 == 1))
}

impl Format {
    fn decode(&self, code: u8) -> f32 {
        let m = self.mantissa_bits;
        let sign = u32::from(code & 0x80) << 24;
        let exp = i32::from((code & 0x7f) >> m);
        let mant = u32::from(code) & ((1 << m) - 1);
        let top = (1 << (7 - m)) - 1;
        if code & 0x7f == self.nan_code || (self.has_inf && exp == top && mant != 0) {
            return f32::from_bits(sign | 0x7fc0_0000);
        }
        if self.has_inf && exp == top {
            return f32::from_bits(sign | 0x7f80_0000);
        }
        let magnitude = if exp == 0 {
            // Subnormal: mant × 2^(1 − bias − m), exact in f32.
            mant as f32 * pow2(1 - self.bias - m as i32)
        } else {
            f32::from_bits((((exp - self.bias + 127) as u32) << 23) | (mant << (23 - m)))
        };
        f32::from_bits(sign | magnitude.to_bits())
    }

    fn encode(&self, x: f32) -> u8 {
        let bits = x.to_bits();
        let sign = ((bits >> 24) & 0x80) as u8;
        let abs = bits & 0x7fff_ffff;
        if abs > 0x7f80_0000 {
            return sign | self.nan_code;
        }
        let max = self.decode(self.max_code);
        if f32::from_bits(abs) >= max {
            // Saturation; infinities included.
            return sign | self.max_code;
        }
        let m = self.mantissa_bits;
        let min_normal_exp = 1 - self.bias;
        let exp = (abs >> 23) as i32 - 127;
        let code = if exp >= min_normal_exp {
            // Rebias the exponent and round the mantissa's low bits away: a
            // carry out of the mantissa steps the exponent, as it should.
            let rebiased = abs - (((127 - self.bias) as u32) << 23);
            shift_rne(rebiased, 23 - m)
        } else {
            // Below the normal range (f32 subnormals included): a multiple
            // of the subnormal quantum. The quotient is exact (a power of two
            // scales up), so only the rounding to an integer rounds; a
            // result of 2^m is the smallest normal's code, as it should be.
            let quantum = pow2(min_normal_exp - m as i32);
            (f32::from_bits(abs) / quantum).round_ties_even() as u32
        };
        // Below `max`, rounding reaches at most `max` itself.
        sign | code.min(u32::from(self.max_code)) as u8
    }
}

macro_rules! fp8_type {
    ($t:ident, $format:expr, $doc:literal) => {
        #[doc = $doc]
        ///
        /// A storage type: its equality (`==`, `Eq`, `Hash`) compares
        /// encodings, so `+0 != -0` and a NaN equals itself, which is what
        /// moving data exactly needs. Compare values through
        /// [`to_f32`](Self::to_f32).
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
        #[repr(transparent)]
        pub struct $t(u8);

        impl $t {
            /// The value with this encoding.
            pub const fn from_bits(bits: u8) -> Self {
                $t(bits)
            }

            /// The encoding.
            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// The nearest value to `x`, ties to even, saturating (see the
            /// [module docs](crate::fp8)).
            pub fn from_f32(x: f32) -> Self {
                $t($format.encode(x))
            }

            /// The value, exactly.
            pub fn to_f32(self) -> f32 {
                $format.decode(self.0)
            }

            /// Whether the value is a NaN.
            pub fn is_nan(self) -> bool {
                self.to_f32().is_nan()
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}({:#04x})", self.to_f32(), self.0)
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }

        impl From<$t> for f32 {
            fn from(x: $t) -> f32 {
                x.to_f32()
            }
        }
    };
}

fp8_type!(
    fp8_e4m3,
    E4M3,
    "An OCP FP8 E4M3 (\"fn\") number: no infinities, one NaN per sign, finite values up to ±448."
);
fp8_type!(fp8_e5m2, E5M2, "An OCP FP8 E5M2 number: IEEE-like, with infinities and NaNs, finite values up to ±57344.");

impl fp8_e4m3 {
    /// The largest finite value, 448.
    pub const MAX: fp8_e4m3 = fp8_e4m3(0x7e);
}

impl fp8_e5m2 {
    /// The largest finite value, 57344.
    pub const MAX: fp8_e5m2 = fp8_e5m2(0x7b);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e4(x: f32) -> u8 {
        fp8_e4m3::from_f32(x).to_bits()
    }
    fn e5(x: f32) -> u8 {
        fp8_e5m2::from_f32(x).to_bits()
    }

    /// Decoding then encoding every code gives it back, NaNs in their
    /// canonical form; the decoded values increase with the code on each
    /// side of zero.
    fn every_code_round_trips(decode: impl Fn(u8) -> f32, encode: impl Fn(f32) -> u8, max: f32) {
        let mut previous = -1.0f32;
        for code in 0..=255u8 {
            let x = decode(code);
            if x.is_nan() {
                assert_eq!(encode(x), (code & 0x80) | 0x7f, "{code:#04x}");
                assert_eq!(x.is_sign_negative(), code & 0x80 != 0, "{code:#04x}");
                continue;
            }
            if x.is_infinite() {
                // Saturating: an infinity encodes as the largest finite value.
                assert_eq!(encode(x), (code & 0x80) | encode(max), "{code:#04x}");
                continue;
            }
            assert_eq!(encode(x), code, "{code:#04x} decodes to {x}");
            assert_eq!(x.is_sign_negative(), code & 0x80 != 0, "{code:#04x}: the sign, zeros included");
            if code < 0x80 {
                assert!(code == 0 || x > previous, "{code:#04x}: {x} after {previous}");
                previous = x;
                assert_eq!(decode(code | 0x80), -x, "{code:#04x}");
            }
        }
    }

    #[test]
    fn e4m3_every_code() {
        every_code_round_trips(|c| fp8_e4m3::from_bits(c).to_f32(), e4, 448.0);
        let nans: Vec<u8> = (0..=255u8).filter(|&c| fp8_e4m3::from_bits(c).is_nan()).collect();
        assert_eq!(nans, [0x7f, 0xff]);
        assert_eq!(fp8_e4m3::MAX.to_f32(), 448.0);
        assert_eq!(fp8_e4m3::from_bits(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(fp8_e4m3::from_bits(0x07).to_f32(), 7.0 * 2f32.powi(-9));
        assert_eq!(fp8_e4m3::from_bits(0x08).to_f32(), 2f32.powi(-6));
        assert_eq!(fp8_e4m3::from_bits(0x38).to_f32(), 1.0);
    }

    #[test]
    fn e5m2_every_code() {
        every_code_round_trips(|c| fp8_e5m2::from_bits(c).to_f32(), e5, 57344.0);
        let nans: Vec<u8> = (0..=255u8).filter(|&c| fp8_e5m2::from_bits(c).is_nan()).collect();
        assert_eq!(nans, [0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff]);
        assert_eq!(fp8_e5m2::from_bits(0x7c).to_f32(), f32::INFINITY);
        assert_eq!(fp8_e5m2::from_bits(0xfc).to_f32(), f32::NEG_INFINITY);
        assert_eq!(fp8_e5m2::MAX.to_f32(), 57344.0);
        assert_eq!(fp8_e5m2::from_bits(0x01).to_f32(), 2f32.powi(-16));
        assert_eq!(fp8_e5m2::from_bits(0x04).to_f32(), 2f32.powi(-14));
        assert_eq!(fp8_e5m2::from_bits(0x3c).to_f32(), 1.0);
    }

    /// The neighbours of a positive f32 (`f32::next_up` is newer than the
    /// crate's minimum Rust).
    fn above(x: f32) -> f32 {
        f32::from_bits(x.to_bits() + 1)
    }
    fn below(x: f32) -> f32 {
        f32::from_bits(x.to_bits() - 1)
    }

    /// Every value halfway between two neighbouring codes rounds to the one
    /// with the even code, and values just off halfway to the nearer one.
    fn ties_to_even(decode: impl Fn(u8) -> f32, encode: impl Fn(f32) -> u8, max_code: u8) {
        for code in 0..max_code {
            let (lo, hi) = (decode(code), decode(code + 1));
            let mid = (lo + hi) / 2.0; // exact: both are short binary fractions
            assert!(lo < mid && mid < hi);
            let even = if code % 2 == 0 { code } else { code + 1 };
            assert_eq!(encode(mid), even, "tie {mid} between {code:#04x} and {:#04x}", code + 1);
            assert_eq!(encode(-mid), 0x80 | even, "tie -{mid}");
            assert_eq!(encode(below(mid)), code, "just below {mid}");
            assert_eq!(encode(above(mid)), code + 1, "just above {mid}");
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        ties_to_even(|c| fp8_e4m3::from_bits(c).to_f32(), e4, 0x7e);
        ties_to_even(|c| fp8_e5m2::from_bits(c).to_f32(), e5, 0x7b);
        // Spot checks by hand: 1 + 1/16 lies halfway between 1 (0x38) and
        // 1.125 (0x39) in e4m3, 1 + 1/8 between 1 (0x3c) and 1.25 in e5m2.
        assert_eq!(e4(1.0625), 0x38);
        assert_eq!(e4(1.1875), 0x3a);
        assert_eq!(e5(1.125), 0x3c);
        assert_eq!(e5(1.375), 0x3e);
        // A carry out of the mantissa steps the exponent: 1.96875 → 2.
        assert_eq!(e4(1.96875), 0x40);
    }

    #[test]
    fn saturation_infinities_and_nans() {
        for x in [448.0, 449.0, 464.0, 465.0, 480.0, 1e6, f32::MAX, f32::INFINITY] {
            assert_eq!(e4(x), 0x7e, "{x}");
            assert_eq!(e4(-x), 0xfe, "-{x}");
        }
        for x in [57344.0, 61439.0, 61440.0, 65536.0, f32::MAX, f32::INFINITY] {
            assert_eq!(e5(x), 0x7b, "{x}");
            assert_eq!(e5(-x), 0xfb, "-{x}");
        }
        // Below the largest value rounding stays finite and nearest.
        assert_eq!(e4(447.0), 0x7e);
        assert_eq!(e4(432.0), 0x7e); // tie between 416 (0x7d) and 448 (0x7e): even
        assert_eq!(e4(431.0), 0x7d);
        for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7f80_0001), f32::from_bits(0xffbf_ffff)] {
            let sign = if nan.is_sign_negative() { 0x80 } else { 0 };
            assert_eq!(e4(nan), sign | 0x7f, "{:#x}", nan.to_bits());
            assert_eq!(e5(nan), sign | 0x7f, "{:#x}", nan.to_bits());
        }
    }

    #[test]
    fn subnormals_and_signed_zeros() {
        assert_eq!(e4(0.0), 0x00);
        assert_eq!(e4(-0.0), 0x80);
        assert_eq!(e5(-0.0), 0x80);
        assert!(fp8_e4m3::from_bits(0x80).to_f32().is_sign_negative());
        // Half the smallest subnormal is a tie with zero: even, so zero.
        assert_eq!(e4(2f32.powi(-10)), 0x00);
        assert_eq!(e4(-(2f32.powi(-10))), 0x80);
        assert_eq!(e4(above(2f32.powi(-10))), 0x01);
        assert_eq!(e5(2f32.powi(-17)), 0x00);
        assert_eq!(e5(above(2f32.powi(-17))), 0x01);
        // 1.5 quanta: a tie between 1 and 2, to 2.
        assert_eq!(e4(1.5 * 2f32.powi(-9)), 0x02);
        // The largest subnormal rounds up into the smallest normal.
        assert_eq!(e4(7.5 * 2f32.powi(-9)), 0x08);
        assert_eq!(e5(3.5 * 2f32.powi(-16)), 0x04);
        // f32 subnormals and tiny normals flush to signed zeros.
        for x in [f32::from_bits(1), f32::MIN_POSITIVE, 1e-30] {
            assert_eq!(e4(x), 0x00);
            assert_eq!(e4(-x), 0x80);
            assert_eq!(e5(x), 0x00);
        }
    }

    #[test]
    fn formatting() {
        assert_eq!(format!("{:?}", fp8_e4m3::from_f32(1.5)), "1.5(0x3c)");
        assert_eq!(fp8_e5m2::from_f32(-2.0).to_string(), "-2");
    }
}
