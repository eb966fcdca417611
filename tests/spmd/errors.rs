//! Bad input: a clear error on every PE, nothing written, and the world
//! still usable afterwards.

use crate::util::{assert_bits_eq, deferred_mismatch, needs_pes, payloads, poison, Env, TestResult};
use crate::{assert_err, TestFn};
use shmem::{BackendKind, Error, MoeAllToAll, MoeConfig, ReduceOp, SignalOp, SymmetricBuffer};

pub const TESTS: &[(&str, TestFn)] = &[
    ("errors::init_twice", init_twice),
    ("errors::alloc_size_differs", alloc_size_differs),
    ("errors::alloc_dtype_differs", alloc_dtype_differs),
    ("errors::freed_on_one_pe_only", freed_on_one_pe_only),
    ("errors::heap_exhausted", heap_exhausted),
    ("errors::rma_pe_range_length", rma_pe_range_length),
    ("errors::element_index_out_of_bounds", element_index_out_of_bounds),
    ("errors::host_copy_length", host_copy_length),
    ("errors::collective_count_differs", collective_count_differs),
    ("errors::collective_op_or_kind_differs", collective_op_or_kind_differs),
    ("errors::collective_buffer_differs", collective_buffer_differs),
    ("errors::collective_bad_on_one_pe", collective_bad_on_one_pe),
    ("errors::collective_bad_everywhere", collective_bad_everywhere),
    ("errors::split_bad_arguments", split_bad_arguments),
    ("errors::moe_calls_differ", moe_calls_differ),
    ("errors::moe_bad_on_one_pe", moe_bad_on_one_pe),
    ("errors::moe_layer_bad_on_one_pe", moe_layer_bad_on_one_pe),
    ("errors::moe_layer_calls_differ", moe_layer_calls_differ),
];

/// `start..end` built at run time (a reversed range is what is tested).
fn reversed(start: usize, end: usize) -> std::ops::Range<usize> {
    start..end
}

/// The error of a collective call whose PEs' calls differ, on this PE: the
/// call's own, or — on the gpu backend, where an eager call's kernel finds
/// the mismatch and skips the call on every PE — the stream's next
/// synchronisation's. Either way a [`Error::CollectiveMismatch`].
fn mismatch(env: &Env, r: shmem::Result<()>) -> Error {
    let e = match r {
        Err(e) => e,
        Ok(()) if env.ctx.backend() == BackendKind::Gpu => match env.s.synchronize() {
            Err(e) => e,
            Ok(()) => panic!("expected a collective mismatch, but the call and its stream's synchronisation succeeded"),
        },
        Ok(()) => panic!("expected a collective mismatch, but the call succeeded"),
    };
    assert!(matches!(e, Error::CollectiveMismatch(_)), "expected a collective mismatch, got the error: {e}");
    e
}

/// After an error: the world still works (exact all-reduces of one word
/// and of 8 KiB, which take different kernels on the gpu backend).
fn still_usable(env: &Env) -> TestResult {
    let n = env.n() as u64;
    for len in [1, 1024] {
        let x = env.ctx.alloc::<u64>(len)?;
        let mine: Vec<u64> = (0..len as u64).map(|i| ((env.me() as u64 + 1) << 20) | i).collect();
        x.copy_from_host(&mine, &env.s)?;
        env.ctx.all_reduce(&x, &x, ReduceOp::Sum, &env.s)?;
        let want: Vec<u64> = (0..len as u64).map(|i| ((n * (n + 1) / 2) << 20) | (n * i)).collect();
        assert_eq!(x.copy_to_host(&env.s)?, want);
    }
    Ok(())
}

fn init_twice(env: &Env) -> TestResult {
    assert_err!(shmem::init(), Error::AlreadyInitialized);
    assert_err!(shmem::Config::new().init(), Error::AlreadyInitialized);
    still_usable(env)
}

fn alloc_size_differs(env: &Env) -> TestResult {
    needs_pes(env, 2)?; // two PEs to differ
    let len = if env.me() == 0 { 10 } else { 11 };
    let e = assert_err!(env.ctx.alloc::<f32>(len), Error::CollectiveMismatch(_));
    assert!(e.to_string().contains("alloc"), "{e}");
    still_usable(env)
}

fn alloc_dtype_differs(env: &Env) -> TestResult {
    needs_pes(env, 2)?;
    // Same bytes, different types.
    if env.me() == 0 {
        assert_err!(env.ctx.alloc::<f32>(8), Error::CollectiveMismatch(_));
    } else {
        assert_err!(env.ctx.alloc::<i32>(8), Error::CollectiveMismatch(_));
    }
    still_usable(env)
}

