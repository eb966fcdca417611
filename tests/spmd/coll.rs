//! Collectives over the world, for every element type, out of place and in
//! place, at sizes that take each algorithm's path.

use crate::util::{assert_bits_eq, mix, payload, payloads, poison, Env, TestElem, TestResult};
use crate::{each_dtype, TestFn};
use shmem::ReduceOp;

pub const TESTS: &[(&str, TestFn)] = &[
    ("coll::barrier_orders_writes", barrier_orders_writes),
    ("coll::broadcast_every_dtype_every_root", |e| each_dtype!(broadcast, e)),
    ("coll::all_gather_every_dtype", |e| each_dtype!(all_gather, e)),
    ("coll::all_reduce_every_dtype_every_op", |e| each_dtype!(all_reduce, e)),
    ("coll::reduce_scatter_every_dtype_every_op", |e| each_dtype!(reduce_scatter, e)),
    ("coll::all_to_all_every_dtype", |e| each_dtype!(all_to_all, e)),
    ("coll::graph_replay_all_reduce_gpu_only", graph_replay_all_reduce),
];

/// Sizes (elements per PE) that cover tiny, odd, one-shot and two-shot.
const SIZES: &[usize] = &[1, 7, 1000, 200_003];

/// The reduction inputs: small values that keep results exact.
fn input<T: TestElem>(seed: u64, pe: usize, i: usize, op: ReduceOp) -> T {
    T::small(mix(seed ^ mix((pe as u64) << 40 ^ i as u64)), op)
}

/// The reference: PE values combined in PE order, as the runtime promises.
fn reduced<T: TestElem>(seed: u64, n: usize, i: usize, op: ReduceOp) -> T {
    let mut acc = input::<T>(seed, 0, i, op).to_acc();
    for pe in 1..n {
        acc = T::combine(op, acc, input::<T>(seed, pe, i, op).to_acc());
    }
    T::from_acc(acc)
}

fn barrier_orders_writes(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let buf = env.ctx.alloc_zeroed::<u64>(n)?;
    for round in 1..=20u64 {
        for pe in 0..n {
            env.ctx.p(&buf, me, round * 100 + me as u64, pe, s)?;
        }
        env.ctx.barrier_all(s)?;
        let got = buf.copy_to_host(s)?;
        for (pe, v) in got.iter().enumerate() {
            assert_eq!(*v, round * 100 + pe as u64, "round {round}: PE {pe}'s write not visible after the barrier");
        }
        env.ctx.barrier_all(s)?;
    }
    Ok(())
}

fn broadcast<T: TestElem>(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    for &len in &SIZES[..3] {
        let seed = env.fresh_seed();
        let src = env.ctx.alloc::<T>(len)?;
        let dst = env.ctx.alloc::<T>(len)?;
        for root in 0..n {
            src.copy_from_host(&payloads::<T>(seed, me, len), s)?;
            dst.fill(poison(), s)?;
            env.ctx.broadcast(&dst, &src, root, s)?;
            assert_bits_eq(
                &dst.copy_to_host(s)?,
                &payloads::<T>(seed, root, len),
                &format!("{} broadcast root {root}", T::DTYPE),
            );
            // In place: src is the destination too.
            env.ctx.broadcast(&src, &src, root, s)?;
            assert_bits_eq(&src.copy_to_host(s)?, &payloads::<T>(seed, root, len), "in-place broadcast");
        }
    }
    Ok(())
}

fn all_gather<T: TestElem>(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    for &len in SIZES {
        let seed = env.fresh_seed();
        let src = env.ctx.alloc::<T>(len)?;
        let dst = env.ctx.alloc::<T>(len * n)?;
        src.copy_from_host(&payloads::<T>(seed, me, len), s)?;
        dst.fill(poison(), s)?;
        env.ctx.all_gather(&dst, &src, s)?;
        let want: Vec<T> = (0..n).flat_map(|pe| payloads::<T>(seed, pe, len)).collect();
        assert_bits_eq(&dst.copy_to_host(s)?, &want, &format!("{} all_gather of {len}", T::DTYPE));
        // In place: this PE's block of dst is the source.
        dst.fill(poison(), s)?;
        dst.slice(me * len..(me + 1) * len).copy_from_host(&payloads::<T>(seed, me, len), s)?;
        env.ctx.all_gather(&dst, dst.slice(me * len..(me + 1) * len), s)?;
        assert_bits_eq(&dst.copy_to_host(s)?, &want, "in-place all_gather");
    }
    Ok(())
}

