//! Puts, gets, signals and atomics.

use crate::util::{assert_bits_eq, payload, payloads, poison, Env, TestElem, TestResult};
use crate::{each_dtype, TestFn};
use shmem::{Cmp, SignalOp};

pub const TESTS: &[(&str, TestFn)] = &[
    ("rma::world_shape", world_shape),
    ("rma::alloc_zeroed_and_heap_accounting", alloc_zeroed_and_heap_accounting),
    ("rma::put_ring_every_dtype", |e| each_dtype!(put_ring, e)),
    ("rma::get_ring_every_dtype", |e| each_dtype!(get_ring, e)),
    ("rma::put_slices_into_every_peer", put_slices_into_every_peer),
    ("rma::put_nbi_quiet_large", put_nbi_quiet_large),
    ("rma::p_and_g", p_and_g),
    ("rma::put_signal_set_and_add", put_signal_set_and_add),
    ("rma::signal_wait_every_cmp", signal_wait_every_cmp),
    ("rma::atomics_u32", atomics::<u32>),
    ("rma::atomics_u64", atomics::<u64>),
    ("rma::atomics_i32", atomics::<i32>),
    ("rma::atomics_i64", atomics::<i64>),
    ("rma::compare_swap_lock", compare_swap_lock),
    ("rma::peer_handle_arrays", peer_handle_arrays),
    ("rma::peer_pointers_within_the_node", peer_pointers_within_the_node),
];

fn world_shape(env: &Env) -> TestResult {
    let ctx = &env.ctx;
    let n: usize = std::env::var("SHMEM_WORLD_SIZE")
        .or_else(|_| std::env::var("OMPI_COMM_WORLD_SIZE"))
        .map(|v| v.parse().unwrap())
        .unwrap_or(1);
    assert_eq!(ctx.n_pes(), n);
    assert!(ctx.my_pe() < n);
    assert!(ctx.local_rank() < ctx.local_size());
    assert_eq!(ctx.world().n_pes(), n);
    assert_eq!(ctx.world().my_pe(), ctx.my_pe());
    assert_eq!(ctx.node().n_pes(), ctx.local_size());
    // Every PE sees every PE: gather the PE numbers.
    let mine = ctx.alloc::<u64>(1)?;
    let all = ctx.alloc::<u64>(n)?;
    mine.copy_from_host(&[ctx.my_pe() as u64 * 7 + 1], &env.s)?;
    ctx.all_gather(&all, &mine, &env.s)?;
    let want: Vec<u64> = (0..n as u64).map(|p| p * 7 + 1).collect();
    assert_eq!(all.copy_to_host(&env.s)?, want);
    Ok(())
}

fn alloc_zeroed_and_heap_accounting(env: &Env) -> TestResult {
    let ctx = &env.ctx;
    let before = ctx.heap_used();
    {
        // Dirty some memory, free it, and get it back zeroed.
        let dirty = ctx.alloc::<u64>(4096)?;
        dirty.fill(u64::MAX, &env.s)?;
        assert!(ctx.heap_used() >= before + 4096 * 8);
    }
    assert_eq!(ctx.heap_used(), before);
    let z = ctx.alloc_zeroed::<u64>(4096)?;
    assert!(z.copy_to_host(&env.s)?.iter().all(|&x| x == 0));
    // The same offset on every PE: PE 0's address of each peer's copy differs
    // from this PE's local copy by a heap-sized stride.
    assert_eq!(z.peer_ptr(env.me()), Some(z.local_ptr()));
    assert!(z.peer_ptr(env.n()).is_none());
    Ok(())
}

/// Loads and stores reach a peer's copy directly only within a node on the
/// gpu backend (NVLink, where the GPUs have it): another node's PEs, even
/// on the same machine (emulated nodes), are reached through NVSHMEM's
/// RMA. The host backend's heap is one machine's shared memory, so every
/// PE's copy has an address.
fn peer_pointers_within_the_node(env: &Env) -> TestResult {
    let ctx = &env.ctx;
    let buf = ctx.alloc_zeroed::<u64>(16)?;
    let node = ctx.node();
    let on_gpu = env.s.cuda_stream().is_some();
    let mut direct = Vec::new();
    for pe in 0..env.n() {
        let same_node = ctx.world().translate_pe(pe, &node)?.is_some();
        let has = buf.peer_ptr(pe).is_some();
        if has {
            direct.push(pe);
        }
        if on_gpu && !same_node {
            assert!(!has, "PE {pe} is on another node, yet has an address here");
        }
        if pe == env.me() || !on_gpu {
            assert!(has, "PE {pe}'s copy has no address here");
        }
    }
    if env.me() == 0 {
        eprintln!("PE 0 reaches PEs {direct:?} of {} by loads and stores", env.n());
    }
    Ok(())
}

