//! The 8-bit element types (u8, i8, FP8 e4m3 and e5m2): moved exactly by
//! puts, gets and the data collectives, refused by reductions.

use crate::util::{Env, TestResult};
use crate::TestFn;
use shmem::{fp8_e4m3, fp8_e5m2, Element, Error, ReduceOp};

pub const TESTS: &[(&str, TestFn)] = &[
    ("bytes::put_get_ring", |e| every_type(e, put_get_ring)),
    ("bytes::collectives_move_exactly", |e| every_type(e, collectives_move_exactly)),
    ("bytes::reductions_are_refused", |e| every_type(e, reductions_are_refused)),
];

/// An 8-bit element made from its byte (every byte is a value; for the FP8
/// types, NaN codes included: equality compares encodings).
trait Byte: Element {
    fn of(b: u8) -> Self;
}
impl Byte for u8 {
    fn of(b: u8) -> u8 {
        b
    }
}
impl Byte for i8 {
    fn of(b: u8) -> i8 {
        b as i8
    }
}
impl Byte for fp8_e4m3 {
    fn of(b: u8) -> fp8_e4m3 {
        fp8_e4m3::from_bits(b)
    }
}
impl Byte for fp8_e5m2 {
    fn of(b: u8) -> fp8_e5m2 {
        fp8_e5m2::from_bits(b)
    }
}

/// Runs `test` for each 8-bit type.
fn every_type(env: &Env, test: fn(&Env, Kind) -> TestResult) -> TestResult {
    [Kind::U8, Kind::I8, Kind::E4M3, Kind::E5M2].into_iter().try_for_each(|k| test(env, k))
}

#[derive(Clone, Copy)]
enum Kind {
    U8,
    I8,
    E4M3,
    E5M2,
}

macro_rules! with_type {
    ($kind:expr, $f:ident, $($a:expr),*) => {
        match $kind {
            Kind::U8 => $f::<u8>($($a),*),
            Kind::I8 => $f::<i8>($($a),*),
            Kind::E4M3 => $f::<fp8_e4m3>($($a),*),
            Kind::E5M2 => $f::<fp8_e5m2>($($a),*),
        }
    };
}

/// Element `i` of `pe`'s payload: the sender and the index in one byte,
/// so a wrong source or offset shows (`0x5a`, the poison, is skipped).
fn payload<T: Byte>(seed: u64, pe: usize, len: usize) -> Vec<T> {
    (0..len)
        .map(|i| {
            let b = (seed as usize + pe * 67 + i * 13 + i / 256) as u8;
            T::of(if b == 0x5a { 0xa5 } else { b })
        })
        .collect()
}

fn poison<T: Byte>() -> T {
    T::of(0x5a)
}

fn put_get_ring(env: &Env, kind: Kind) -> TestResult {
    with_type!(kind, put_get_ring_of, env)
}

fn put_get_ring_of<T: Byte>(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let seed = env.fresh_seed();
    for len in [1usize, 15, 4099] {
        let src = env.ctx.alloc::<T>(len)?;
        let dst = env.ctx.alloc::<T>(len + 1)?;
        src.copy_from_host(&payload::<T>(seed, me, len), s)?;
        dst.fill(poison(), s)?;
        env.ctx.barrier_all(s)?;
        // Into the next PE at an odd offset: byte granularity.
        env.ctx.put(dst.slice(1..), &src, (me + 1) % n, s)?;
        env.ctx.barrier_all(s)?;
        let got = dst.copy_to_host(s)?;
        assert_eq!(got[0], poison(), "{} put of {len}: the element before was written", T::DTYPE);
        assert_eq!(got[1..], payload::<T>(seed, (me + n - 1) % n, len), "{} put of {len}", T::DTYPE);
        dst.fill(poison(), s)?;
        env.ctx.get(dst.slice(..len), &src, (me + 1) % n, s)?;
        let got = dst.copy_to_host(s)?;
        assert_eq!(got[..len], payload::<T>(seed, (me + 1) % n, len), "{} get of {len}", T::DTYPE);
        assert_eq!(got[len], poison(), "{} get of {len}: the element after was written", T::DTYPE);
        env.ctx.barrier_all(s)?;
    }
    Ok(())
}

fn collectives_move_exactly(env: &Env, kind: Kind) -> TestResult {
    with_type!(kind, collectives_of, env)
}

fn collectives_of<T: Byte>(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let seed = env.fresh_seed();
    let d = T::DTYPE;
    for len in [1usize, 33, 5000] {
        let src = env.ctx.alloc::<T>(len * n)?;
        let dst = env.ctx.alloc::<T>(len * n)?;
        src.copy_from_host(&payload::<T>(seed, me, len * n), s)?;
        dst.fill(poison(), s)?;
        env.ctx.all_gather(&dst, src.slice(..len), s)?;
        let want: Vec<T> = (0..n).flat_map(|pe| payload::<T>(seed, pe, len)).collect();
        assert_eq!(dst.copy_to_host(s)?, want, "{d} all_gather of {len}");

        let root = n - 1;
        dst.fill(poison(), s)?;
        env.ctx.broadcast(&dst, &src, root, s)?;
        assert_eq!(dst.copy_to_host(s)?, payload::<T>(seed, root, len * n), "{d} broadcast of {len}");

        // Block `j` of PE `pe`'s source lands in block `pe` of PE `j`.
        dst.fill(poison(), s)?;
        env.ctx.all_to_all(&dst, &src, s)?;
        let want: Vec<T> =
            (0..n).flat_map(|pe| payload::<T>(seed, pe, len * n)[me * len..(me + 1) * len].to_vec()).collect();
        assert_eq!(dst.copy_to_host(s)?, want, "{d} all_to_all of {len}");
        env.ctx.barrier_all(s)?;
    }
    Ok(())
}

fn reductions_are_refused(env: &Env, kind: Kind) -> TestResult {
    with_type!(kind, refused_of, env)
}

fn refused_of<T: Byte>(env: &Env) -> TestResult {
    let (n, s) = (env.n(), &env.s);
    let src = env.ctx.alloc::<T>(8 * n)?;
    let dst = env.ctx.alloc::<T>(8 * n)?;
    dst.fill(poison(), s)?;
    src.fill(T::of(0x11), s)?;
    for op in ReduceOp::ALL {
        let e = env.ctx.all_reduce(&dst, &src, op, s).expect_err("a reduction of an 8-bit type");
        assert!(
            matches!(e, Error::UnsupportedOp { op: o, dtype } if o == op.name() && dtype == T::DTYPE.name()),
            "{e}"
        );
        assert_eq!(e.to_string(), format!("reduction {op} is not defined for {}", T::DTYPE));
        let e = env.ctx.reduce_scatter(dst.slice(..8), &src, op, s).expect_err("a reduce-scatter of an 8-bit type");
        assert!(matches!(e, Error::UnsupportedOp { .. }), "{e}");
    }
    assert!(dst.copy_to_host(s)?.iter().all(|&x| x == poison()), "{}: dst written", T::DTYPE);
    // Refused alike everywhere: the context still works.
    env.ctx.barrier_all(s)?;
    Ok(())
}
