//! The overlapped matmuls against a reference every PE computes from every
//! PE's inputs (drawn from a fresh shared seed).
//!
//! - Exact: inputs in {-1, 0, 1}, so every product, partial sum and PE sum
//!   is a small integer (|x| ≤ k·n_pes ≤ 256), exact in f32, f16 and bf16
//!   whatever order cuBLAS sums in: outputs must equal the reference bit
//!   for bit, for every dtype, shape (odd, smaller than the chunk count,
//!   not divisible by it, empty) and communication (sequential, SM, copy
//!   engine), on poisoned outputs.
//! - Rounded: random reals in bf16 and f16 against an f64 reference,
//!   within the stated tolerance (|err| ≤ 2⁻⁷ (bf16) or 2⁻¹⁰ (f16) of the
//!   sum of |terms|, plus the final rounding), and the overlapped result
//!   against the sequential one.
//! - Refusals: bad shapes fail on every PE, with nothing written.

use crate::util::{assert_bits_eq, mix, poison, Env, Real, TestElem, TestResult};
use crate::{assert_err, TestFn};
use shmem::overlap::reduce_scatter_workspace_len;
use shmem::{bf16, f16, Error, Overlap, OverlapComm, SymmetricBuffer};

pub const TESTS: &[(&str, TestFn)] = &[
    ("overlap::all_gather_matmul", all_gather_matmul),
    ("overlap::matmul_reduce_scatter", matmul_reduce_scatter),
    ("overlap::rounded_bf16_f16", rounded),
    ("overlap::errors", errors),
];

const COMMS: [OverlapComm; 3] = [OverlapComm::Sequential, OverlapComm::Sm, OverlapComm::CopyEngine];

/// (rows per PE, k, n, chunks): odd sizes, fewer rows than chunks, rows
/// not divisible by the chunks, an empty shard, a 16-byte-unaligned row.
const SHAPES: [(usize, usize, usize, usize); 6] =
    [(5, 7, 3, 4), (37, 64, 48, 4), (2, 16, 8, 4), (64, 33, 17, 3), (0, 8, 4, 2), (29, 40, 64, 7)];

/// Element `i` of matrix `which` of PE `pe`: -1, 0 or 1.
fn small(seed: u64, which: u64, pe: usize, i: usize) -> f64 {
    (mix(seed ^ mix(which << 56 ^ (pe as u64) << 40 ^ i as u64)) % 3) as f64 - 1.0
}

