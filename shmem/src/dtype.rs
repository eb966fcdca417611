//! Element types that may live in symmetric memory, and reductions over them.

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
}

impl DType {
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
        }
    }

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    pub(crate) fn from_tag(tag: u64) -> Option<DType> {
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U32, DType::U64]
            .into_iter()
            .find(|d| *d as u64 == tag)
    }

    /// Whether bitwise reductions are defined.
    pub const fn is_integer(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U32 | DType::U64)
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

    /// Whether `op` is defined for elements of type `dtype`.
    pub const fn supports(self, dtype: DType) -> bool {
        match self {
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
/// crate implements it for the eight element types of [`DType`].
pub unsafe trait Element: sealed::Sealed + Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// The type reductions accumulate in (`f32` for the 16-bit floats).
    type Acc: Copy + Send + Sync;

    fn to_acc(self) -> Self::Acc;
    fn from_acc(acc: Self::Acc) -> Self;
    /// `a op b`; `op` must be supported by `DTYPE` (checked by the caller).
    fn combine(op: ReduceOp, a: Self::Acc, b: Self::Acc) -> Self::Acc;
}

macro_rules! float_element {
    ($t:ty, $d:expr, $acc:ty, $to:expr, $from:expr) => {
        impl sealed::Sealed for $t {}
        // SAFETY: IEEE floats are plain data of their stated size; any bits are a value.
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
