//! A first tour of shmem: a ring of signalled puts, an all-reduce and an
//! all-to-all, each checked element by element.
//!
//! `cargo run --release --example quickstart` starts a job of itself: one
//! PE per GPU on the gpu backend, 4 PEs on the host backend; under
//! `shmemrun` or `mpirun` it runs on the world it is given.

use shmem::{Cmp, Context, ReduceOp, SignalOp, Stream};
use std::error::Error;
use std::fmt::Debug;
use std::process::ExitCode;
use std::time::{Duration, Instant};

type Res<T = ()> = Result<T, Box<dyn Error>>;

/// PEs started on the host backend when the example is run on its own.
const HOST_PES: usize = 4;
/// Elements each PE sends in the ring.
const RING_LEN: usize = 4096;
/// Elements of the all-reduce: 4 MiB of f32, above the one-shot limit.
const REDUCE_LEN: usize = 1 << 20;
/// Elements each PE sends to each other PE in the all-to-all.
const A2A_BLOCK: usize = 1024;

fn main() -> ExitCode {
    shmem::launch::spmd_main("quickstart", HOST_PES, run)
}

fn run() -> Res {
    let ctx = shmem::init()?;
    let s = ctx.stream();
    if ctx.my_pe() == 0 {
        println!("shmem quickstart: {} PEs on the {:?} backend", ctx.n_pes(), ctx.backend());
    }
    ring(&ctx, &s)?;
    all_reduce(&ctx, &s)?;
    all_to_all(&ctx, &s)?;
    // Collective: returns once every PE got here, so no PE leaves early.
    ctx.finalize()?;
    Ok(())
}

/// Prints on PE 0 what was checked and how long the operation took there.
fn report(ctx: &Context, what: &str, took: Duration) {
    if ctx.my_pe() == 0 {
        println!("  ok  {what:<50} {:>9.1} µs", took.as_secs_f64() * 1e6);
    }
}

/// Compares this PE's result with `want`, then agrees with the other PEs,
/// so that PE 0's "ok" speaks for every PE.
fn verify<T: PartialEq + Debug>(ctx: &Context, s: &Stream, what: &str, got: &[T], want: impl Fn(usize) -> T) -> Res {
    let me = ctx.my_pe();
    let mine: Res = match (0..got.len()).find(|&i| got[i] != want(i)) {
        None => Ok(()),
        Some(i) => Err(format!("PE {me}: {what} element {i} is {:?}, expected {:?}", got[i], want(i)).into()),
    };
    let failed = ctx.alloc::<u32>(1)?;
    failed.copy_from_host(&[mine.is_err() as u32], s)?;
    ctx.all_reduce(&failed, &failed, ReduceOp::Max, s)?;
    mine?;
    match failed.copy_to_host(s)?[0] {
        0 => Ok(()),
        _ => Err(format!("PE {me}: {what} was wrong on another PE").into()),
    }
}

/// The value that `sender` puts at `index`: a wrong source or offset shows.
fn tag(sender: usize, index: usize) -> u64 {
    ((sender as u64) << 32) | index as u64
}

/// Each PE puts a block to its right neighbour and raises the neighbour's
/// signal; each then waits for its own signal, which proves the data is there.
fn ring(ctx: &Context, s: &Stream) -> Res {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let src = ctx.alloc::<u64>(RING_LEN)?;
    let dst = ctx.alloc::<u64>(RING_LEN)?;
    // Zeroed on every PE before alloc_zeroed returns, so no signal is stale.
    let signal = ctx.alloc_zeroed::<u64>(1)?;
    src.copy_from_host(&(0..RING_LEN).map(|i| tag(me, i)).collect::<Vec<_>>(), s)?;

    ctx.barrier_all(s)?; // start the clock together
    let start = Instant::now();
    ctx.put_signal(&dst, &src, &signal, 0, 1, SignalOp::Set, (me + 1) % n, s)?;
    ctx.signal_wait_until(&signal, 0, Cmp::Eq, 1, s)?;
    let took = start.elapsed();
    let left = (me + n - 1) % n;
    let got = dst.copy_to_host(s)?;
    verify(ctx, s, "ring", &got, |i| tag(left, i))?;
    report(ctx, &format!("ring put_signal: {RING_LEN} u64 from the left neighbour"), took);
    Ok(())
}

/// PE `pe`'s input at `i`: small integers, so every sum is exact in f32.
fn reduce_input(pe: usize, i: usize) -> f32 {
    (pe * 1000 + i % 1000) as f32
}

fn all_reduce(ctx: &Context, s: &Stream) -> Res {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let src = ctx.alloc::<f32>(REDUCE_LEN)?;
    let dst = ctx.alloc::<f32>(REDUCE_LEN)?;
    src.copy_from_host(&(0..REDUCE_LEN).map(|i| reduce_input(me, i)).collect::<Vec<_>>(), s)?;

    ctx.barrier_all(s)?;
    let start = Instant::now();
    ctx.all_reduce(&dst, &src, ReduceOp::Sum, s)?;
    let took = start.elapsed();
    let got = dst.copy_to_host(s)?;
    verify(ctx, s, "all_reduce", &got, |i| (0..n).map(|pe| reduce_input(pe, i)).sum::<f32>())?;
    report(ctx, &format!("all_reduce sum: {REDUCE_LEN} f32, exact"), took);
    Ok(())
}

/// Block `j` of PE `me`'s source goes to PE `j`; element `k` names both ends.
fn all_to_all(ctx: &Context, s: &Stream) -> Res {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let a2a = |from: usize, to: usize, k: usize| ((from as u64) << 40) | ((to as u64) << 20) | k as u64;
    let src = ctx.alloc::<u64>(n * A2A_BLOCK)?;
    let dst = ctx.alloc::<u64>(n * A2A_BLOCK)?;
    let mine: Vec<u64> = (0..n).flat_map(|to| (0..A2A_BLOCK).map(move |k| a2a(me, to, k))).collect();
    src.copy_from_host(&mine, s)?;

    ctx.barrier_all(s)?;
    let start = Instant::now();
    ctx.all_to_all(&dst, &src, s)?;
    let took = start.elapsed();
    let got = dst.copy_to_host(s)?;
    // Block `from` of the result is what PE `from` addressed to this PE.
    verify(ctx, s, "all_to_all", &got, |i| a2a(i / A2A_BLOCK, me, i % A2A_BLOCK))?;
    report(ctx, &format!("all_to_all: {A2A_BLOCK} u64 from each of {n} PEs"), took);
    Ok(())
}