fn put_ring<T: TestElem>(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let seed = env.fresh_seed();
    for len in [1usize, 7, 1000, 3 << 20 >> 3] {
        let src = env.ctx.alloc::<T>(len)?;
        let dst = env.ctx.alloc::<T>(len)?;
        src.copy_from_host(&payloads::<T>(seed, me, len), s)?;
        dst.fill(poison(), s)?;
        env.ctx.barrier_all(s)?;
        env.ctx.put(&dst, &src, (me + 1) % n, s)?;
        env.ctx.barrier_all(s)?;
        let from = (me + n - 1) % n;
        assert_bits_eq(&dst.copy_to_host(s)?, &payloads::<T>(seed, from, len), &format!("{} put of {len}", T::DTYPE));
        env.ctx.barrier_all(s)?;
    }
    Ok(())
}

fn get_ring<T: TestElem>(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let seed = env.fresh_seed();
    let len = 4099;
    let src = env.ctx.alloc::<T>(len)?;
    let dst = env.ctx.alloc::<T>(len)?;
    src.copy_from_host(&payloads::<T>(seed, me, len), s)?;
    dst.fill(poison(), s)?;
    env.ctx.barrier_all(s)?;
    let from = (me + 1) % n;
    env.ctx.get(dst.slice(1..), src.slice(..len - 1), from, s)?;
    let got = dst.copy_to_host(s)?;
    assert_eq!(got[0].bits(), poison::<T>().bits(), "element before the slice was written");
    assert_bits_eq(&got[1..], &payloads::<T>(seed, from, len - 1), &format!("{} get", T::DTYPE));
    env.ctx.barrier_all(s)?;
    Ok(())
}

fn put_slices_into_every_peer(env: &Env) -> TestResult {
    // Each PE writes its block into block `me` of every peer's buffer.
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let seed = env.fresh_seed();
    let block = 333;
    let src = env.ctx.alloc::<u32>(block)?;
    let dst = env.ctx.alloc::<u32>(block * n + 1)?;
    src.copy_from_host(&payloads::<u32>(seed, me, block), s)?;
    dst.fill(poison(), s)?;
    env.ctx.barrier_all(s)?;
    for pe in 0..n {
        env.ctx.put_nbi(dst.slice(me * block..(me + 1) * block), &src, pe, s)?;
    }
    env.ctx.quiet(s)?;
    env.ctx.barrier_all(s)?;
    let got = dst.copy_to_host(s)?;
    for pe in 0..n {
        assert_bits_eq(&got[pe * block..(pe + 1) * block], &payloads::<u32>(seed, pe, block), &format!("block {pe}"));
    }
    assert_eq!(got[n * block], poison::<u32>(), "the element past the blocks was written");
    env.ctx.barrier_all(s)?;
    Ok(())
}

fn put_nbi_quiet_large(env: &Env) -> TestResult {
    // Large enough for the parallel copy path.
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let seed = env.fresh_seed();
    let len = (9 << 20) / 8 + 3;
    let src = env.ctx.alloc::<u64>(len)?;
    let dst = env.ctx.alloc::<u64>(len)?;
    src.copy_from_host(&payloads::<u64>(seed, me, len), s)?;
    env.ctx.barrier_all(s)?;
    env.ctx.put_nbi(&dst, &src, (me + 1) % n, s)?;
    env.ctx.quiet(s)?;
    env.ctx.barrier_all(s)?;
    assert_bits_eq(&dst.copy_to_host(s)?, &payloads::<u64>(seed, (me + n - 1) % n, len), "9 MiB put_nbi");
    env.ctx.barrier_all(s)?;
    Ok(())
}

fn p_and_g(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let seed = env.fresh_seed();
    let buf = env.ctx.alloc_zeroed::<i64>(n)?;
    for pe in 0..n {
        env.ctx.p(&buf, me, payload::<i64>(seed, me, pe), pe, s)?;
    }
    env.ctx.barrier_all(s)?;
    for pe in 0..n {
        // Element `me` of PE pe holds what this PE wrote there; element pe
        // of this PE holds what PE pe wrote.
        assert_eq!(env.ctx.g(&buf, me, pe, s)?, payload::<i64>(seed, me, pe));
        assert_eq!(env.ctx.g(&buf, pe, me, s)?, payload::<i64>(seed, pe, me));
    }
    env.ctx.barrier_all(s)?;
    Ok(())
}