fn freed_on_one_pe_only(env: &Env) -> TestResult {
    needs_pes(env, 2)?;
    let a = env.ctx.alloc::<u32>(100)?;
    let b = env.ctx.alloc::<u32>(100)?;
    // PE 0 frees `a` before the next allocation, the others do not.
    let a = if env.me() == 0 {
        drop(a);
        None
    } else {
        Some(a)
    };
    assert_err!(env.ctx.alloc::<u32>(100), Error::CollectiveMismatch(_));
    drop(a); // now every PE has freed it
    let c = env.ctx.alloc::<u32>(100)?;
    drop((c, b));
    still_usable(env)
}

fn heap_exhausted(env: &Env) -> TestResult {
    let size = env.ctx.heap_size();
    let e = assert_err!(env.ctx.alloc::<u32>(size / 4 + 1), Error::HeapExhausted { .. });
    assert!(e.to_string().contains("SHMEM_HEAP_SIZE"), "{e}");
    assert_err!(env.ctx.alloc::<u64>(usize::MAX), Error::HeapExhausted { .. });
    still_usable(env)
}

fn rma_pe_range_length(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let ctx = &env.ctx;
    let seed = env.fresh_seed();
    let src = ctx.alloc::<u32>(64)?;
    let dst = ctx.alloc::<u32>(64)?;
    let sig = ctx.alloc_zeroed::<u64>(1)?;
    src.copy_from_host(&payloads::<u32>(seed, me, 64), s)?;
    dst.fill(poison(), s)?;
    ctx.barrier_all(s)?;
    let to = (me + 1) % n;
    let e = assert_err!(ctx.put(&dst, &src, n, s), Error::PeOutOfRange { .. });
    assert_eq!(e.to_string(), format!("PE {n} is out of range for a team of {n} PEs"));
    assert_err!(ctx.get(&dst, &src, n + 5, s), Error::PeOutOfRange { .. });
    assert_err!(ctx.put(dst.slice(60..70), src.slice(..10), to, s), Error::OutOfBounds { start: 60, end: 70, len: 64 });
    assert_err!(ctx.put(dst.slice(reversed(10, 5)), src.slice(..0), to, s), Error::OutOfBounds { .. });
    assert_err!(ctx.put(dst.slice(..10), src.slice(..11), to, s), Error::LengthMismatch(_));
    assert_err!(ctx.get(dst.slice(..10), src.slice(..9), to, s), Error::LengthMismatch(_));
    assert_err!(
        ctx.put_signal(&dst, &src, &sig, 1, 1, SignalOp::Set, to, s),
        Error::IndexOutOfBounds { index: 1, len: 1 }
    );
    assert_err!(ctx.put_signal(dst.slice(..3), &src, &sig, 0, 1, SignalOp::Set, to, s), Error::LengthMismatch(_));
    ctx.barrier_all(s)?;
    // Nothing was written anywhere: not the data, not the signal.
    assert!(dst.copy_to_host(s)?.iter().all(|&x| x == poison::<u32>()), "a failed put wrote data");
    assert_eq!(ctx.signal_fetch(&sig, 0, s)?, 0, "a failed put_signal signalled");
    ctx.barrier_all(s)?;
    still_usable(env)
}

fn element_index_out_of_bounds(env: &Env) -> TestResult {
    let s = &env.s;
    let ctx = &env.ctx;
    let x = ctx.alloc_zeroed::<u64>(4)?;
    assert_err!(ctx.p(&x, 4, 1, 0, s), Error::IndexOutOfBounds { index: 4, len: 4 });
    assert_err!(ctx.g(&x, 9, 0, s), Error::IndexOutOfBounds { .. });
    assert_err!(ctx.atomic_fetch_add(&x, 4, 1, 0, s), Error::IndexOutOfBounds { .. });
    assert_err!(ctx.atomic_fetch_add(&x, 0, 1, env.n(), s), Error::PeOutOfRange { .. });
    assert_err!(ctx.signal_wait_until(&x, 4, shmem::Cmp::Eq, 0, s), Error::IndexOutOfBounds { .. });
    ctx.barrier_all(s)?;
    assert_eq!(x.copy_to_host(s)?, vec![0; 4]);
    still_usable(env)
}