/// Element `i` of matrix `which` of PE `pe`: a real in (-1, 1).
fn real(seed: u64, which: u64, pe: usize, i: usize) -> f64 {
    (mix(seed ^ mix(which << 56 ^ (pe as u64) << 40 ^ i as u64)) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

fn matrix<T: Real>(seed: u64, which: u64, pe: usize, len: usize, f: fn(u64, u64, usize, usize) -> f64) -> Vec<T> {
    (0..len).map(|i| T::from_f64(f(seed, which, pe, i))).collect()
}

fn buffer<T: TestElem>(env: &Env, data: &[T]) -> shmem::Result<SymmetricBuffer<T>> {
    let b = env.ctx.alloc::<T>(data.len())?;
    b.copy_from_host(data, &env.s)?;
    Ok(b)
}

/// `a · b` (row-major, `rows × k` by `k × n`) in f64, with the sum of the
/// terms' magnitudes (for the tolerance).
fn matmul(a: &[f64], b: &[f64], rows: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut c, mut mag) = (vec![0.0; rows * n], vec![0.0; rows * n]);
    for i in 0..rows {
        for kk in 0..k {
            let x = a[i * k + kk];
            for j in 0..n {
                c[i * n + j] += x * b[kk * n + j];
                mag[i * n + j] += (x * b[kk * n + j]).abs();
            }
        }
    }
    (c, mag)
}

fn all_gather_matmul(env: &Env) -> TestResult {
    for comm in COMMS {
        for &(m, k, n, chunks) in &SHAPES {
            let how = Overlap { comm, chunks };
            ag_exact::<f32>(env, m, k, n, how, false)?;
            ag_exact::<f16>(env, m, k, n, how, false)?;
            ag_exact::<bf16>(env, m, k, n, how, false)?;
        }
        // In place: the shard is this PE's block of a_out.
        ag_exact::<bf16>(env, 37, 64, 48, Overlap { comm, chunks: 4 }, true)?;
    }
    Ok(())
}

fn ag_exact<T: Real>(env: &Env, m: usize, k: usize, n: usize, how: Overlap, in_place: bool) -> TestResult {
    let (np, me, seed) = (env.n(), env.me(), env.fresh_seed());
    let what = format!("all_gather_matmul {} m {m} k {k} n {n} {how:?} in place {in_place}", T::DTYPE);
    // Every PE's b differs (its own weights): the reference uses this PE's.
    let shards: Vec<Vec<f64>> = (0..np).map(|pe| (0..m * k).map(|i| small(seed, 0, pe, i)).collect()).collect();
    let b: Vec<T> = matrix(seed, 1, me, k * n, small);
    let a_full: Vec<f64> = shards.concat();
    let (want, _) = matmul(&a_full, &b.iter().map(|x| x.to_f64()).collect::<Vec<_>>(), np * m, k, n);
    let mine: Vec<T> = shards[me].iter().map(|&x| T::from_f64(x)).collect();
    let a_out = buffer(env, &vec![poison::<T>(); np * m * k])?;
    let out = buffer(env, &vec![poison::<T>(); np * m * n])?;
    let bb = buffer(env, &b)?;
    let (ctx, s) = (&env.ctx, &env.s);
    if in_place {
        a_out.slice(me * m * k..(me + 1) * m * k).copy_from_host(&mine, s)?;
        ctx.all_gather_matmul(&a_out, &out, a_out.slice(me * m * k..(me + 1) * m * k), &bb, k, how, s)?;
    } else {
        let shard = buffer(env, &mine)?;
        ctx.all_gather_matmul(&a_out, &out, &shard, &bb, k, how, s)?;
        assert_bits_eq(&shard.copy_to_host(s)?, &mine, &format!("{what}: a_shard untouched"));
    }
    let a_want: Vec<T> = a_full.iter().map(|&x| T::from_f64(x)).collect();
    assert_bits_eq(&a_out.copy_to_host(s)?, &a_want, &format!("{what}: a_out"));
    let want: Vec<T> = want.into_iter().map(T::from_f64).collect();
    assert_bits_eq(&out.copy_to_host(s)?, &want, &format!("{what}: out"));
    Ok(())
}

fn matmul_reduce_scatter(env: &Env) -> TestResult {
    for comm in COMMS {
        for &(m_out, k, n, chunks) in &SHAPES {
            let how = Overlap { comm, chunks };
            rs_exact::<f32>(env, m_out, k, n, how)?;
            rs_exact::<f16>(env, m_out, k, n, how)?;
            rs_exact::<bf16>(env, m_out, k, n, how)?;
        }
    }
    Ok(())
}

/// Every PE's `a` (`m × k`, m = n_pes·m_out) and `b` (`k × n`).
fn rs_inputs(
    seed: u64,
    np: usize,
    m: usize,
    k: usize,
    n: usize,
    f: fn(u64, u64, usize, usize) -> f64,
) -> Vec<(Vec<f64>, Vec<f64>)> {
    (0..np)
        .map(|pe| ((0..m * k).map(|i| f(seed, 2, pe, i)).collect(), (0..k * n).map(|i| f(seed, 3, pe, i)).collect()))
        .collect()
}

fn rs_exact<T: Real>(env: &Env, m_out: usize, k: usize, n: usize, how: Overlap) -> TestResult {
    let (np, me, seed) = (env.n(), env.me(), env.fresh_seed());
    let m = np * m_out;
    let what = format!("matmul_reduce_scatter {} m {m} k {k} n {n} {how:?}", T::DTYPE);
    let inputs = rs_inputs(seed, np, m, k, n, small);
    let mut want = vec![0.0; m_out * n];
    for (a, b) in &inputs {
        let (c, _) = matmul(&a[me * m_out * k..(me + 1) * m_out * k], b, m_out, k, n);
        want.iter_mut().zip(c).for_each(|(w, x)| *w += x);
    }
    let a: Vec<T> = inputs[me].0.iter().map(|&x| T::from_f64(x)).collect();
    let b: Vec<T> = inputs[me].1.iter().map(|&x| T::from_f64(x)).collect();
    let (ab, bb) = (buffer(env, &a)?, buffer(env, &b)?);
    let out = buffer(env, &vec![poison::<T>(); m_out * n])?;
    let ws = buffer(env, &vec![poison::<T>(); reduce_scatter_workspace_len(m, n)])?;
    let s = &env.s;
    env.ctx.matmul_reduce_scatter(&out, &ab, &bb, &ws, k, how, s)?;
    let want: Vec<T> = want.into_iter().map(T::from_f64).collect();
    assert_bits_eq(&out.copy_to_host(s)?, &want, &format!("{what}: out"));
    assert_bits_eq(&ab.copy_to_host(s)?, &a, &format!("{what}: a untouched"));
    Ok(())
}

/// Random reals: within tolerance of the f64 product, and the overlapped
/// result within the same of the sequential one.
fn rounded(env: &Env) -> TestResult {
    rounded_as::<bf16>(env, 2f64.powi(-7))?;
    rounded_as::<f16>(env, 2f64.powi(-10))
}

fn rounded_as<T: Real>(env: &Env, eps: f64) -> TestResult {
    let (np, me, seed) = (env.n(), env.me(), env.fresh_seed());
    let (m, k, n) = (45, 256, 72);
    let close = |got: &[T], want: &[f64], mag: &[f64], what: &str| {
        for i in 0..want.len() {
            let tol = eps * (mag[i] + want[i].abs()) + 1e-6;
            let err = (got[i].to_f64() - want[i]).abs();
            assert!(err <= tol, "{what}: element {i} is {}, expected {} (± {tol})", got[i].to_f64(), want[i]);
        }
    };
    // all_gather_matmul.
    let shards: Vec<Vec<f64>> =
        (0..np).map(|pe| (0..m * k).map(|i| T::from_f64(real(seed, 0, pe, i)).to_f64()).collect()).collect();
    let b: Vec<T> = matrix(seed, 1, me, k * n, real);
    let (want, mag) = matmul(&shards.concat(), &b.iter().map(|x| x.to_f64()).collect::<Vec<_>>(), np * m, k, n);
    let shard = buffer(env, &shards[me].iter().map(|&x| T::from_f64(x)).collect::<Vec<_>>())?;
    let bb = buffer(env, &b)?;
    let a_out = env.ctx.alloc::<T>(np * m * k)?;
    let mut outs = Vec::new();
    for comm in COMMS {
        let out = buffer(env, &vec![poison::<T>(); np * m * n])?;
        env.ctx.all_gather_matmul(&a_out, &out, &shard, &bb, k, Overlap { comm, chunks: 4 }, &env.s)?;
        let got = out.copy_to_host(&env.s)?;
        close(&got, &want, &mag, &format!("all_gather_matmul {} {comm:?}", T::DTYPE));
        outs.push(got);
    }
    for (i, o) in outs.iter().enumerate().skip(1) {
        let seq: Vec<f64> = outs[0].iter().map(|x| x.to_f64()).collect();
        close(o, &seq, &mag, &format!("all_gather_matmul {} {:?} against sequential", T::DTYPE, COMMS[i]));
    }
    // matmul_reduce_scatter.
    let mm = np * m;
    let inputs = rs_inputs(seed, np, mm, k, n, |s, w, p, i| T::from_f64(real(s, w, p, i)).to_f64());
    let (mut want, mut mag) = (vec![0.0; m * n], vec![0.0; m * n]);
    for (a, b) in &inputs {
        let (c, g) = matmul(&a[me * m * k..(me + 1) * m * k], b, m, k, n);
        want.iter_mut().zip(c).for_each(|(w, x)| *w += x);
        mag.iter_mut().zip(g).for_each(|(w, x)| *w += x);
    }
    let ab = buffer(env, &inputs[me].0.iter().map(|&x| T::from_f64(x)).collect::<Vec<_>>())?;
    let bb = buffer(env, &inputs[me].1.iter().map(|&x| T::from_f64(x)).collect::<Vec<_>>())?;
    let ws = env.ctx.alloc::<T>(reduce_scatter_workspace_len(mm, n))?;
    for comm in COMMS {
        let out = buffer(env, &vec![poison::<T>(); m * n])?;
        env.ctx.matmul_reduce_scatter(&out, &ab, &bb, &ws, k, Overlap { comm, chunks: 3 }, &env.s)?;
        // Each PE's partial is rounded to T before the sum: one more
        // rounding per PE.
        let got = out.copy_to_host(&env.s)?;
        let mag: Vec<f64> = mag.iter().map(|x| x * np as f64).collect();
        close(&got, &want, &mag, &format!("matmul_reduce_scatter {} {comm:?}", T::DTYPE));
    }
    Ok(())
}

/// Bad shapes: every PE fails (the bad PE with its reason, the others
/// naming it), outputs stay poisoned, and the team still works.
fn errors(env: &Env) -> TestResult {
    let (np, me) = (env.n(), env.me());
    let (m, k, n) = (4, 8, 6);
    let s = &env.s;
    let shard = buffer(env, &vec![bf16::ONE; m * k])?;
    let b = buffer(env, &vec![bf16::ONE; k * n])?;
    let a_out = buffer(env, &vec![poison::<bf16>(); np * m * k])?;
    let out = buffer(env, &vec![poison::<bf16>(); np * m * n])?;
    let untouched = |what: &str| -> TestResult {
        assert_bits_eq(&a_out.copy_to_host(s)?, &vec![poison::<bf16>(); np * m * k], &format!("{what}: a_out"));
        assert_bits_eq(&out.copy_to_host(s)?, &vec![poison::<bf16>(); np * m * n], &format!("{what}: out"));
        Ok(())
    };
    let ctx = &env.ctx;
    let how = Overlap::default();
    // k that does not divide the shard.
    let e = assert_err!(ctx.all_gather_matmul(&a_out, &out, &shard, &b, 5, how, s), Error::LengthMismatch(_));
    assert!(e.to_string().contains("whole rows of k = 5"), "{e}");
    untouched("k = 5")?;
    // out one row short, on the last PE only: the others must fail too.
    let short = out.slice(..np * m * n - if me == np - 1 { n } else { 0 });
    let r = ctx.all_gather_matmul(&a_out, short, &shard, &b, k, how, s);
    if me == np - 1 {
        let e = assert_err!(r, Error::LengthMismatch(_));
        assert!(e.to_string().contains("all_gather_matmul"), "{e}");
    } else if np > 1 {
        let e = assert_err!(r, Error::CollectiveMismatch(_));
        assert!(e.to_string().contains(&format!("PE {} rejected", np - 1)), "{e}");
    }
    untouched("out short on the last PE")?;
    // Overlapping output and input.
    let e =
        assert_err!(ctx.all_gather_matmul(&a_out, a_out.slice(..np * m * n), &shard, &b, k, how, s), Error::Invalid(_));
    assert!(e.to_string().contains("must not overlap"), "{e}");
    // No chunks.
    let e = assert_err!(
        ctx.all_gather_matmul(&a_out, &out, &shard, &b, k, Overlap { chunks: 0, ..how }, s),
        Error::Invalid(_)
    );
    assert!(e.to_string().contains("chunks"), "{e}");
    untouched("bad arguments")?;
    // Integers are refused.
    let ints = buffer(env, &vec![1i32; m * k])?;
    let e = assert_err!(ctx.all_gather_matmul(&ints, &ints, &ints, &ints, k, how, s), Error::UnsupportedOp { .. });
    assert!(e.to_string().contains("i32"), "{e}");
    // matmul_reduce_scatter: rows not divisible, small workspace.
    let rs_out = buffer(env, &vec![poison::<bf16>(); m * n])?;
    let a = buffer(env, &vec![bf16::ONE; (np * m + 1) * k])?;
    let ws = env.ctx.alloc::<bf16>(reduce_scatter_workspace_len(np * m, n))?;
    if np > 1 {
        let e = assert_err!(ctx.matmul_reduce_scatter(&rs_out, &a, &b, &ws, k, how, s), Error::LengthMismatch(_));
        assert!(e.to_string().contains("do not split evenly"), "{e}");
    }
    let a = a.slice(..np * m * k);
    let e = assert_err!(ctx.matmul_reduce_scatter(&rs_out, a, &b, ws.slice(1..), k, how, s), Error::LengthMismatch(_));
    assert!(e.to_string().contains("workspace"), "{e}");
    assert_bits_eq(&rs_out.copy_to_host(s)?, &vec![poison::<bf16>(); m * n], "matmul_reduce_scatter: out");
    // Still usable.
    ag_exact::<bf16>(env, m, k, n, how, false)
}
