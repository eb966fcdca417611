//! A column-parallel linear layer, its all-gather overlapped with its GEMM:
//! every PE holds a block of the activations' rows and its own block of the
//! weight's columns. `all_gather_matmul` gathers the rows, chunk by chunk,
//! by copy engines (no SMs taken from the GEMM), while cuBLAS multiplies
//! the rows already there, and leaves this PE's columns of the layer's
//! output for every row. Each PE checks its result exactly on the host.
//!
//! Run: `shmemrun -n 2 target/release/examples/all_gather_matmul` (on the
//! host backend, `SHMEM_BACKEND=host`, the same call multiplies on the CPU);
//! run alone it starts a job of itself, one PE per GPU (host backend: 2).

use shmem::{f16, Overlap, OverlapComm};
use std::process::ExitCode;

/// PEs started on the host backend when the example is run on its own
/// (on the gpu backend: one per GPU).
const HOST_PES: usize = 2;
/// Rows of activations on each PE.
const ROWS: usize = 64;
/// Activation width: the weight's rows.
const HIDDEN: usize = 256;
/// The weight's columns on each PE.
const COLS: usize = 96;

/// SplitMix64's finaliser: reproducible pseudo-random inputs with no crate.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element (r, c) of matrix `which`: -1, 0 or 1, so every sum of products
/// is an integer of at most `HIDDEN`, exact in f16.
fn small(which: usize, r: usize, c: usize) -> f16 {
    f16::from_f32((mix((which as u64) << 48 ^ (r as u64) << 24 ^ c as u64) % 3) as f32 - 1.0)
}

/// Activation `i` of row `r` of the whole batch.
fn x(r: usize, i: usize) -> f16 {
    small(0, r, i)
}

/// Weight (i, j) of PE `pe`'s block of columns.
fn w(pe: usize, i: usize, j: usize) -> f16 {
    small(1 + pe, i, j)
}

fn main() -> ExitCode {
    shmem::launch::spmd_main("all_gather_matmul", HOST_PES, run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = shmem::init()?;
    let s = ctx.stream();
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let shard = ctx.alloc::<f16>(ROWS * HIDDEN)?;
    let weight = ctx.alloc::<f16>(HIDDEN * COLS)?;
    let gathered = ctx.alloc::<f16>(n * ROWS * HIDDEN)?;
    let out = ctx.alloc::<f16>(n * ROWS * COLS)?;
    let mine: Vec<f16> = (0..ROWS * HIDDEN).map(|e| x(me * ROWS + e / HIDDEN, e % HIDDEN)).collect();
    shard.copy_from_host(&mine, &s)?;
    weight.copy_from_host(&(0..HIDDEN * COLS).map(|e| w(me, e / COLS, e % COLS)).collect::<Vec<_>>(), &s)?;

    // Every PE's rows, times this PE's columns.
    let how = Overlap { comm: OverlapComm::CopyEngine, chunks: 4 };
    ctx.all_gather_matmul(&gathered, &out, &shard, &weight, HIDDEN, how, &s)?;

    let got = out.copy_to_host(&s)?;
    for (e, &g) in got.iter().enumerate() {
        let (r, j) = (e / COLS, e % COLS);
        let want: f32 = (0..HIDDEN).map(|i| x(r, i).to_f32() * w(me, i, j).to_f32()).sum();
        if g != f16::from_f32(want) {
            return Err(format!("PE {me}: out[{r}][{j}] is {g}, expected {want}").into());
        }
    }
    println!("PE {me}: all_gather(x) · w_{me}: {} × {COLS} f16, every element exact ({how:?})", n * ROWS);
    // finalize is a barrier: it fails here if a check failed on another PE.
    ctx.finalize()?;
    Ok(())
}
