//! The host backend's matrix product, for the overlapped matmuls
//! ([`crate::overlap`]): f32, f16 and bf16, accumulated in f32.

use super::HostHeap;
use crate::dtype::{DType, Element};
use rayon::prelude::*;

impl HostHeap {
    /// `c = a · b` on PE `me`'s heap (`a` is `rows × k`, `b` `k × n`, at
    /// those offsets): rows in parallel, each
    /// element accumulated in f32 over k in order.
    pub(crate) fn gemm<T: Element>(
        &self,
        pool: &rayon::ThreadPool,
        me: usize,
        (a, b, c): (usize, usize, usize),
        (rows, k, n): (usize, usize, usize),
    ) {
        let base = self.heap_ptr(me, 0) as usize;
        // SAFETY: checked, non-overlapping regions of this PE's heap that no
        // peer writes during the call.
        let (a, b) = unsafe {
            (
                std::slice::from_raw_parts((base + a) as *const T, rows * k),
                std::slice::from_raw_parts((base + b) as *const T, k * n),
            )
        };
        let bf: Vec<f32> = b.iter().map(|&x| to_f32(x)).collect();
        // SAFETY: as above; `c` is written by this PE only.
        let c = unsafe { std::slice::from_raw_parts_mut((base + c) as *mut T, rows * n) };
        if n == 0 {
            return;
        }
        pool.install(|| {
            c.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
                let mut acc = vec![0f32; n];
                for (kk, &x) in a[i * k..(i + 1) * k].iter().enumerate() {
                    let x = to_f32(x);
                    for (acc, &y) in acc.iter_mut().zip(&bf[kk * n..(kk + 1) * n]) {
                        *acc += x * y;
                    }
                }
                for (o, v) in row.iter_mut().zip(acc) {
                    *o = from_f32(v);
                }
            })
        });
    }
}

fn to_f32<T: Element>(x: T) -> f32 {
    // SAFETY: T is the type DTYPE names (the Element contract).
    unsafe {
        match T::DTYPE {
            DType::F32 => std::mem::transmute_copy::<T, f32>(&x),
            DType::F16 => std::mem::transmute_copy::<T, half::f16>(&x).to_f32(),
            DType::BF16 => std::mem::transmute_copy::<T, half::bf16>(&x).to_f32(),
            _ => unreachable!("the overlapped matmuls take f32, f16 and bf16"),
        }
    }
}

fn from_f32<T: Element>(x: f32) -> T {
    // SAFETY: as in to_f32.
    unsafe {
        match T::DTYPE {
            DType::F32 => std::mem::transmute_copy::<f32, T>(&x),
            DType::F16 => std::mem::transmute_copy::<half::f16, T>(&half::f16::from_f32(x)),
            DType::BF16 => std::mem::transmute_copy::<half::bf16, T>(&half::bf16::from_f32(x)),
            _ => unreachable!("the overlapped matmuls take f32, f16 and bf16"),
        }
    }
}