fn host_copy_length(env: &Env) -> TestResult {
    let s = &env.s;
    let x = env.ctx.alloc::<f64>(8)?;
    x.fill(1.5, s)?;
    assert_err!(x.copy_from_host(&[0.0; 7], s), Error::LengthMismatch(_));
    assert_err!(x.slice(2..4).copy_from_host(&[0.0; 3], s), Error::LengthMismatch(_));
    assert_err!(x.slice(6..9).copy_to_host(s), Error::OutOfBounds { .. });
    let mut out = [0.0; 3];
    assert_err!(x.slice(..2).copy_to_host_into(&mut out, s), Error::LengthMismatch(_));
    assert_eq!(x.copy_to_host(s)?, vec![1.5; 8]);
    Ok(())
}

fn collective_count_differs(env: &Env) -> TestResult {
    needs_pes(env, 2)?;
    let s = &env.s;
    let src = env.ctx.alloc::<f32>(80)?;
    let dst = env.ctx.alloc::<f32>(80)?;
    src.fill(1.0, s)?;
    // 64 and 65 elements: 256 and 260 bytes, on either side of the most an
    // eager all-reduce carries in its agreement on the gpu backend, so the
    // PEs run different kernels.
    for (mine, last) in [(10, 11), (64, 65)] {
        dst.fill(poison(), s)?;
        let len = if env.me() == env.n() - 1 { last } else { mine };
        let e = mismatch(env, env.ctx.all_reduce(dst.slice(..len), src.slice(..len), ReduceOp::Sum, s));
        assert!(e.to_string().contains("all_reduce"), "{e}");
        let (a, b) = (format!("src {mine} elements"), format!("src {last} elements"));
        assert!(e.to_string().contains(&a) && e.to_string().contains(&b), "{e}");
        assert!(dst.copy_to_host(s)?.iter().all(|x| x.to_bits() == poison::<f32>().to_bits()), "dst written");
        still_usable(env)?;
    }
    Ok(())
}

fn collective_op_or_kind_differs(env: &Env) -> TestResult {
    needs_pes(env, 2)?;
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let src = env.ctx.alloc::<i32>(4)?;
    let dst = env.ctx.alloc::<i32>(4 * n)?;
    src.fill(me as i32, s)?;
    dst.fill(poison(), s)?;
    let op = if me == 0 { ReduceOp::Max } else { ReduceOp::Min };
    let e = mismatch(env, env.ctx.all_reduce(dst.slice(..4), &src, op, s));
    assert!(e.to_string().contains("max") && e.to_string().contains("min"), "{e}");
    let r = if me == 0 { env.ctx.broadcast(dst.slice(..4), &src, 0, s) } else { env.ctx.all_gather(&dst, &src, s) };
    let e = mismatch(env, r);
    assert!(e.to_string().contains("broadcast") && e.to_string().contains("all_gather"), "{e}");
    let r = if me == 0 { env.ctx.barrier_all(s) } else { env.ctx.all_to_all(dst.slice(..n), dst.slice(n..2 * n), s) };
    let e = mismatch(env, r);
    assert!(e.to_string().contains("barrier") && e.to_string().contains("all_to_all"), "{e}");
    assert!(dst.copy_to_host(s)?.iter().all(|&x| x == poison::<i32>()), "dst written");
    still_usable(env)
}

fn collective_buffer_differs(env: &Env) -> TestResult {
    needs_pes(env, 2)?;
    let s = &env.s;
    let a = env.ctx.alloc::<u64>(8)?;
    let b = env.ctx.alloc::<u64>(8)?;
    a.fill(poison(), s)?;
    b.fill(poison(), s)?;
    // Same shape, but PE 0 names another buffer than the others.
    let x = if env.me() == 0 { &a } else { &b };
    mismatch(env, env.ctx.all_reduce(x, x, ReduceOp::Sum, s));
    assert_eq!(a.copy_to_host(s)?, vec![poison::<u64>(); 8]);
    assert_eq!(b.copy_to_host(s)?, vec![poison::<u64>(); 8]);
    still_usable(env)
}

fn collective_bad_on_one_pe(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let src = env.ctx.alloc::<u32>(8)?;
    let dst = env.ctx.alloc::<u32>(8 * n)?;
    dst.fill(poison(), s)?;
    let bad = n - 1;
    // The last PE's source slice runs past its buffer.
    let range = if me == bad { 4..12 } else { 0..8 };
    let r = env.ctx.all_gather(&dst, src.slice(range), s);
    if me == bad {
        assert_err!(r, Error::OutOfBounds { start: 4, end: 12, len: 8 });
    } else {
        let e = mismatch(env, r);
        assert!(e.to_string().contains(&format!("PE {bad} rejected its arguments (a range out of bounds)")), "{e}");
    }
    assert!(dst.copy_to_host(s)?.iter().all(|&x| x == poison::<u32>()), "dst written");
    still_usable(env)
}