fn all_reduce<T: TestElem>(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    for &len in SIZES {
        let src = env.ctx.alloc::<T>(len)?;
        let dst = env.ctx.alloc::<T>(len)?;
        for &op in T::OPS {
            let seed = env.fresh_seed();
            let mine: Vec<T> = (0..len).map(|i| input(seed, me, i, op)).collect();
            let want: Vec<T> = (0..len).map(|i| reduced(seed, n, i, op)).collect();
            src.copy_from_host(&mine, s)?;
            dst.fill(poison(), s)?;
            env.ctx.all_reduce(&dst, &src, op, s)?;
            let what = format!("{} all_reduce {op} of {len}", T::DTYPE);
            assert_bits_eq(&dst.copy_to_host(s)?, &want, &what);
            assert_bits_eq(&src.copy_to_host(s)?, &mine, &format!("{what}: src changed"));
            env.ctx.all_reduce(&src, &src, op, s)?;
            assert_bits_eq(&src.copy_to_host(s)?, &want, &format!("in-place {what}"));
        }
    }
    Ok(())
}

fn reduce_scatter<T: TestElem>(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    for &len in &SIZES[..3] {
        let src = env.ctx.alloc::<T>(len * n)?;
        let dst = env.ctx.alloc::<T>(len)?;
        for &op in T::OPS {
            let seed = env.fresh_seed();
            let mine: Vec<T> = (0..len * n).map(|i| input(seed, me, i, op)).collect();
            src.copy_from_host(&mine, s)?;
            dst.fill(poison(), s)?;
            env.ctx.reduce_scatter(&dst, &src, op, s)?;
            let want: Vec<T> = (me * len..(me + 1) * len).map(|i| reduced(seed, n, i, op)).collect();
            assert_bits_eq(&dst.copy_to_host(s)?, &want, &format!("{} reduce_scatter {op} of {len}", T::DTYPE));
            // Into this PE's own block of src.
            env.ctx.reduce_scatter(src.slice(me * len..(me + 1) * len), &src, op, s)?;
            assert_bits_eq(&src.slice(me * len..(me + 1) * len).copy_to_host(s)?, &want, "in-place reduce_scatter");
        }
    }
    Ok(())
}

fn all_to_all<T: TestElem>(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    for &c in &SIZES[..3] {
        let seed = env.fresh_seed();
        let src = env.ctx.alloc::<T>(c * n)?;
        let dst = env.ctx.alloc::<T>(c * n)?;
        src.copy_from_host(&payloads::<T>(seed, me, c * n), s)?;
        dst.fill(poison(), s)?;
        env.ctx.all_to_all(&dst, &src, s)?;
        // Block j of this PE's dst is block `me` of PE j's src.
        let want: Vec<T> = (0..n).flat_map(|j| (me * c..(me + 1) * c).map(move |i| payload::<T>(seed, j, i))).collect();
        assert_bits_eq(&dst.copy_to_host(s)?, &want, &format!("{} all_to_all of {c} per PE", T::DTYPE));
        env.ctx.all_to_all(&src, &src, s)?;
        assert_bits_eq(&src.copy_to_host(s)?, &want, "in-place all_to_all");
    }
    Ok(())
}

/// GPU only: an all-reduce and an all-gather captured once in a CUDA graph
/// and replayed 1000 times with new inputs each time; every result exact. (The device
/// kernel's barrier epochs live in device memory, so replays need no host.)
fn graph_replay_all_reduce(env: &Env) -> TestResult {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let Some(stream) = env.s.cuda_stream() else {
        if env.me() == 0 {
            eprintln!(
                "coll::graph_replay_all_reduce_gpu_only: skipped: needs the gpu backend (this run is {:?})",
                env.ctx.backend()
            );
        }
        return Ok(());
    };
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let len = 4099; // odd: the kernel's vector loop and its tail
    let src = env.ctx.alloc::<f32>(len)?;
    let dst = env.ctx.alloc::<f32>(len)?;
    let gathered = env.ctx.alloc::<f32>(len * n)?;
    env.ctx.barrier_all(s)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured =
        env.ctx.all_reduce(&dst, &src, ReduceOp::Sum, s).and_then(|()| env.ctx.all_gather(&gathered, &src, s));
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    if env.ctx.force_rma() {
        // NVSHMEM's host-side collectives cannot be captured: a clear error.
        let e = crate::assert_err!(captured, shmem::Error::Invalid(_));
        assert!(e.to_string().contains("cannot be captured"), "{e}");
        return Ok(());
    }
    captured?;
    let graph = graph.ok_or("capture gave no graph")?;
    for replay in 0..1000u64 {
        let seed = env.fresh_seed() ^ replay;
        let mine: Vec<f32> = (0..len).map(|i| input(seed, me, i, ReduceOp::Sum)).collect();
        let want: Vec<f32> = (0..len).map(|i| reduced(seed, n, i, ReduceOp::Sum)).collect();
        src.copy_from_host(&mine, s)?;
        dst.fill(poison(), s)?;
        gathered.fill(poison(), s)?;
        graph.launch()?;
        assert_bits_eq(&dst.copy_to_host(s)?, &want, &format!("all_reduce, replay {replay}"));
        let all: Vec<f32> = (0..n).flat_map(|pe| (0..len).map(move |i| input(seed, pe, i, ReduceOp::Sum))).collect();
        assert_bits_eq(&gathered.copy_to_host(s)?, &all, &format!("all_gather, replay {replay}"));
    }
    env.ctx.barrier_all(s)?;
    Ok(())
}
