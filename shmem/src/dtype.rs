//! Element types that may live in symmetric memory, and reductions over them.

use crate::fp8::{fp8_e4m3, fp8_e5m2};
use half::{bf16, f16};
use std::fmt;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

/// The element types of symmetric buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    F32 = 1,
    F64,
    F16,
    BF16,
    I32,
    I64,
    U32,
    U64,
    U8,
    I8,
    /// OCP FP8 E4M3 ("fn"): a storage type ([`fp8_e4m3`]).
    F8E4M3,
    /// OCP FP8 E5M2: a storage type ([`fp8_e5m2`]).
    F8E5M2,
}

impl DType {
    /// Every element type.
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U64,
        DType::U8,
        DType::I8,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// The name users know the type by.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::F8E4M3 => "fp8_e4m3",
            DType::F8E5M2 => "fp8_e5m2",
        }
    }

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Size in bytes of the type reductions accumulate in
    /// ([`Element::Acc`]): `f32` for the 16- and 8-bit floats, the type
    /// itself otherwise.
    pub const fn acc_size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => 4,
            d => d.size(),
        }
    }

    pub(crate) fn from_tag(tag: u64) -> Option<DType> {
        DType::ALL.into_iter().find(|d| *d as u64 == tag)
    }

    /// Whether the type is an integer.
    pub const fn is_integer(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U32 | DType::U64 | DType::U8 | DType::I8)
    }

    /// Whether reductions are defined at all. Not for the 8-bit types:
    /// the FP8 formats are storage (a sum of FP8 values wants a wider
    /// result and a scale), and neither the device kernels nor NVSHMEM's
    /// bound entry points have 8-bit reductions, so `u8` and `i8` refuse
    /// them too, alike on every backend.
    pub const fn reduces(self) -> bool {
        !matches!(self, DType::U8 | DType::I8 | DType::F8E4M3 | DType::F8E5M2)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reduction operators of `all_reduce` and `reduce_scatter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    Sum = 1,
    Min,
    Max,
    Prod,
    /// Integers only.
    And,
    /// Integers only.
    Or,
    /// Integers only.
    Xor,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 7] =
        [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Prod, ReduceOp::And, ReduceOp::Or, ReduceOp::Xor];

    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Prod => "prod",
            ReduceOp::And => "and",
            ReduceOp::Or => "or",
            ReduceOp::Xor => "xor",
        }
    }

    /// Whether `op` is defined for elements of type `dtype`: the
    /// arithmetic ones for every type that [reduces](DType::reduces), the
    /// bitwise ones for its integers.
    pub const fn supports(self, dtype: DType) -> bool {
        dtype.reduces()
            && match self {
                ReduceOp::Sum | ReduceOp::Min | ReduceOp::Max | ReduceOp::Prod => true,
                ReduceOp::And | ReduceOp::Or | ReduceOp::Xor => dtype.is_integer(),
            }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type that may travel through symmetric memory.
///
/// # Safety
///
/// Implementors are plain data: `Copy`, no padding, every bit pattern a valid
/// value, and `DTYPE.size() == size_of::<Self>()`. The trait is sealed; the
/// crate implements it for the element types of [`DType`].
pub unsafe trait Element: sealed::Sealed + Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// The type reductions accumulate in (`f32` for the 16- and 8-bit
    /// floats).
    type Acc: Copy + Send + Sync;

    fn to_acc(self) -> Self::Acc;
    fn from_acc(acc: Self::Acc) -> Self;
    /// `a op b`; `op` must be supported by `DTYPE` (checked by the caller).
    fn combine(op: ReduceOp, a: Self::Acc, b: Self::Acc) -> Self::Acc;
}

macro_rules! float_element {
    ($t:ty, $d:expr, $acc:ty, $to:expr, $from:expr) => {
        impl sealed::Sealed for $t {}
        // SAFETY: IEEE floats and the FP8 newtypes (`repr(transparent)` over
        // a u8) are plain data of their stated size; any bits are a value.
        unsafe impl Element for $t {
            const DTYPE: DType = $d;
            type Acc = $acc;
            #[inline]
            fn to_acc(self) -> $acc {
                $to(self)
            }
            #[inline]
            fn from_acc(acc: $acc) -> Self {
                $from(acc)
            }
            #[inline]
            fn combine(op: ReduceOp, a: $acc, b: $acc) -> $acc {
                match op {
                    ReduceOp::Sum => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::And | ReduceOp::Or | ReduceOp::Xor => {
                        unreachable!("bitwise reduction on a float is rejected before reducing")
                    }
                }
            }
        }
    };
}

float_element!(f32, DType::F32, f32, |x| x, |x| x);
float_element!(f64, DType::F64, f64, |x| x, |x| x);
float_element!(f16, DType::F16, f32, f16::to_f32, f16::from_f32);
float_element!(bf16, DType::BF16, f32, bf16::to_f32, bf16::from_f32);
// Storage types: `ReduceOp::supports` refuses every reduction on them, so
// `combine` is never reached; the conversions serve the quantization code.
float_element!(fp8_e4m3, DType::F8E4M3, f32, fp8_e4m3::to_f32, fp8_e4m3::from_f32);
float_element!(fp8_e5m2, DType::F8E5M2, f32, fp8_e5m2::to_f32, fp8_e5m2::from_f32);

macro_rules! int_element {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        // SAFETY: primitive integers are plain data of their stated size.
        unsafe impl Element for $t {
            const DTYPE: DType = $d;
            type Acc = $t;
            #[inline]
            fn to_acc(self) -> $t {
                self
            }
            #[inline]
            fn from_acc(acc: $t) -> Self {
                acc
            }
            #[inline]
            fn combine(op: ReduceOp, a: $t, b: $t) -> $t {
                match op {
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::And => a & b,
                    ReduceOp::Or => a | b,
                    ReduceOp::Xor => a ^ b,
                }
            }
        }
    };
}

int_element!(i32, DType::I32);
int_element!(i64, DType::I64);
int_element!(u32, DType::U32);
int_element!(u64, DType::U64);
// Moved, not reduced (see `DType::reduces`).
int_element!(u8, DType::U8);
int_element!(i8, DType::I8);

/// `len` zero elements.
pub(crate) fn zeroed_vec<T: Element>(len: usize) -> Vec<T> {
    // SAFETY: all-zero bits are a valid value of every Element type (plain
    // data; see the trait's contract).
    vec![unsafe { std::mem::zeroed::<T>() }; len]
}

/// Integer element types that symmetric atomics operate on.
///
/// # Safety
///
/// `Atomic` has the size and alignment of `Self`, so a naturally aligned
/// element of symmetric memory may be viewed as one.
pub unsafe trait AtomicElement: Element + Eq {
    #[doc(hidden)]
    type Atomic: Send + Sync;
    #[doc(hidden)]
    fn atomic_op(a: &Self::Atomic, op: AtomicOp<Self>) -> Self;
}

/// One atomic read-modify-write (internal currency between the API and backends).
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum AtomicOp<T> {
    Fetch,
    Set(T),
    Swap(T),
    CompareSwap { current: T, new: T },
    FetchAdd(T),
    FetchAnd(T),
    FetchOr(T),
    FetchXor(T),
}

macro_rules! atomic_element {
    ($t:ty, $a:ty) => {
        // SAFETY: `$a` has the same size and alignment as `$t` (std guarantees it).
        unsafe impl AtomicElement for $t {
            type Atomic = $a;
            #[inline]
            fn atomic_op(a: &$a, op: AtomicOp<$t>) -> $t {
                // SeqCst: a remote atomic must order with the puts and signals
                // around it, as NVSHMEM's do.
                let o = Ordering::SeqCst;
                match op {
                    AtomicOp::Fetch => a.load(o),
                    AtomicOp::Set(v) => {
                        a.store(v, o);
                        v
                    }
                    AtomicOp::Swap(v) => a.swap(v, o),
                    AtomicOp::CompareSwap { current, new } => match a.compare_exchange(current, new, o, o) {
                        Ok(v) | Err(v) => v,
                    },
                    AtomicOp::FetchAdd(v) => a.fetch_add(v, o),
                    AtomicOp::FetchAnd(v) => a.fetch_and(v, o),
                    AtomicOp::FetchOr(v) => a.fetch_or(v, o),
                    AtomicOp::FetchXor(v) => a.fetch_xor(v, o),
                }
            }
        }
    };
}

atomic_element!(u32, AtomicU32);
atomic_element!(u64, AtomicU64);
atomic_element!(i32, AtomicI32);
atomic_element!(i64, AtomicI64);

#[cfg(test)]
mod tests {
    use super::*;

    /// The `Element` contract, as far as a test can see it: the stated size,
    /// a tag that round-trips, all-zero and arbitrary bytes are values.
    fn plain_data<T: Element>() {
        let d = T::DTYPE;
        assert_eq!(d.size(), std::mem::size_of::<T>(), "{d}");
        assert_eq!(d.acc_size(), std::mem::size_of::<T::Acc>(), "{d}");
        assert_eq!(DType::from_tag(d as u64), Some(d));
        let zeros = zeroed_vec::<T>(3);
        // SAFETY: three initialised elements, viewed as their bytes.
        let bytes = unsafe { std::slice::from_raw_parts(zeros.as_ptr().cast::<u8>(), 3 * d.size()) };
        assert!(bytes.iter().all(|&b| b == 0), "{d}");
        let pattern: Vec<u8> = (0..=255).collect();
        for at in (0..pattern.len() - d.size()).step_by(d.size()) {
            // SAFETY: in bounds; any bit pattern is a value of T (the contract).
            let x: T = unsafe { pattern.as_ptr().add(at).cast::<T>().read_unaligned() };
            std::hint::black_box(x);
        }
    }

    #[test]
    fn elements_are_plain_data() {
        plain_data::<f32>();
        plain_data::<f64>();
        plain_data::<f16>();
        plain_data::<bf16>();
        plain_data::<i32>();
        plain_data::<i64>();
        plain_data::<u32>();
        plain_data::<u64>();
        plain_data::<u8>();
        plain_data::<i8>();
        plain_data::<fp8_e4m3>();
        plain_data::<fp8_e5m2>();
        assert_eq!(DType::from_tag(0), None);
        assert_eq!(DType::from_tag(13), None);
    }

    fn reduce<T: Element>(op: ReduceOp, xs: &[T]) -> T {
        T::from_acc(xs[1..].iter().fold(xs[0].to_acc(), |acc, &x| T::combine(op, acc, x.to_acc())))
    }

    #[test]
    fn reductions_accumulate_and_wrap() {
        let h = |x: f32| f16::from_f32(x);
        assert_eq!(reduce(ReduceOp::Sum, &[h(0.5), h(1.25), h(-2.0)]), h(-0.25));
        let b = |x: f32| bf16::from_f32(x);
        assert_eq!(reduce(ReduceOp::Max, &[b(-1.0), b(3.0), b(2.0)]), b(3.0));
        assert_eq!(reduce(ReduceOp::Prod, &[2.0f64, -3.0, 0.5]), -3.0);
        assert_eq!(reduce(ReduceOp::Sum, &[u32::MAX, 2]), 1);
        assert_eq!(reduce(ReduceOp::Prod, &[i64::MAX, 2]), -2);
        assert_eq!(reduce(ReduceOp::Min, &[3i32, -7, 5]), -7);
        assert_eq!(reduce(ReduceOp::Xor, &[0b1100u64, 0b1010, 0b0001]), 0b0111);
        assert_eq!(reduce(ReduceOp::And, &[0b1100u32, 0b1010]), 0b1000);
        assert_eq!(reduce(ReduceOp::Or, &[0b1100i32, 0b1010]), 0b1110);
    }

    #[test]
    fn eight_bit_types_move_but_do_not_reduce() {
        for d in DType::ALL {
            let eight = d.size() == 1;
            assert_eq!(d.reduces(), !eight, "{d}");
            for op in ReduceOp::ALL {
                let bitwise = matches!(op, ReduceOp::And | ReduceOp::Or | ReduceOp::Xor);
                assert_eq!(op.supports(d), !eight && (!bitwise || d.is_integer()), "{op} on {d}");
            }
        }
        assert!(DType::U8.is_integer() && !DType::F8E4M3.is_integer());
        assert_eq!(fp8_e4m3::from_f32(3.0).to_acc(), 3.0);
        assert_eq!(fp8_e5m2::from_acc(-0.75), fp8_e5m2::from_f32(-0.75));
    }

    /// An element of a buffer, viewed as its atomic as `Context::atomic_*`
    /// views symmetric memory.
    fn atomics<T: AtomicElement + From<u8>>() {
        let n = |x: u8| T::from(x);
        let mut buf = vec![n(0), n(5), n(0)];
        let p: *mut T = &mut buf[1];
        // SAFETY: `p` is an aligned, live element; `T::Atomic` has T's
        // layout (the trait's contract); `buf` is not used while `a` lives.
        let a = unsafe { &*p.cast::<T::Atomic>() };
        assert_eq!(T::atomic_op(a, AtomicOp::Fetch), n(5));
        assert_eq!(T::atomic_op(a, AtomicOp::FetchAdd(n(3))), n(5));
        assert_eq!(T::atomic_op(a, AtomicOp::CompareSwap { current: n(7), new: n(1) }), n(8));
        assert_eq!(T::atomic_op(a, AtomicOp::CompareSwap { current: n(8), new: n(12) }), n(8));
        assert_eq!(T::atomic_op(a, AtomicOp::FetchAnd(n(0b0110))), n(12));
        assert_eq!(T::atomic_op(a, AtomicOp::FetchOr(n(0b1001))), n(0b0100));
        assert_eq!(T::atomic_op(a, AtomicOp::FetchXor(n(0b0001))), n(0b1101));
        assert_eq!(T::atomic_op(a, AtomicOp::Swap(n(9))), n(0b1100));
        assert_eq!(T::atomic_op(a, AtomicOp::Set(n(2))), n(2));
        assert_eq!(buf, [n(0), n(2), n(0)], "{}: only the element changed", T::DTYPE);
    }

    #[test]
    fn atomics_on_a_buffer_element() {
        atomics::<u32>();
        atomics::<u64>();
        atomics::<i32>();
        atomics::<i64>();
    }
}