fn collective_bad_everywhere(env: &Env) -> TestResult {
    let (n, s) = (env.n(), &env.s);
    let f = env.ctx.alloc::<f32>(16 * n)?;
    let g = env.ctx.alloc::<f32>(16 * n)?;
    f.fill(poison(), s)?;
    g.fill(poison(), s)?;
    assert_err!(env.ctx.all_reduce(&f, &g, ReduceOp::Xor, s), Error::UnsupportedOp { op: "xor", dtype: "f32" });
    assert_err!(env.ctx.broadcast(&f, &g, n, s), Error::PeOutOfRange { .. });
    assert_err!(env.ctx.all_reduce(f.slice(..8), f.slice(4..12), ReduceOp::Sum, s), Error::Invalid(_));
    assert_err!(env.ctx.all_gather(&f, f.slice(..9), s), Error::LengthMismatch(_));
    assert_err!(env.ctx.reduce_scatter(f.slice(..7), &g, ReduceOp::Sum, s), Error::LengthMismatch(_));
    assert_err!(env.ctx.all_to_all(f.slice(..8 * n), g.slice(..16 * n), s), Error::LengthMismatch(_));
    if n > 1 {
        assert_err!(env.ctx.all_to_all(f.slice(..8 * n - 1), g.slice(..8 * n - 1), s), Error::LengthMismatch(_));
    }
    assert!(f.copy_to_host(s)?.iter().chain(&g.copy_to_host(s)?).all(|x| x.to_bits() == poison::<f32>().to_bits()));
    still_usable(env)
}

fn split_bad_arguments(env: &Env) -> TestResult {
    let (me, n) = (env.me(), env.n());
    let world = env.ctx.world();
    assert_err!(world.split_strided(0, 1, 0), Error::Invalid(_));
    assert_err!(world.split_strided(0, 0, 1), Error::Invalid(_));
    assert_err!(world.split_strided(0, 1, n + 1), Error::PeOutOfRange { .. });
    assert_err!(world.split_strided(n, 1, 1), Error::PeOutOfRange { .. });
    if n >= 2 {
        let r = world.split_strided(0, 1, if me == 0 { 1 } else { 2 });
        assert_err!(r, Error::CollectiveMismatch(_));
    }
    still_usable(env)
}

/// Poison of out splits/offsets.
const POISON_SO: i64 = -7;

/// A buffer holding `data`.
fn filled<T: crate::util::TestElem>(env: &Env, data: &[T]) -> shmem::Result<SymmetricBuffer<T>> {
    let b = env.ctx.alloc::<T>(data.len())?;
    b.copy_from_host(data, &env.s)?;
    Ok(b)
}

