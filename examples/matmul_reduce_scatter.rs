//! A row-parallel linear layer, its GEMM overlapped with its
//! reduce-scatter: every PE holds all rows of the activations but only its
//! block of their columns (what a column-parallel layer leaves), and the
//! matching block of the weight's rows, so its product is one PE's share of
//! the layer's output. `matmul_reduce_scatter` computes that product block
//! by block, sending each finished chunk to the PE that owns its rows (by
//! copy engines) while the next is computed, and leaves PE p block p of the
//! rows, summed over the PEs. Each PE checks its block exactly on the host.
//!
//! Run: `shmemrun -n 2 target/release/examples/matmul_reduce_scatter` (on
//! the host backend, `SHMEM_BACKEND=host`, the same call multiplies on the
//! CPU); run alone it starts a job of itself, one PE per GPU (host
//! backend: 2).

use shmem::overlap::reduce_scatter_workspace_len;
use shmem::{f16, Overlap, OverlapComm};
use std::process::ExitCode;

/// PEs started on the host backend when the example is run on its own
/// (on the gpu backend: one per GPU).
const HOST_PES: usize = 2;
/// Rows of the output each PE ends with.
const ROWS_PER_PE: usize = 64;
/// The activations' columns (the weight's rows) on each PE.
const HIDDEN_PER_PE: usize = 128;
/// The weight's columns.
const COLS: usize = 96;

/// SplitMix64's finaliser: reproducible pseudo-random inputs with no crate.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element (r, c) of matrix `which`: -1, 0 or 1, so every sum of products
/// is an integer of at most 8 × `HIDDEN_PER_PE` over up to 8 PEs, exact in
/// f16.
fn small(which: usize, r: usize, c: usize) -> f16 {
    f16::from_f32((mix((which as u64) << 48 ^ (r as u64) << 24 ^ c as u64) % 3) as f32 - 1.0)
}

/// Activation (r, i), `i` a column of the whole activation.
fn x(r: usize, i: usize) -> f16 {
    small(0, r, i)
}

/// Weight (i, j), `i` a row of the whole weight.
fn w(i: usize, j: usize) -> f16 {
    small(1, i, j)
}

fn main() -> ExitCode {
    shmem::launch::spmd_main("matmul_reduce_scatter", HOST_PES, run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = shmem::init()?;
    let s = ctx.stream();
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let (rows, k) = (n * ROWS_PER_PE, HIDDEN_PER_PE);
    let a = ctx.alloc::<f16>(rows * k)?;
    let b = ctx.alloc::<f16>(k * COLS)?;
    let out = ctx.alloc::<f16>(ROWS_PER_PE * COLS)?;
    let workspace = ctx.alloc::<f16>(reduce_scatter_workspace_len(rows, COLS))?;
    // This PE's columns of the activations, its rows of the weight.
    a.copy_from_host(&(0..rows * k).map(|e| x(e / k, me * k + e % k)).collect::<Vec<_>>(), &s)?;
    b.copy_from_host(&(0..k * COLS).map(|e| w(me * k + e / COLS, e % COLS)).collect::<Vec<_>>(), &s)?;

    let how = Overlap { comm: OverlapComm::CopyEngine, chunks: 4 };
    ctx.matmul_reduce_scatter(&out, &a, &b, &workspace, k, how, &s)?;

    // Row r of this PE's block is row me × ROWS_PER_PE + r of x · w.
    let got = out.copy_to_host(&s)?;
    for (e, &g) in got.iter().enumerate() {
        let (r, j) = (me * ROWS_PER_PE + e / COLS, e % COLS);
        let want: f32 = (0..n * k).map(|i| x(r, i).to_f32() * w(i, j).to_f32()).sum();
        if g != f16::from_f32(want) {
            return Err(format!("PE {me}: out[{r}][{j}] is {g}, expected {want}").into());
        }
    }
    let first = me * ROWS_PER_PE;
    println!(
        "PE {me}: rows {first}..{} of x · w, summed over {n} PEs: {ROWS_PER_PE} × {COLS} f16, every element exact ({how:?})",
        first + ROWS_PER_PE
    );
    // finalize is a barrier: it fails here if a check failed on another PE.
    ctx.finalize()?;
    Ok(())
}
