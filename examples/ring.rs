//! A ring of one-sided puts with flow control by signals.
//!
//! Every round, each PE puts a block tagged with its rank and the round
//! into its right neighbour's inbox and raises the neighbour's "data"
//! signal. Before reusing the inbox, the receiver hands a "credit" back to
//! its left neighbour, so a fast sender never overwrites a block that has
//! not been read. No barrier is needed between rounds.
//!
//! Run: `shmemrun -n 4 target/release/examples/ring` (or `mpirun -np 4`
//! with the `mpi` feature); alone it is a world of one PE, which puts to itself.

use shmem::{Cmp, SignalOp};
use std::time::Instant;

const ROUNDS: u64 = 16;
/// u64 elements per block (32 KiB).
const BLOCK: usize = 4096;
/// Slots of the signal buffer.
const DATA: usize = 0;
const CREDIT: usize = 1;

/// What `sender` puts at `index` in `round`: a wrong source, round or
/// offset shows in the check.
fn tag(sender: usize, round: u64, index: usize) -> u64 {
    ((sender as u64) << 48) | (round << 32) | index as u64
}

fn main() {
    if let Err(e) = run() {
        eprintln!("ring failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = shmem::init()?;
    let s = ctx.stream();
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let (left, right) = ((me + n - 1) % n, (me + 1) % n);
    let src = ctx.alloc::<u64>(BLOCK)?;
    let inbox = ctx.alloc::<u64>(BLOCK)?;
    // Zeroed on every PE before any PE can signal.
    let signals = ctx.alloc_zeroed::<u64>(2)?;

    let start = Instant::now();
    for round in 0..ROUNDS {
        if round > 0 {
            // The right neighbour has read the previous block from its inbox.
            ctx.signal_wait_until(&signals, CREDIT, Cmp::Ge, round, &s)?;
        }
        let block: Vec<u64> = (0..BLOCK).map(|i| tag(me, round, i)).collect();
        src.copy_from_host(&block, &s)?;
        // Add, not Set: the count of blocks delivered so far is the round to wait for.
        ctx.put_signal(&inbox, &src, &signals, DATA, 1, SignalOp::Add, right, &s)?;

        ctx.signal_wait_until(&signals, DATA, Cmp::Ge, round + 1, &s)?;
        let got = inbox.copy_to_host(&s)?;
        if let Some(i) = (0..BLOCK).find(|&i| got[i] != tag(left, round, i)) {
            let want = tag(left, round, i);
            return Err(format!("PE {me}, round {round}: element {i} is {:#x}, expected {want:#x}", got[i]).into());
        }
        ctx.signal_op(&signals, CREDIT, 1, SignalOp::Add, left, &s)?;
    }
    let took = start.elapsed();

    // finalize is a barrier: every PE has checked every round once it returns.
    ctx.finalize()?;
    if me == 0 {
        let kib = BLOCK * size_of::<u64>() / 1024;
        let per_round = took.as_secs_f64() * 1e6 / ROUNDS as f64;
        println!("ring OK: {n} PEs, {ROUNDS} rounds of {kib} KiB each, {per_round:.1} µs per round on PE 0");
    }
    Ok(())
}