/// MoE all-to-all-v calls that differ between PEs (their sizes, the
/// operation, an all-to-all-v against a collective): a collective mismatch
/// naming both calls on every PE (on the gpu backend from the
/// synchronisation after the call, whose kernels agree on the device and
/// skip it), nothing written, nothing left for `check_device`.
fn moe_calls_differ(env: &Env) -> TestResult {
    needs_pes(env, 2)?;
    let (n, me, s) = (env.n(), env.me(), &env.s);
    let row_len = 4;
    let input = filled(env, &vec![1.0f32; 8 * row_len])?;
    let output = filled(env, &vec![poison::<f32>(); (8 * n + 1) * row_len])?;
    let splits = filled(env, &vec![1i64; 2 * n])?;
    let so = filled(env, &vec![POISON_SO; 4 * n])?;
    let sums = filled(env, &vec![1.0f32; 128])?;
    let nothing_written = |what: &str| -> TestResult {
        assert_bits_eq(&output.copy_to_host(s)?, &vec![poison::<f32>(); (8 * n + 1) * row_len], what);
        assert_eq!(so.copy_to_host(s)?, vec![POISON_SO; 4 * n], "{what}: out_splits_offsets");
        env.ctx.check_device()?;
        Ok(())
    };
    // The last PE's output is a row longer.
    let rows = if me == n - 1 { 8 * n + 1 } else { 8 * n };
    let r = env.ctx.all_to_all_v(&input, output.slice(..rows * row_len), splits.slice(..n), so.slice(..2 * n), 4, s);
    let e = deferred_mismatch(env, r).to_string();
    assert!(e.contains("all_to_all_v(f32") && e.contains("but PE"), "{e}");
    nothing_written("sizes differ")?;
    // The dispatch on PE 0, the combine on the others.
    let r = if me == 0 {
        env.ctx.all_to_all_v_2d(&input, &output, &splits, &so, row_len, 1, s)
    } else {
        env.ctx.all_to_all_v_2d_offset(&input, &output, &splits, so.slice(..2 * n), row_len, s)
    };
    let e = deferred_mismatch(env, r).to_string();
    assert!(e.contains("all_to_all_v_2d(") && e.contains("all_to_all_v_2d_offset("), "{e}");
    nothing_written("operations differ")?;
    // An all-to-all-v on PE 0, an all-reduce on the others.
    let r = if me == 0 {
        env.ctx.all_to_all_v(&input, &output, splits.slice(..n), so.slice(..2 * n), row_len, s)
    } else {
        env.ctx.all_reduce(&sums, &sums, ReduceOp::Sum, s)
    };
    let e = mismatch(env, r).to_string();
    assert!(e.contains("all_to_all_v(") && e.contains("all_reduce("), "{e}");
    nothing_written("a collective")?;
    assert_eq!(sums.copy_to_host(s)?, vec![1.0f32; 128], "the all-reduce's buffer");
    still_usable(env)
}

/// One PE's own bad arguments to a MoE all-to-all-v: its own error, at
/// once; on the others a collective mismatch naming it and the reason
/// (on the gpu backend from the synchronisation after the call); nothing
/// written.
fn moe_bad_on_one_pe(env: &Env) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    let bad = n - 1;
    let input = filled(env, &[1.0f32; 8 * 4])?;
    let output = filled(env, &vec![poison::<f32>(); n * 8 * 4])?;
    let splits = filled(env, &vec![2i64; n])?;
    let so = filled(env, &vec![POISON_SO; 2 * n])?;
    // The bad PE's out_splits_offsets is one entry short.
    let so_len = if me == bad { 2 * n - 1 } else { 2 * n };
    let r = env.ctx.all_to_all_v(&input, &output, &splits, so.slice(..so_len), 4, s);
    if me == bad {
        let e = assert_err!(r, Error::LengthMismatch(_));
        assert!(e.to_string().contains("out_splits_offsets has"), "{e}");
    } else {
        let e = deferred_mismatch(env, r).to_string();
        assert!(e.contains(&format!("PE {bad} rejected its arguments (a length mismatch)")), "{e}");
    }
    assert_bits_eq(&output.copy_to_host(s)?, &vec![poison::<f32>(); n * 8 * 4], "output");
    assert_eq!(so.copy_to_host(s)?, vec![POISON_SO; 2 * n], "out_splits_offsets");
    env.ctx.check_device()?;
    still_usable(env)
}

/// The MoE layer's device buffers of one PE: its tokens, routing (each
/// token to two experts, weights 1/2) and token count, and an output.
struct LayerCall {
    tokens: SymmetricBuffer<f32>,
    ids: SymmetricBuffer<i64>,
    weights: SymmetricBuffer<f32>,
    count: SymmetricBuffer<i64>,
    out: SymmetricBuffer<f32>,
    mine: Vec<f32>,
}

fn layer_call(env: &Env, c: &MoeConfig) -> shmem::Result<LayerCall> {
    let (n, me) = (env.n(), env.me());
    let experts = (n * c.experts_per_pe) as i64;
    let mine: Vec<f32> = (0..c.max_tokens * c.hidden).map(|i| (me * 1000 + i) as f32).collect();
    let ids: Vec<i64> =
        (0..c.max_tokens as i64).flat_map(|t| [(t + me as i64) % experts, (t + me as i64 + 1) % experts]).collect();
    Ok(LayerCall {
        tokens: filled(env, &mine)?,
        ids: filled(env, &ids)?,
        weights: filled(env, &vec![0.5f32; c.max_tokens * c.top_k])?,
        count: filled(env, &[c.max_tokens as i64])?,
        out: filled(env, &vec![poison::<f32>(); c.max_tokens * c.hidden])?,
        mine,
    })
}