fn put_signal_set_and_add(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let seed = env.fresh_seed();
    let len = 10_000;
    let src = env.ctx.alloc::<f32>(len)?;
    // Blocks 0..n for the all-to-all phase, block n for the ring.
    let dst = env.ctx.alloc::<f32>(len * (n + 1))?;
    let ring = dst.slice(n * len..);
    let sig = env.ctx.alloc_zeroed::<u64>(2)?;
    src.copy_from_host(&payloads::<f32>(seed, me, len), s)?;
    env.ctx.barrier_all(s)?;
    // Ring with Set: the receiver waits for the signal, not a barrier.
    let to = (me + 1) % n;
    let from = (me + n - 1) % n;
    env.ctx.put_signal(ring, &src, &sig, 0, 1000 + me as u64, SignalOp::Set, to, s)?;
    let v = env.ctx.signal_wait_until(&sig, 0, Cmp::Eq, 1000 + from as u64, s)?;
    assert_eq!(v, 1000 + from as u64);
    assert_bits_eq(&ring.copy_to_host(s)?, &payloads::<f32>(seed, from, len), "put_signal data");
    // All to all with Add: every PE counts n arrivals.
    for pe in 0..n {
        env.ctx.put_signal_nbi(dst.slice(me * len..(me + 1) * len), &src, &sig, 1, 1, SignalOp::Add, pe, s)?;
    }
    assert_eq!(env.ctx.signal_wait_until(&sig, 1, Cmp::Ge, n as u64, s)?, n as u64);
    for pe in 0..n {
        assert_bits_eq(
            &dst.slice(pe * len..(pe + 1) * len).copy_to_host(s)?,
            &payloads::<f32>(seed, pe, len),
            &format!("block from PE {pe}"),
        );
    }
    assert_eq!(env.ctx.signal_fetch(&sig, 1, s)?, n as u64);
    env.ctx.barrier_all(s)?;
    Ok(())
}

fn signal_wait_every_cmp(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let sig = env.ctx.alloc_zeroed::<u64>(1)?;
    let to = (me + 1) % n;
    // (value set by the sender, comparison, target) — each holds only once
    // the sender's value arrived (the signal starts at 0, or at the last value).
    let steps =
        [(5, Cmp::Eq, 5), (9, Cmp::Ne, 5), (20, Cmp::Gt, 19), (21, Cmp::Ge, 21), (3, Cmp::Lt, 4), (2, Cmp::Le, 2)];
    for (value, cmp, target) in steps {
        env.ctx.barrier_all(s)?;
        env.ctx.signal_op(&sig, 0, value, SignalOp::Set, to, s)?;
        let got = env.ctx.signal_wait_until(&sig, 0, cmp, target, s)?;
        assert_eq!(got, value, "{cmp:?} {target}");
    }
    env.ctx.barrier_all(s)?;
    Ok(())
}

fn atomics<T: shmem::AtomicElement + TestElem>(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let ctx = &env.ctx;
    let buf = ctx.alloc_zeroed::<T>(6)?;
    let one = T::from_bits(1);
    let k = 50;
    // fetch_add and add: every PE adds to PE 0's counters.
    let mut seen = Vec::new();
    for _ in 0..k {
        seen.push(ctx.atomic_fetch_add(&buf, 0, one, 0, s)?.bits());
        ctx.atomic_add(&buf, 1, T::from_bits(2), 0, s)?;
    }
    // Or/and/xor: PE i owns bit i (PE i also sets bits then clears bit i+32 via and).
    ctx.atomic_fetch_or(&buf, 2, T::from_bits(1 << me), 0, s)?;
    ctx.atomic_fetch_xor(&buf, 3, T::from_bits(1 << me), 0, s)?;
    ctx.barrier_all(s)?;
    let all_bits = (1u64 << n) - 1;
    if me == 0 {
        ctx.atomic_set(&buf, 4, T::from_bits(all_bits), 0, s)?;
    }
    ctx.barrier_all(s)?;
    // Each PE clears its own bit of element 4 with and.
    let old = ctx.atomic_fetch_and(&buf, 4, T::from_bits(!(1u64 << me)), 0, s)?;
    assert_eq!(old.bits() & (1 << me), 1 << me, "bit {me} was already clear");
    ctx.barrier_all(s)?;
    assert_eq!(ctx.atomic_fetch(&buf, 0, 0, s)?.bits(), (n * k) as u64);
    assert_eq!(ctx.atomic_fetch(&buf, 1, 0, s)?.bits(), (2 * n * k) as u64);
    assert_eq!(ctx.atomic_fetch(&buf, 2, 0, s)?.bits(), all_bits);
    assert_eq!(ctx.atomic_fetch(&buf, 3, 0, s)?.bits(), all_bits);
    assert_eq!(ctx.atomic_fetch(&buf, 4, 0, s)?.bits(), 0);
    // fetch_add results seen by this PE are strictly increasing.
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "fetch_add results not increasing: {seen:?}");
    // swap: each PE swaps its number into its right neighbour's element 5.
    ctx.barrier_all(s)?;
    let to = (me + 1) % n;
    let old = ctx.atomic_swap(&buf, 5, T::from_bits(me as u64 + 100), to, s)?;
    assert_eq!(old.bits(), 0);
    ctx.barrier_all(s)?;
    assert_eq!(ctx.atomic_fetch(&buf, 5, me, s)?.bits(), ((me + n - 1) % n) as u64 + 100);
    ctx.barrier_all(s)?;
    Ok(())
}

