//! A Mixture-of-Experts layer's token exchange: each PE routes its tokens
//! to their top-2 experts (anywhere in the world), every expert scales the
//! tokens it receives, and the combine returns each token's weighted sum of
//! its experts' outputs, in the token's original place.
//!
//! `cargo run --example moe_dispatch_combine` starts a job of itself (one
//! PE per GPU on the gpu backend, 2 PEs on the host backend); under
//! `shmemrun` it runs on the world it is given.

use shmem::{bf16, MoeAllToAll, MoeConfig};
use std::process::ExitCode;
use std::time::Instant;

/// PEs started on the host backend when the example is run on its own.
const HOST_PES: usize = 2;
const HIDDEN: usize = 256;
const TOKENS: usize = 64;
const EXPERTS_PER_PE: usize = 4;
const TOP_K: usize = 2;
/// Each expert's rows start at a multiple of this (a grouped GEMM's tile).
const ALIGN: usize = 16;

fn main() -> ExitCode {
    shmem::launch::spmd_main("moe_dispatch_combine", HOST_PES, run)
}

/// Token `t` of PE `pe`: small values, exact in bf16.
fn token(pe: usize, t: usize, i: usize) -> bf16 {
    bf16::from_f32(((pe * 31 + t * 7 + i) % 64) as f32 / 8.0 - 4.0)
}

/// The two distinct experts of token `t` of PE `pe`, and their weights.
fn route(pe: usize, t: usize, experts: usize) -> [(i64, f32); TOP_K] {
    let first = (pe * 5 + t * 3) % experts;
    let second = (first + 1 + t % (experts - 1)) % experts;
    [(first as i64, 0.75), (second as i64, 0.25)]
}

/// What expert `g` does to a token: scale it by `g + 1`.
fn expert(g: usize, x: bf16) -> bf16 {
    bf16::from_f32(x.to_f32() * (g + 1) as f32)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = shmem::init()?;
    let s = ctx.stream();
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let experts = n * EXPERTS_PER_PE;
    let moe = MoeAllToAll::<bf16>::new(&ctx, MoeConfig::new(HIDDEN, TOKENS, EXPERTS_PER_PE, TOP_K).major_align(ALIGN))?;

    let tokens: Vec<bf16> = (0..TOKENS * HIDDEN).map(|i| token(me, i / HIDDEN, i % HIDDEN)).collect();
    let routes: Vec<[(i64, f32); TOP_K]> = (0..TOKENS).map(|t| route(me, t, experts)).collect();
    let ids: Vec<i64> = routes.iter().flatten().map(|r| r.0).collect();
    let weights: Vec<f32> = routes.iter().flatten().map(|r| r.1).collect();

    let start = Instant::now();
    let (rows, layout) = moe.dispatch(&tokens, &ids, &weights, &s)?;
    // The experts: each local expert scales its block of rows in place.
    let mut received = rows.copy_to_host(&s)?;
    for e in 0..EXPERTS_PER_PE {
        let g = me * EXPERTS_PER_PE + e;
        let want = (0..n)
            .flat_map(|pe| (0..TOKENS).map(move |t| (pe, t)))
            .filter(|&(pe, t)| route(pe, t, experts).iter().any(|r| r.0 == g as i64));
        let got = layout.expert_rows(e);
        if got.len() != want.count() || got.start % ALIGN != 0 {
            return Err(format!("PE {me}: expert {g} got rows {got:?}").into());
        }
        for x in &mut received[got.start * HIDDEN..got.end * HIDDEN] {
            *x = expert(g, *x);
        }
    }
    rows.copy_from_host(&received, &s)?;
    let out = moe.combine(rows, &layout, &s)?;
    let took = start.elapsed();

    for (t, route) in routes.iter().enumerate() {
        for i in 0..HIDDEN {
            let x = token(me, t, i);
            // Each expert PE weighs its experts' outputs (rounded to bf16),
            // then the partials are summed in PE order.
            let mut sum = 0.0f32;
            for pe in 0..n {
                let mine = route.iter().filter(|r| r.0 as usize / EXPERTS_PER_PE == pe);
                let mut partial = None;
                for &(g, w) in mine {
                    partial = Some(partial.unwrap_or(0.0f32) + w * expert(g as usize, x).to_f32());
                }
                if let Some(p) = partial {
                    sum += bf16::from_f32(p).to_f32();
                }
            }
            let want = bf16::from_f32(sum);
            if out[t * HIDDEN + i] != want {
                return Err(
                    format!("PE {me}: token {t} element {i} is {}, expected {want}", out[t * HIDDEN + i]).into()
                );
            }
        }
    }
    // finalize is a barrier: every PE has checked its tokens once it returns.
    ctx.finalize()?;
    if me == 0 {
        println!(
            "moe_dispatch_combine OK: {n} PEs × {TOKENS} tokens of {HIDDEN} bf16, top-{TOP_K} of {experts} experts \
             ({EXPERTS_PER_PE} per PE, blocks aligned to {ALIGN} rows); PE 0 received {} rows; dispatch + experts + \
             combine {:.1} ms on PE 0",
            layout.rows(),
            took.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