/// One PE's buffer too short for the layer's configuration, in
/// `dispatch_on_device` and in `combine_on_device`: its own error at
/// once, on the others a collective mismatch naming it and the reason (on
/// the gpu backend from the synchronisation after the call; in the
/// node-aware form agreed over the world), and the view, layout and
/// output as they were; then the layer works.
fn moe_layer_bad_on_one_pe(env: &Env) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    let bad = n - 1;
    let c = MoeConfig::new(8, 4, 2, 2);
    let moe = MoeAllToAll::<f32>::new(&env.ctx, c)?;
    let call = layer_call(env, &c)?;
    let view = moe.dispatch_on_device(&call.tokens, &call.ids, &call.weights, &call.count, s)?;
    moe.combine_on_device(view, &call.out, s)?;
    assert_bits_eq(&call.out.copy_to_host(s)?, &call.mine, "the round trip");
    call.out.fill(poison(), s)?;
    let (seen, layout) = (view.copy_to_host(s)?, moe.device_layout().copy_to_host(s)?);
    let poisoned = vec![poison::<f32>(); c.max_tokens * c.hidden];
    let check = |r: shmem::Result<()>, what: &str| -> TestResult {
        if me == bad {
            let e = assert_err!(r, Error::LengthMismatch(_));
            assert!(e.to_string().contains(what), "{e}");
        } else {
            let e = deferred_mismatch(env, r).to_string();
            assert!(e.contains(&format!("PE {bad} rejected its arguments (a length mismatch)")), "{what}: {e}");
        }
        assert_bits_eq(&view.copy_to_host(s)?, &seen, &format!("{what}: the view"));
        assert_eq!(moe.device_layout().copy_to_host(s)?, layout, "{what}: the layout");
        assert_bits_eq(&call.out.copy_to_host(s)?, &poisoned, &format!("{what}: the output"));
        env.ctx.check_device()?;
        Ok(())
    };
    let ids = if me == bad { call.ids.slice(1..) } else { (&call.ids).into() };
    let r = moe.dispatch_on_device(&call.tokens, ids, &call.weights, &call.count, s).map(drop);
    check(r, "topk_expert_ids")?;
    let out = if me == bad { call.out.slice(1..) } else { (&call.out).into() };
    check(moe.combine_on_device(view, out, s), "out has")?;
    // The layer works.
    let view = moe.dispatch_on_device(&call.tokens, &call.ids, &call.weights, &call.count, s)?;
    moe.combine_on_device(view, &call.out, s)?;
    assert_bits_eq(&call.out.copy_to_host(s)?, &call.mine, "the round trip after the refusals");
    env.ctx.check_device()?;
    still_usable(env)
}

/// A `dispatch_on_device` on PE 0 against a `combine_on_device` on the
/// others: a collective mismatch on every PE (on the gpu backend from the
/// synchronisation after the call), PE 0's view and the others' output as
/// they were; then the layer works.
fn moe_layer_calls_differ(env: &Env) -> TestResult {
    needs_pes(env, 2)?;
    let (me, s) = (env.me(), &env.s);
    let c = MoeConfig::new(8, 4, 2, 2);
    let moe = MoeAllToAll::<f32>::new(&env.ctx, c)?;
    let call = layer_call(env, &c)?;
    let view = moe.dispatch_on_device(&call.tokens, &call.ids, &call.weights, &call.count, s)?;
    let seen = view.copy_to_host(s)?;
    let r = if me == 0 {
        moe.dispatch_on_device(&call.tokens, &call.ids, &call.weights, &call.count, s).map(drop)
    } else {
        moe.combine_on_device(view, &call.out, s)
    };
    let e = deferred_mismatch(env, r).to_string();
    let named = e.contains("MoeAllToAll::dispatch(") && e.contains("MoeAllToAll::combine(");
    // (The flat form's exchanges: the same operation on other buffers.)
    assert!(named || (!moe.node_aware() && e.contains("all_to_all_v(")), "{e}");
    if me == 0 {
        assert_bits_eq(&view.copy_to_host(s)?, &seen, "the dispatch's view");
    } else {
        assert_bits_eq(&call.out.copy_to_host(s)?, &vec![poison::<f32>(); c.max_tokens * c.hidden], "the output");
    }
    env.ctx.check_device()?;
    let view = moe.dispatch_on_device(&call.tokens, &call.ids, &call.weights, &call.count, s)?;
    moe.combine_on_device(view, &call.out, s)?;
    assert_bits_eq(&call.out.copy_to_host(s)?, &call.mine, "the round trip after the mismatch");
    env.ctx.check_device()?;
    still_usable(env)
}