fn compare_swap_lock(env: &Env) -> TestResult {
    // A spin lock on PE 0 guards a plain counter on PE 0: every PE takes it
    // `k` times; the counter must count every increment.
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let ctx = &env.ctx;
    let lock = ctx.alloc_zeroed::<u64>(1)?;
    let counter = ctx.alloc_zeroed::<u64>(1)?;
    let k = 40;
    for _ in 0..k {
        while ctx.atomic_compare_swap(&lock, 0, 0, me as u64 + 1, 0, s)? != 0 {
            std::thread::yield_now();
        }
        let c = ctx.g(&counter, 0, 0, s)?;
        ctx.p(&counter, 0, c + 1, 0, s)?;
        ctx.quiet(s)?;
        assert_eq!(ctx.atomic_swap(&lock, 0, 0, 0, s)?, me as u64 + 1, "someone else held the lock");
    }
    ctx.barrier_all(s)?;
    assert_eq!(ctx.g(&counter, 0, 0, s)?, (n * k) as u64);
    ctx.barrier_all(s)?;
    Ok(())
}

fn peer_handle_arrays(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let buf = env.ctx.alloc::<f32>(1000)?;
    let h = buf.handle()?;
    assert_eq!((h.rank, h.world_size), (me, n));
    for pe in 0..n {
        assert_eq!(h.buffer_ptrs[pe], buf.peer_ptr(pe).map_or(0, |p| p as u64), "buffer pointer of PE {pe}");
        assert_eq!(h.signal_pad_ptrs[pe], h.signal_pad().peer_ptr(pe).map_or(0, |p| p as u64));
    }
    assert_eq!(h.buffer_ptrs[me], buf.local_ptr() as u64);
    assert_eq!(h.signal_pad().len(), n * shmem::SIGNAL_PAD_WORDS_PER_PEER);
    assert!(h.signal_pad().copy_to_host(s)?.iter().all(|&w| w == 0), "signal pad not zeroed");
    // The arrays behind the `_dev` addresses hold the same addresses.
    let mut arrays = vec![0u64; 2 * n];
    if h.on_device() {
        let ctx = env.ctx.cuda_context().expect("a device array on the gpu backend");
        ctx.bind_to_thread()?;
        // SAFETY: the handle's device arrays are 2n u64, alive with `h`.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut arrays, h.buffer_ptrs_dev)? };
    } else {
        // SAFETY: on the host backend the arrays are 2n u64 of host memory owned by `h`.
        let a = unsafe { std::slice::from_raw_parts(h.buffer_ptrs_dev as *const u64, 2 * n) };
        arrays.copy_from_slice(a);
        assert_eq!(h.signal_pad_ptrs_dev, h.buffer_ptrs_dev + 8 * n as u64);
        // Host addresses are real: store through the right neighbour's pointer.
        let right = (me + 1) % n;
        env.ctx.barrier_all(s)?;
        // SAFETY: the neighbour's copy is mapped here, 1000 f32; only this PE writes element 0.
        unsafe { (h.buffer_ptrs[right] as *mut f32).write_volatile(me as f32 + 0.5) };
        env.ctx.barrier_all(s)?;
        assert_eq!(buf.copy_to_host(s)?[0], ((me + n - 1) % n) as f32 + 0.5);
    }
    assert_eq!(&arrays[..n], &h.buffer_ptrs[..]);
    assert_eq!(&arrays[n..], &h.signal_pad_ptrs[..]);
    env.ctx.barrier_all(s)?;
    // Over the node: the node's ranks, and its members' addresses as
    // `peer_ptr` gives them (`examples/device_kernel.rs` uses such a handle).
    let node = env.ctx.node();
    let hn = buf.handle_on(&node)?;
    assert_eq!((hn.rank, hn.world_size), (node.my_pe(), node.n_pes()));
    for r in 0..node.n_pes() {
        let pe = node.world_pe(r)?;
        assert_eq!(hn.buffer_ptrs[r], buf.peer_ptr(pe).map_or(0, |p| p as u64), "node rank {r} (PE {pe})");
        assert_eq!(hn.signal_pad_ptrs[r], hn.signal_pad().peer_ptr(pe).map_or(0, |p| p as u64));
    }
    assert_eq!(hn.buffer_ptrs[node.my_pe()], buf.local_ptr() as u64);
    env.ctx.barrier_all(s)?;
    Ok(())
}
