//! The data of the rows: the element types, the element counts of a
//! collective at one size, inputs that name their sender, the outputs
//! expected of them and the first difference from those.

use crate::ops::{Op, ROOT};
use crate::Res;
use cudarc::nccl::sys::ncclDataType_t;
use shmem::{bf16, f16};

/// The element types of the rows: inputs are small integers, exact in each.
pub(super) trait Value: shmem::Element {
    const NAME: &'static str;
    /// Every integer up to this is exact.
    const EXACT: usize;
    /// A value no input or sum takes; the all-ones bytes of the GPU's poison.
    const POISON: Self;
    const NCCL: ncclDataType_t;
    /// `x`, which is at most [`Value::EXACT`].
    fn of(x: usize) -> Self;
}

impl Value for f32 {
    const NAME: &'static str = "f32";
    const EXACT: usize = 1 << 24;
    const POISON: f32 = f32::NAN;
    const NCCL: ncclDataType_t = ncclDataType_t::ncclFloat32;
    fn of(x: usize) -> f32 {
        x as f32
    }
}

impl Value for f16 {
    const NAME: &'static str = "f16";
    const EXACT: usize = 1 << 11;
    const POISON: f16 = f16::NAN;
    const NCCL: ncclDataType_t = ncclDataType_t::ncclFloat16;
    fn of(x: usize) -> f16 {
        f16::from_f32(x as f32)
    }
}

impl Value for bf16 {
    const NAME: &'static str = "bf16";
    const EXACT: usize = 1 << 8;
    const POISON: bf16 = bf16::NAN;
    const NCCL: ncclDataType_t = ncclDataType_t::ncclBfloat16;
    fn of(x: usize) -> bf16 {
        bf16::from_f32(x as f32)
    }
}

impl Value for i64 {
    const NAME: &'static str = "i64";
    const EXACT: usize = i64::MAX as usize;
    const POISON: i64 = -1;
    const NCCL: ncclDataType_t = ncclDataType_t::ncclInt64;
    fn of(x: usize) -> i64 {
        x as i64
    }
}

impl Value for u32 {
    const NAME: &'static str = "u32";
    const EXACT: usize = u32::MAX as usize - 1;
    const POISON: u32 = u32::MAX;
    const NCCL: ncclDataType_t = ncclDataType_t::ncclUint32;
    fn of(x: usize) -> u32 {
        x as u32
    }
}

/// Element counts of one collective at one nominal size.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) src: usize,
    pub(super) dst: usize,
    /// The row's `bytes`: the larger side (see the crate's doc).
    pub(super) bytes: usize,
}

impl Shape {
    /// `op` over `n` PEs at `bytes` of `elem`-byte elements; `None` where
    /// that is not one element per block. Counts split in blocks round down
    /// to a multiple of `n`, as in nccl-tests.
    pub(super) fn of(op: Op, bytes: usize, elem: usize, n: usize) -> Option<Shape> {
        let count = bytes / elem;
        let (src, dst) = match op {
            Op::AllReduce | Op::Broadcast | Op::Put | Op::Get => (count, count),
            Op::AllToAll => (count / n * n, count / n * n),
            Op::AllGather => (count / n, count / n * n),
            Op::ReduceScatter => (count / n * n, count / n),
            _ => return None,
        };
        (src > 0 && dst > 0).then_some(Shape { src, dst, bytes: src.max(dst) * elem })
    }
}

/// SplitMix64's finaliser: reproducible pseudo-random numbers, no crate.
pub(super) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Inputs that name their sender: element `i` of PE `p`'s source is
/// `p + 1 + n·r(i)`, with `r(i)` pseudo-random in `0..m` (fresh for each
/// seed) and `m` small enough that a sum over the `n` PEs stays exact in
/// the element type.
#[derive(Clone, Copy)]
pub(super) struct Pattern {
    pub(super) n: usize,
    pub(super) m: u64,
    pub(super) seed: u64,
}

impl Pattern {
    pub(super) fn new<T: Value>(n: usize, seed: u64) -> Res<Pattern> {
        let first = n * (n + 1) / 2; // the sum of p + 1
        if first > T::EXACT {
            return Err(format!("sums over {n} PEs are not exact in {}: use f32", T::NAME).into());
        }
        let m = ((T::EXACT - first) / (n * n) + 1).min(1 << 16);
        Ok(Pattern { n, m: m as u64, seed: mix(seed) })
    }

    fn r(&self, i: usize) -> usize {
        (mix(self.seed ^ i as u64) % self.m) as usize
    }

    /// Element `i` of PE `pe`'s source.
    pub(super) fn value<T: Value>(&self, pe: usize, i: usize) -> T {
        T::of(pe + 1 + self.n * self.r(i))
    }

    /// Element `i` of the sum of every PE's source.
    fn sum<T: Value>(&self, i: usize) -> T {
        T::of(self.n * (self.n + 1) / 2 + self.n * self.n * self.r(i))
    }

    pub(super) fn input<T: Value>(&self, pe: usize, len: usize) -> Vec<T> {
        (0..len).map(|i| self.value(pe, i)).collect()
    }

    /// What PE `me` must hold in its destination after `op`.
    pub(super) fn expected<T: Value>(&self, op: Op, shape: Shape, me: usize) -> Vec<T> {
        let n = self.n;
        match op {
            Op::AllReduce => (0..shape.dst).map(|i| self.sum(i)).collect(),
            Op::ReduceScatter => (0..shape.dst).map(|i| self.sum(me * shape.dst + i)).collect(),
            Op::Broadcast => self.input(ROOT, shape.dst),
            // Block p is PE p's source.
            Op::AllGather => (0..n).flat_map(|p| (0..shape.src).map(move |i| self.value(p, i))).collect(),
            // Block p is block `me` of PE p's source.
            Op::AllToAll => {
                let c = shape.dst / n;
                (0..n).flat_map(|p| (0..c).map(move |i| self.value(p, me * c + i))).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// A seed for one operation at one size, the same on every PE.
pub(super) fn seed(op: Op, dtype: &str, bytes: usize) -> u64 {
    let tag = dtype.bytes().fold(op as u64, |h, b| mix(h ^ u64::from(b)));
    mix(tag ^ bytes as u64)
}

/// The first difference between `got` and `want`, said in words.
pub(super) fn difference<T: Value>(got: &[T], want: &[T]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} elements where {} were expected", got.len(), want.len()));
    }
    let i = got.iter().zip(want).position(|(g, w)| g != w)?;
    let wrong = got.iter().zip(want).filter(|(g, w)| g != w).count();
    Some(format!("element {i} is {:?}, expected {:?} ({wrong} of {} wrong)", got[i], want[i], want.len()))
}
