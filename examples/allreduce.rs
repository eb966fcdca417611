//! All-reduce over a few sizes and element types, each result compared
//! exactly with a reference that every PE computes on its own from the
//! inputs all PEs are known to hold.
//!
//! The sizes cover the one-shot path (small), the two-shot path (large),
//! and lengths that do not split evenly among the PEs.
//!
//! Run: `shmemrun -n 4 target/release/examples/allreduce`.

use shmem::{bf16, Context, Element, ReduceOp, Stream};
use std::time::Instant;

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Elements per all-reduce; 1 << 20 f32 is 4 MiB, above the one-shot limit.
const LENS: [usize; 4] = [1, 1000, 65_537, 1 << 20];

/// SplitMix64's finaliser: reproducible pseudo-random inputs with no crate.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A reproducible 64-bit value for element `i` of PE `pe`'s input.
fn noise(pe: usize, i: usize) -> u64 {
    mix(((pe as u64) << 40) ^ i as u64)
}

/// An integer in -8..8: sums of up to 32 of them are exact even in bf16,
/// whose 8-bit significand holds integers up to 256 exactly.
fn small(pe: usize, i: usize) -> i64 {
    (noise(pe, i) % 17) as i64 - 8
}

fn main() {
    if let Err(e) = run() {
        eprintln!("allreduce failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Res {
    let ctx = shmem::init()?;
    let s = ctx.stream();
    let me = ctx.my_pe();
    if me == 0 {
        println!("all_reduce on {} PEs, every element checked exactly:", ctx.n_pes());
    }
    for len in LENS {
        check(&ctx, &s, ReduceOp::Sum, len, |pe, i| small(pe, i) as f32, |a, b| a + b)?;
        check(&ctx, &s, ReduceOp::Sum, len, |pe, i| bf16::from_f32(small(pe, i) as f32), |a, b| a + b)?;
        // Full-range values: max is exact whatever they are.
        check(&ctx, &s, ReduceOp::Max, len, |pe, i| noise(pe, i) as i64, i64::max)?;
    }
    // finalize is a barrier: it fails here if a check failed on another PE.
    ctx.finalize()?;
    if me == 0 {
        println!("allreduce OK");
    }
    Ok(())
}

/// Reduces `input(me, ·)` over all PEs with `op` and compares the result
/// with folding `input(0, ·) … input(n-1, ·)` with `combine` on the host.
fn check<T: Element>(
    ctx: &Context,
    s: &Stream,
    op: ReduceOp,
    len: usize,
    input: impl Fn(usize, usize) -> T,
    combine: impl Fn(T, T) -> T,
) -> Res {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let src = ctx.alloc::<T>(len)?;
    let dst = ctx.alloc::<T>(len)?;
    src.copy_from_host(&(0..len).map(|i| input(me, i)).collect::<Vec<_>>(), s)?;

    ctx.barrier_all(s)?; // start the clock together
    let start = Instant::now();
    ctx.all_reduce(&dst, &src, op, s)?;
    s.synchronize()?;
    let took = start.elapsed();

    let got = dst.copy_to_host(s)?;
    let want = |i: usize| (1..n).fold(input(0, i), |acc, pe| combine(acc, input(pe, i)));
    if let Some(i) = (0..len).find(|&i| got[i] != want(i)) {
        let dtype = T::DTYPE;
        return Err(
            format!("PE {me}: {dtype} {op} of {len}: element {i} is {:?}, expected {:?}", got[i], want(i)).into()
        );
    }
    if me == 0 {
        let dtype = T::DTYPE.name();
        println!("  {dtype:>4} {:<4} {len:>8} elements {:>10.1} µs", op.name(), took.as_secs_f64() * 1e6);
    }
    Ok(())
}
