//! The `MoeAllToAll` layer against a reference every PE computes from
//! every PE's routing: its grouping, exact round trip and weighted combine,
//! the device path, its memory and traffic, and its refusals.

use super::*;

/// One PE's tokens and routing in the layer tests.
pub(crate) struct Routing<T> {
    pub(crate) tokens: Vec<T>,
    pub(crate) ids: Vec<i64>,
    pub(crate) weights: Vec<f32>,
}

/// Where the layer tests route tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Spread {
    /// Distinct experts at random.
    Random,
    /// Every token to experts of one PE (the same for every PE).
    OnePe,
    /// Every token to experts of every PE (slot `j` on PE `j % n`).
    EveryPe,
    /// A token's first 32 slots on one PE (each token's at random), the
    /// rest at random: a top-k past 32 meets its other PEs late.
    Late,
    /// No PE has tokens.
    Nothing,
}

/// PE `pe`'s tokens (some PEs none, some the maximum), top-k distinct
/// expert ids spread as `spread` says, and weights from `weight`.
pub(crate) fn routing<T: Float>(
    seed: u64,
    pe: usize,
    n: usize,
    c: &MoeConfig,
    spread: Spread,
    weight: &dyn Fn(&mut Rng, usize) -> f32,
) -> Routing<T> {
    let mut rng = Rng(seed ^ mix(pe as u64 + 1000));
    let n_tokens = match (spread, pe % 3) {
        (Spread::Nothing, _) => 0,
        (_, 0) => c.max_tokens,
        (_, 1) => rng.below(c.max_tokens + 1),
        _ => 0,
    };
    let ne = c.experts_per_pe;
    let hot = (seed % n as u64) as usize;
    let tokens = (0..n_tokens * c.hidden).map(|i| small(seed, pe, i)).collect();
    let mut ids = Vec::new();
    for _ in 0..n_tokens {
        let mut mine: Vec<i64> = Vec::new();
        let first = if spread == Spread::Late { rng.below(n) } else { 0 };
        while mine.len() < c.top_k {
            let g = match spread {
                Spread::OnePe => hot * ne + rng.below(ne),
                Spread::EveryPe => (mine.len() % n) * ne + rng.below(ne),
                Spread::Late if mine.len() < 32 => first * ne + rng.below(ne),
                _ => rng.below(n * ne),
            } as i64;
            if !mine.contains(&g) {
                mine.push(g);
            }
        }
        ids.extend(mine);
    }
    let weights = (0..ids.len()).map(|j| weight(&mut rng, j % c.top_k)).collect();
    Routing { tokens, ids, weights }
}

/// Whether `n` PEs have the distinct experts each token needs under
/// `spread` (a world too small for the case skips it).
pub(crate) fn routable(c: &MoeConfig, n: usize, spread: Spread) -> bool {
    let reach = if spread == Spread::OnePe { c.experts_per_pe } else { n * c.experts_per_pe };
    c.top_k <= reach && (spread != Spread::Late || c.top_k.min(32) <= c.experts_per_pe)
}

/// What expert `g` does to a row: scales it by `g + 1`.
pub(crate) fn expert<T: Float>(g: usize, x: T) -> T {
    T::from_f32(x.to_f32() * (g + 1) as f32)
}

/// What the dispatch must give PE `me`, from every PE's routing: each
/// local expert's rows, from every source in PE order, each in token order
/// (as (source, token, slot) triples); and what each PE sends to each PE.
pub(crate) fn expected_blocks<T>(all: &[Routing<T>], c: &MoeConfig, me: usize) -> Vec<Vec<(usize, usize, usize)>> {
    (0..c.experts_per_pe)
        .map(|e| {
            let g = (me * c.experts_per_pe + e) as i64;
            let mut rows = Vec::new();
            for (s, r) in all.iter().enumerate() {
                for (slot, &id) in r.ids.iter().enumerate() {
                    if id == g {
                        rows.push((s, slot / c.top_k, slot));
                    }
                }
            }
            rows
        })
        .collect()
}

/// Distinct tokens PE `r` sends to each of `n` PEs.
pub(crate) fn expected_sent<T>(r: &Routing<T>, c: &MoeConfig, n: usize) -> Vec<i64> {
    let mut sent = vec![0i64; n];
    for t in r.ids.chunks(c.top_k) {
        let mut d: Vec<usize> = t.iter().map(|&g| g as usize / c.experts_per_pe).collect();
        d.sort_unstable();
        d.dedup();
        d.into_iter().for_each(|d| sent[d] += 1);
    }
    sent
}

/// PEs a node as `moe`'s combine groups them: the node's in the
/// node-aware form, the world's (one group) in the flat one.
pub fn combine_group<T: shmem::Element>(env: &Env, moe: &MoeAllToAll<T>) -> usize {
    if moe.node_aware() {
        env.ctx.node().n_pes()
    } else {
        env.n()
    }
}

/// The combine's result for PE `me`'s tokens as `MoeAllToAll` defines it:
/// on each expert PE the weighted sum of that PE's slots in slot order,
/// rounded to `T`; those partials summed by groups of `group` PEs (the
/// nodes in the node-aware form) in PE order, rounded; those sums in
/// group order, rounded.
pub(crate) fn expected_combine<T: Float>(r: &Routing<T>, c: &MoeConfig, n: usize, group: usize) -> Vec<T> {
    let (h, k, ne) = (c.hidden, c.top_k, c.experts_per_pe);
    let mut out = Vec::with_capacity(r.tokens.len());
    for t in 0..r.ids.len() / k {
        for i in 0..h {
            let x = r.tokens[t * h + i];
            let mut acc = T::zero();
            for node in 0..n / group {
                let mut node_acc = None;
                for d in node * group..(node + 1) * group {
                    let slots: Vec<usize> = (0..k).filter(|&j| r.ids[t * k + j] as usize / ne == d).collect();
                    if slots.is_empty() {
                        continue;
                    }
                    let partial = slots.iter().fold(T::zero(), |a, &j| {
                        let g = r.ids[t * k + j] as usize;
                        T::weigh(a, r.weights[t * k + j], expert(g, x))
                    });
                    node_acc = Some(T::add(node_acc.unwrap_or(T::zero()), T::from_acc(partial)));
                }
                if let Some(sum) = node_acc {
                    acc = T::add(acc, T::from_acc(sum));
                }
            }
            out.push(T::from_acc(acc));
        }
    }
    out
}

/// Dispatches `all[me]`, checks the view, the layout and the traffic
/// against every PE's routing, runs the experts (`expert`, or the
/// identity), combines, and checks the sums against the reference.
pub(crate) fn dispatch_and_combine<T: Float>(
    env: &Env,
    moe: &MoeAllToAll<T>,
    all: &[Routing<T>],
    identity: bool,
    what: &str,
) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    let c = moe.config();
    let (h, ne) = (c.hidden, c.experts_per_pe);
    let mine = &all[me];
    let (view, layout) = moe.dispatch(&mine.tokens, &mine.ids, &mine.weights, s)?;
    let mut got = view.copy_to_host(s)?;
    assert_eq!(got.len(), layout.rows() * h, "{what}: view length");
    assert_eq!(layout.sent(), expected_sent(mine, &c, n), "{what}: distinct tokens sent to each PE");
    let want_received: Vec<(usize, usize)> = (0..n)
        .flat_map(|src| {
            let r = &all[src];
            (0..r.ids.len() / c.top_k)
                .filter(move |&t| r.ids[t * c.top_k..(t + 1) * c.top_k].iter().any(|&g| g as usize / ne == me))
                .map(move |t| (src, t))
        })
        .collect();
    assert_eq!(layout.received(), want_received, "{what}: received tokens");
    let mut at = 0;
    for (e, rows) in expected_blocks(all, &c, me).iter().enumerate() {
        let start = at;
        for src in 0..n {
            let from_src = rows.iter().filter(|r| r.0 == src).count();
            assert_eq!(layout.source_rows(e, src), at..at + from_src, "{what}: expert {e} from PE {src}");
            at += from_src;
        }
        assert_eq!(layout.expert_rows(e), start..at, "{what}: expert {e}'s rows");
        for (i, &(src, t, _)) in rows.iter().enumerate() {
            let r = start + i;
            let want = &all[src].tokens[t * h..(t + 1) * h];
            assert_bits_eq(&got[r * h..(r + 1) * h], want, &format!("{what}: expert {e} row {i}"));
        }
        assert_eq!(start % c.major_align, 0, "{what}: expert {e}'s block is aligned");
        at = start + (at - start).div_ceil(c.major_align).max(1) * c.major_align;
    }
    assert_eq!(layout.rows(), at, "{what}: padded rows");
    // Every placement names its token's row and weight.
    for (i, &(src, t)) in layout.received().iter().enumerate() {
        for (j, row, w) in layout.placements(i) {
            let slot = t * c.top_k + j;
            let g = all[src].ids[slot] as usize;
            assert_eq!(g / ne, me, "{what}: placement of received token {i} slot {j}");
            assert!(layout.expert_rows(g % ne).contains(&row), "{what}: received token {i} slot {j} at row {row}");
            assert_eq!(w.to_bits(), all[src].weights[slot].to_bits(), "{what}: weight of token {t} of PE {src}");
        }
    }
    if !identity {
        for e in 0..ne {
            let g = me * ne + e;
            for x in &mut got[layout.expert_rows(e).start * h..layout.expert_rows(e).end * h] {
                *x = expert(g, *x);
            }
        }
        view.copy_from_host(&got, s)?;
    }
    let out = moe.combine(view, &layout, s)?;
    let want = if identity { mine.tokens.clone() } else { expected_combine(mine, &c, n, combine_group(env, moe)) };
    assert_bits_eq(&out, &want, &format!("{what}: combined"));
    Ok(())
}

/// Weights that are powers of two summing to 1 (`1/2^c` each, the first
/// taking the rest): every partial sum of them times a token of few
/// significant bits is exact, even in bf16.
pub(crate) fn exact_weight(k: usize) -> impl Fn(&mut Rng, usize) -> f32 {
    let c = k.next_power_of_two() as f32;
    move |_, j| if j == 0 { 1.0 - (k - 1) as f32 / c } else { 1.0 / c }
}

/// Random weights, some negative.
pub(crate) fn random_weight(rng: &mut Rng, _: usize) -> f32 {
    [0.5f32, 0.25, 1.0, 2.0, -1.5, 0.3, -0.7][rng.below(7)]
}

pub(crate) fn layer_round_trip(env: &Env) -> TestResult {
    let n = env.n();
    for (top_k, ne, align) in [(1, 1, 1), (2, 3, 8), (3, 4, 16), (4, 2, 128), (8, 8, 4)] {
        for spread in [Spread::Random, Spread::OnePe, Spread::Nothing] {
            round_trip::<f32>(env, MoeConfig::new(8, 12, ne, top_k).major_align(align), spread)?;
        }
    }
    round_trip::<f32>(env, MoeConfig::new(8, 12, 2, n), Spread::EveryPe)?;
    round_trip::<bf16>(env, MoeConfig::new(16, 9, 4, 4).major_align(8), Spread::Random)?;
    round_trip::<bf16>(env, MoeConfig::new(16, 9, 8, 8), Spread::OnePe)?;
    round_trip::<bf16>(env, MoeConfig::new(16, 9, 2, 2 * n), Spread::EveryPe)?;
    round_trip::<f16>(env, MoeConfig::new(4, 5, 3, 3), Spread::Random)?;
    // Rows of several of the kernels' 8 KiB pieces: whole 16-byte vectors
    // (16 400 bytes), and not (8 200: the last piece 8 bytes).
    round_trip::<bf16>(env, MoeConfig::new(8200, 4, 2, 2), Spread::Random)?;
    round_trip::<bf16>(env, MoeConfig::new(4100, 5, 3, 3), Spread::Random)?;
    round_trip::<f64>(env, MoeConfig::new(3, 7, 2, 1), Spread::Random)
}

/// Tokens of at most 4 significant bits, times a power of two.
pub(crate) fn coarse<T: Float>(seed: u64, pe: usize, i: usize) -> T {
    let m = (mix(seed ^ mix((pe as u64) << 40 ^ i as u64 ^ 0xc0a5e)) % 31) as f32 - 15.0;
    T::from_f32(m * [0.125f32, 1.0, 8.0][i % 3])
}

/// Dispatch, identity experts, combine with weights summing to 1: the
/// tokens come back exactly; twice on one exchange.
pub(crate) fn round_trip<T: Float>(env: &Env, c: MoeConfig, spread: Spread) -> TestResult {
    let (n, me) = (env.n(), env.me());
    if !routable(&c, n, spread) {
        return Ok(());
    }
    let moe = MoeAllToAll::<T>::new(&env.ctx, c)?;
    for round in 0..2 {
        let seed = env.fresh_seed();
        let weight = exact_weight(c.top_k);
        let all: Vec<Routing<T>> = (0..n)
            .map(|pe| {
                let mut r = routing::<T>(seed, pe, n, &c, spread, &weight);
                r.tokens.iter_mut().enumerate().for_each(|(i, x)| *x = coarse(seed, pe, i));
                r
            })
            .collect();
        let what = format!("round trip {c:?} {} {spread:?} round {round} on PE {me}", T::DTYPE);
        dispatch_and_combine(env, &moe, &all, true, &what)?;
    }
    Ok(())
}

/// The floats the weighted test computes with.
pub(crate) trait Float: TestElem + CombineElement {
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl Float for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Float for f64 {
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn from_f32(x: f32) -> Self {
        x as f64
    }
}

impl Float for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

impl Float for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

/// Top-1 … top-8, 1 … 32 experts per PE, tokens to one PE, every PE or
/// none: experts that scale, random weights, the sums checked bit for bit
/// against the reference.
pub(crate) fn layer_weighted_combine(env: &Env) -> TestResult {
    let n = env.n();
    for (top_k, ne, align) in [(1, 1, 1), (2, 2, 8), (3, 5, 1), (5, 7, 16), (6, 32, 4), (8, 32, 1), (8, 8, 2)] {
        for spread in [Spread::Random, Spread::OnePe, Spread::Nothing] {
            weighted::<f32>(env, MoeConfig::new(8, 10, ne, top_k).major_align(align), spread)?;
        }
        weighted::<bf16>(env, MoeConfig::new(12, 6, ne, top_k).major_align(align), Spread::Random)?;
    }
    for top_k in [n, 2 * n, 8.max(n)] {
        weighted::<f32>(env, MoeConfig::new(8, 10, 8, top_k), Spread::EveryPe)?;
        weighted::<bf16>(env, MoeConfig::new(12, 6, 8, top_k).major_align(8), Spread::EveryPe)?;
    }
    weighted::<f16>(env, MoeConfig::new(5, 4, 1, 1).major_align(16), Spread::Random)?;
    // Rows of several 8 KiB pieces, in 16-byte vectors (10 000 bytes) and not (8 198).
    weighted::<f32>(env, MoeConfig::new(2500, 4, 3, 3), Spread::Random)?;
    weighted::<bf16>(env, MoeConfig::new(4099, 3, 4, 2).major_align(4), Spread::Random)?;
    weighted::<f64>(env, MoeConfig::new(5, 4, 3, 2), Spread::Random)
}

/// Token values: small floats, exact under the tests' scalings (random
/// bits could be NaN, or subnormal and lose bits when halved).
pub(crate) fn small<T: Float>(seed: u64, pe: usize, i: usize) -> T {
    T::from_f32(((mix(seed ^ mix((pe as u64) << 40 ^ i as u64)) % 2001) as f32 - 1000.0) / 64.0)
}

pub(crate) fn weighted<T: Float>(env: &Env, c: MoeConfig, spread: Spread) -> TestResult {
    let (n, me, seed) = (env.n(), env.me(), env.fresh_seed());
    if !routable(&c, n, spread) {
        return Ok(());
    }
    let all: Vec<Routing<T>> = (0..n).map(|pe| routing(seed, pe, n, &c, spread, &random_weight)).collect();
    let moe = MoeAllToAll::<T>::new(&env.ctx, c)?;
    let what = format!("weighted {c:?} {} {spread:?} on PE {me}", T::DTYPE);
    dispatch_and_combine(env, &moe, &all, false, &what)
}

/// The buffers are sized from the configuration, and within twice what
/// the largest dispatch sends, receives and returns.
pub(crate) fn layer_memory(env: &Env) -> TestResult {
    let n = env.n();
    for (c, elem) in [
        (MoeConfig::new(1024, 64, 4, 2).major_align(16), 2),
        (MoeConfig::new(7168, 128, 8, 8).major_align(128), 2),
        (MoeConfig::new(256, 32, 32, 8), 4),
    ] {
        let bytes = if elem == 2 {
            MoeAllToAll::<bf16>::new(&env.ctx, c)?.memory_bytes()
        } else {
            MoeAllToAll::<f32>::new(&env.ctx, c)?.memory_bytes()
        };
        let row = c.hidden * elem;
        let sent = c.max_tokens * c.top_k.min(n) * row;
        let received = n * c.max_tokens * row;
        let view = (n * c.max_tokens * c.top_k.min(c.experts_per_pe) + c.experts_per_pe * c.major_align) * row;
        let moved = sent + received + view;
        assert!(bytes >= moved, "{c:?}: {bytes} bytes hold less than the largest dispatch's {moved}");
        assert!(bytes <= 2 * moved, "{c:?}: {bytes} bytes, more than twice the largest dispatch's {moved}");
    }
    Ok(())
}

/// Every refusal of a bad routing: the fault on the PE that made it, a
/// collective mismatch naming that PE and the fault on the others, and
/// the last dispatch's view and layout unchanged.
pub(crate) fn err_layer(env: &Env) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    let c = MoeConfig::new(4, 3, 2, 2);
    if n > 1 {
        let k = if me == 0 { 1 } else { 2 };
        let e =
            assert_err!(MoeAllToAll::<f32>::new(&env.ctx, MoeConfig { top_k: k, ..c }), Error::CollectiveMismatch(_));
        assert!(e.to_string().contains("MoeAllToAll::new"), "{e}");
    }
    let bad_config = if me == n - 1 { MoeConfig { hidden: 0, ..c } } else { c };
    let r = MoeAllToAll::<f32>::new(&env.ctx, bad_config);
    assert_err!(r, Error::Invalid(_) | Error::CollectiveMismatch(_));
    // More experts per token than there are experts.
    let r = MoeAllToAll::<f32>::new(&env.ctx, MoeConfig { top_k: 2 * n + 1, ..c });
    assert_err!(r, Error::Invalid(_));

    let moe = MoeAllToAll::<f32>::new(&env.ctx, c)?;
    let tokens: Vec<f32> = (0..3 * 4).map(|i| (me * 100 + i) as f32).collect();
    let ids = vec![0i64, 1, 1, 0, (2 * n - 1) as i64, 0];
    let weights = vec![0.5f32; 6];
    let (view, layout) = moe.dispatch(&tokens, &ids, &weights, s)?;
    let before = view.copy_to_host(s)?;
    let splits_before = moe.device_layout().copy_to_host(s)?;
    let bad = n - 1;
    // (the fault, and the bad PE's tokens, ids and weights)
    type BadCase = (RoutingFault, Vec<f32>, Vec<i64>, Vec<f32>);
    let mut cases: Vec<BadCase> = vec![
        (RoutingFault::ExpertOutOfRange, tokens.clone(), vec![0, 1, 1, (2 * n) as i64, 0, 1], weights.clone()),
        (RoutingFault::ExpertOutOfRange, tokens.clone(), vec![-1; 6], weights.clone()),
        (RoutingFault::RepeatedExpert, tokens.clone(), vec![0, 1, 1, 1, 0, 1], weights.clone()),
        (RoutingFault::TooManyTokens, vec![0.0; 4 * 4], vec![0, 1, 1, 0, 0, 1, 1, 0], vec![0.5; 8]),
    ];
    for w in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut weights = weights.clone();
        weights[3] = w;
        cases.push((RoutingFault::NonFiniteWeight, tokens.clone(), ids.clone(), weights));
    }
    for (fault, bad_tokens, bad_ids, bad_weights) in cases {
        let r = if me == bad {
            moe.dispatch(&bad_tokens, &bad_ids, &bad_weights, s)
        } else {
            moe.dispatch(&tokens, &ids, &weights, s)
        };
        match r {
            Err(Error::BadRouting { fault: f, detail }) if me == bad => {
                assert_eq!(f, fault, "PE {me}: {detail}")
            }
            Err(Error::CollectiveMismatch(m)) if me != bad => {
                assert!(m.contains(&format!("PE {bad} ")) && m.contains(fault.describe()), "PE {me}: {m}")
            }
            Err(e) => panic!("{fault:?}: unexpected error on PE {me}: {e}"),
            Ok(_) => panic!("{fault:?}: a bad dispatch succeeded on PE {me}"),
        }
        assert_bits_eq(&view.copy_to_host(s)?, &before, &format!("{fault:?}: the view after a refused dispatch"));
        assert_eq!(moe.device_layout().copy_to_host(s)?, splits_before, "{fault:?}: the layout after a refusal");
    }
    assert_err!(moe.dispatch(&tokens, &ids[..5], &weights[..5], s), Error::LengthMismatch(_));
    assert_err!(moe.dispatch(&tokens, &ids, &weights[..5], s), Error::LengthMismatch(_));
    // Expert outputs too short on PE 0.
    let tiny = env.ctx.alloc::<f32>(4)?;
    let r = if me == 0 { moe.combine(&tiny, &layout, s) } else { moe.combine(view, &layout, s) };
    assert_err!(r, Error::LengthMismatch(_) | Error::CollectiveMismatch(_));
    // The layout still combines (identity experts, weights 1/2).
    let out = moe.combine(view, &layout, s)?;
    assert_bits_eq(&out, &tokens, "combine after refusals");
    Ok(())
}

/// A bad routing on one PE in `dispatch_on_device`, found on the device
/// (ids out of range or repeated, a weight not finite, a token count
/// negative or above `max_tokens`): on every PE the call, or the next
/// `check_device` after it has run, fails naming the PE and the fault
/// (on the host backend, where the call checks at once, the bad PE's own
/// error; in the node-aware form, off the bad PE's rail, the failed split
/// of the forwarder that took its rail's failure); the view and its
/// layout are as they were; then the layer works.
pub(crate) fn err_layer_on_device(env: &Env) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    let c = MoeConfig::new(4, 3, 2, 2);
    let moe = MoeAllToAll::<f32>::new(&env.ctx, c)?;
    let mine: Vec<f32> = (0..3 * 4).map(|i| (me * 100 + i) as f32).collect();
    let good_ids = vec![0i64, 1, 1, 0, (2 * n - 1) as i64, 0];
    let good_weights = vec![0.5f32; 6];
    let tokens = env.ctx.alloc::<f32>(mine.len())?;
    tokens.copy_from_host(&mine, s)?;
    let (ids, weights, count) = (env.ctx.alloc::<i64>(6)?, env.ctx.alloc::<f32>(6)?, env.ctx.alloc::<i64>(1)?);
    let out = env.ctx.alloc::<f32>(mine.len())?;
    let set = |i: &[i64], w: &[f32], nt: i64| -> TestResult {
        ids.copy_from_host(i, s)?;
        weights.copy_from_host(w, s)?;
        count.copy_from_host(&[nt], s)?;
        Ok(())
    };
    // Identity experts and weights 1/2: the round trip gives the tokens.
    let round_trip = |what: &str| -> TestResult {
        set(&good_ids, &good_weights, 3)?;
        out.fill(poison(), s)?;
        let view = moe.dispatch_on_device(&tokens, &ids, &weights, &count, s)?;
        moe.combine_on_device(view, &out, s)?;
        assert_bits_eq(&out.copy_to_host(s)?, &mine, what);
        env.ctx.check_device()?;
        Ok(())
    };
    round_trip("the round trip")?;
    let view = moe.dispatch_on_device(&tokens, &ids, &weights, &count, s)?;
    let (seen, layout) = (view.copy_to_host(s)?, moe.device_layout().copy_to_host(s)?);
    let bad = n - 1;
    let mut nan = good_weights.clone();
    nan[3] = f32::NAN;
    let cases: Vec<(RoutingFault, Vec<i64>, Vec<f32>, i64)> = vec![
        (RoutingFault::ExpertOutOfRange, vec![0, 1, 1, (2 * n) as i64, 0, 1], good_weights.clone(), 3),
        (RoutingFault::ExpertOutOfRange, vec![-1; 6], good_weights.clone(), 3),
        (RoutingFault::RepeatedExpert, vec![0, 1, 1, 1, 0, 1], good_weights.clone(), 3),
        (RoutingFault::NonFiniteWeight, good_ids.clone(), nan, 3),
        (RoutingFault::TooManyTokens, good_ids.clone(), good_weights.clone(), 4),
        (RoutingFault::TooManyTokens, good_ids.clone(), good_weights.clone(), -1),
    ];
    for (fault, bad_ids, bad_weights, nt) in cases {
        if me == bad {
            set(&bad_ids, &bad_weights, nt)?;
        } else {
            set(&good_ids, &good_weights, 3)?;
        }
        let r = moe.dispatch_on_device(&tokens, &ids, &weights, &count, s).map(drop);
        let r = r.and_then(|()| s.synchronize()).and_then(|()| env.ctx.check_device());
        match r {
            Err(Error::BadRouting { fault: f, detail }) if me == bad => assert_eq!(f, fault, "PE {me}: {detail}"),
            Err(e) => {
                // The bad PE and its fault; in the node-aware form on the
                // GPU, on the PEs off its rail, the forwarder of their node
                // that took its rail's failure (the PE of its local rank
                // there).
                let m = e.to_string();
                let per = env.ctx.node().n_pes();
                let forwarder = format!("PE {}'s split 0 is negative", me / per * per + bad % per);
                let ok = (m.contains(&format!("PE {bad} ")) && m.contains(fault.describe()))
                    || (moe.node_aware() && me % per != bad % per && m.contains(&forwarder));
                assert!(ok, "{fault:?}: PE {me}: {m}");
            }
            Ok(()) => panic!("{fault:?}: a bad dispatch succeeded on PE {me}"),
        }
        assert_bits_eq(&view.copy_to_host(s)?, &seen, &format!("{fault:?}: the view after a refused dispatch"));
        assert_eq!(moe.device_layout().copy_to_host(s)?, layout, "{fault:?}: the layout after a refusal");
    }
    round_trip("the round trip after the refusals")
}

/// `dispatch_on_device` and `combine_on_device` (everything in device
/// buffers, the token count too) give what `dispatch` and `combine` give:
/// the same dispatched rows and layout, bit for bit the same sums with
/// random weights; twice, with another token count the second time.
pub(crate) fn layer_on_device(env: &Env) -> TestResult {
    for (c, spread) in [
        (MoeConfig::new(8, 12, 2, 2).major_align(8), Spread::Random),
        (MoeConfig::new(5, 9, 3, 3), Spread::OnePe),
        (MoeConfig::new(16, 7, 1, 1).major_align(16), Spread::Random),
        (MoeConfig::new(16, 7, 4, 4).major_align(4), Spread::Nothing),
    ] {
        on_device::<f32>(env, c, spread)?;
        on_device::<bf16>(env, c, spread)?;
    }
    // A top-k past what the source's route checks in registers (8), and
    // past the slots the gather keeps in shared memory (64): the loops
    // that read a token's slots from memory one by one.
    on_device::<f32>(env, MoeConfig::new(8, 5, 12, 12), Spread::Random)?;
    on_device::<bf16>(env, MoeConfig::new(8, 3, 70, 66).major_align(4), Spread::Random)?;
    // A top-k past a warp's lanes but within the sums' shared slots (64):
    // a lane holds two of a token's slots as the sums find its distinct
    // wire rows.
    on_device::<bf16>(env, MoeConfig::new(8, 3, 48, 40).major_align(4), Spread::Late)?;
    on_device::<f64>(env, MoeConfig::new(3, 6, 2, 2), Spread::Random)?;
    // Many tokens, each to most PEs: on the GPU's decode form, more staged
    // rows than a block's threads (the view's ranks in several passes).
    on_device::<f32>(env, MoeConfig::new(16, 256, 8, 8).major_align(4), Spread::Random)?;
    // More tokens than the decode form takes, and than a block of the
    // exchange form's route ranks (512): its chunks' first rows.
    on_device::<bf16>(env, MoeConfig::new(8, 1100, 8, 8).major_align(4), Spread::Random)?;
    // Rows of 600 bytes, not whole 16-byte vectors, in the exchange form,
    // few enough that the receiver's warps take a row in pieces: a piece
    // whose source, offset and length are whole vectors still lands in
    // view rows that are not.
    on_device::<bf16>(env, MoeConfig::new(300, 300, 2, 2), Spread::Random)?;
    on_device::<f32>(env, MoeConfig::new(4, 1300, 64, 3), Spread::OnePe)
}

pub(crate) fn on_device<T: Float>(env: &Env, c: MoeConfig, spread: Spread) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    if !routable(&c, n, spread) {
        return Ok(());
    }
    let moe = MoeAllToAll::<T>::new(&env.ctx, c)?;
    let tokens = env.ctx.alloc::<T>(c.max_tokens * c.hidden)?;
    let ids = env.ctx.alloc::<i64>(c.max_tokens * c.top_k)?;
    let weights = env.ctx.alloc::<f32>(c.max_tokens * c.top_k)?;
    let count = env.ctx.alloc::<i64>(1)?;
    let out = env.ctx.alloc::<T>(c.max_tokens * c.hidden)?;
    for round in 0..2 {
        let seed = env.fresh_seed();
        let what = format!("{c:?} {} {spread:?} round {round}", T::DTYPE);
        let mut r = routing::<T>(seed, me, n, &c, spread, &random_weight);
        if round == 1 {
            // Fewer tokens than before: the rest of the buffers is stale.
            let keep = r.ids.len() / c.top_k / 2;
            r.ids.truncate(keep * c.top_k);
            r.weights.truncate(keep * c.top_k);
            r.tokens.truncate(keep * c.hidden);
        }
        let nt = r.ids.len() / c.top_k;
        tokens.slice(..r.tokens.len()).copy_from_host(&r.tokens, s)?;
        ids.slice(..r.ids.len()).copy_from_host(&r.ids, s)?;
        weights.slice(..r.weights.len()).copy_from_host(&r.weights, s)?;
        count.copy_from_host(&[nt as i64], s)?;
        out.fill(poison(), s)?;
        let view = moe.dispatch_on_device(&tokens, &ids, &weights, &count, s)?;
        let got = view.copy_to_host(s)?;
        let so = moe.device_layout().copy_to_host(s)?;
        let (want_view, layout) = moe.dispatch(&r.tokens, &r.ids, &r.weights, s)?;
        let want_rows = want_view.copy_to_host(s)?;
        let m = n * c.experts_per_pe;
        assert_eq!(so[..m], layout.splits()[..], "{what}: splits");
        assert_eq!(so[m..], layout.offsets()[..], "{what}: offsets");
        // Padding rows are never written: compare the blocks only.
        for e in 0..c.experts_per_pe {
            let rows = layout.expert_rows(e);
            let (a, b) = (rows.start * c.hidden, rows.end * c.hidden);
            assert_bits_eq(&got[a..b], &want_rows[a..b], &format!("{what}: expert {e}'s rows"));
        }
        // The host path's dispatch left the same rows in the receive
        // buffer: combine them with both paths.
        let want = moe.combine(want_view, &layout, s)?;
        moe.dispatch_on_device(&tokens, &ids, &weights, &count, s)?;
        moe.combine_on_device(view, &out, s)?;
        let got = out.copy_to_host(s)?;
        assert_bits_eq(&got[..nt * c.hidden], &want, &format!("{what}: combined"));
        let poisoned = vec![poison::<T>(); (c.max_tokens - nt) * c.hidden];
        assert_bits_eq(&got[nt * c.hidden..], &poisoned, &format!("{what}: rows past the tokens"));
    }
    env.ctx.check_device()?;
    Ok(())
}

/// The bytes of a wire row of `hidden` elements of `elem` bytes and
/// `top_k` slots, as the layer lays it out (also its combine's rows, in
/// the native format).
pub(crate) fn wire_stride(hidden: usize, elem: usize, top_k: usize) -> usize {
    ((hidden * elem).next_multiple_of(8) + 8 + 8 * top_k).next_multiple_of(16)
}

/// Distinct (token, node other than `pe`'s) pairs of `r`: the rows the
/// node-aware layer sends across the network for PE `pe`, with `per_node`
/// PEs a node; and of those, the ones bound for `node`.
pub(crate) fn remote_pairs<T>(r: &Routing<T>, c: &MoeConfig, pe: usize, per_node: usize, node: Option<usize>) -> usize {
    let width = c.experts_per_pe * per_node;
    r.ids
        .chunks(c.top_k)
        .map(|t| {
            let mut nodes: Vec<usize> = t.iter().map(|&g| g as usize / width).collect();
            nodes.sort_unstable();
            nodes.dedup();
            nodes.iter().filter(|&&b| b != pe / per_node && node.is_none_or(|x| x == b)).count()
        })
        .sum()
}

/// The layer's traffic with other nodes, per PE, on `dispatch_on_device`
/// and `combine_on_device`: in the node-aware form each token crosses to
/// each other node it is routed to once, and comes back once. On the
/// host backend, which reads what it receives, a PE's count is exact:
/// the dispatch reads the rail rows its rail peers sent to its node
/// (`stride` bytes each), the combine the rows of its own tokens coming
/// back, both plus the rail peers' splits (`N` i64 from each of the `N −
/// 1`). On the gpu backend, which puts what it sends, a PE's puts are at
/// least its own rows (its tokens' pairs in the dispatch, the rows its
/// rail peers sent it in the combine), and everything it moves at most
/// those plus the exchanges' splits and offsets and the call's agreement
/// (its row to each PE of another node). One node: nothing.
pub(crate) fn layer_net_bytes(env: &Env) -> TestResult {
    let n = env.n();
    for (top_k, ne, spread) in [
        (1, 2, Spread::Random),
        (2, 2, Spread::Random),
        (4, 3, Spread::Random),
        (8, 4, Spread::Random),
        (2, 4, Spread::OnePe),
        (n, 1, Spread::EveryPe),
        (2, 2, Spread::Nothing),
    ] {
        net_bytes::<f32>(env, MoeConfig::new(16, 9, ne, top_k), spread)?;
    }
    net_bytes::<bf16>(env, MoeConfig::new(40, 5, 2, 3).major_align(8), Spread::Random)
}

pub(crate) fn net_bytes<T: Float>(env: &Env, c: MoeConfig, spread: Spread) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    if !routable(&c, n, spread) {
        return Ok(());
    }
    let moe = MoeAllToAll::<T>::new(&env.ctx, c)?;
    let seed = env.fresh_seed();
    let all: Vec<Routing<T>> = (0..n)
        .map(|pe| {
            let mut r = routing::<T>(seed, pe, n, &c, spread, &exact_weight(c.top_k));
            r.tokens.iter_mut().enumerate().for_each(|(i, x)| *x = coarse(seed, pe, i));
            r
        })
        .collect();
    let mine = &all[me];
    let nt = mine.ids.len() / c.top_k;
    let tokens = env.ctx.alloc::<T>(c.max_tokens * c.hidden)?;
    let ids = env.ctx.alloc::<i64>(c.max_tokens * c.top_k)?;
    let weights = env.ctx.alloc::<f32>(c.max_tokens * c.top_k)?;
    let count = buffer(env, &[nt as i64])?;
    let out = env.ctx.alloc::<T>(c.max_tokens * c.hidden)?;
    tokens.slice(..mine.tokens.len()).copy_from_host(&mine.tokens, s)?;
    ids.slice(..mine.ids.len()).copy_from_host(&mine.ids, s)?;
    weights.slice(..mine.weights.len()).copy_from_host(&mine.weights, s)?;
    out.fill(poison(), s)?;
    let before = env.ctx.net_traffic(s)?;
    let view = moe.dispatch_on_device(&tokens, &ids, &weights, &count, s)?;
    let dispatched = env.ctx.net_traffic(s)?.since(&before);
    let before = env.ctx.net_traffic(s)?;
    moe.combine_on_device(view, &out, s)?;
    let combined = env.ctx.net_traffic(s)?.since(&before);
    let got = out.copy_to_host(s)?;
    let what = format!("net bytes of {c:?} {} {spread:?} on PE {me}", T::DTYPE);
    assert_bits_eq(&got[..nt * c.hidden], &mine.tokens, &format!("{what}: combined"));
    if !moe.node_aware() {
        if env.ctx.node().n_pes() == n {
            assert_eq!((dispatched.bytes(), combined.bytes()), (0, 0), "{what}: one node");
        }
        return Ok(());
    }
    let l = env.ctx.node().n_pes();
    let nodes = n / l;
    let stride = wire_stride(c.hidden, size_of::<T>(), c.top_k);
    // Rows this PE sends over its rail, and rows its rail peers send it.
    let out_rows = remote_pairs(mine, &c, me, l, None);
    let in_rows: usize = (0..nodes)
        .map(|a| a * l + me % l)
        .filter(|&p| p != me)
        .map(|p| remote_pairs(&all[p], &c, p, l, Some(me / l)))
        .sum();
    let splits = (nodes - 1) * nodes * 8;
    if env.s.cuda_stream().is_none() {
        assert_eq!(dispatched.bytes_put, 0, "{what}: the host backend reads");
        assert_eq!(dispatched.bytes_got as usize, in_rows * stride + splits, "{what}: dispatch");
        assert_eq!(combined.bytes_got as usize, out_rows * stride + splits, "{what}: combine");
    } else {
        let metadata = 4 * (nodes - 1) * 2 * nodes * 8;
        // The eager call's agreement over the world: a row of 8 words to
        // each PE of another node.
        let agreement = (n - l) * 8 * 8;
        for (step, t, rows) in [("dispatch", dispatched, out_rows), ("combine", combined, in_rows)] {
            let (put, all) = (t.bytes_put as usize, t.bytes() as usize);
            assert!(put >= rows * stride, "{what}: {step} put {put} bytes, fewer than its {rows} rows");
            let most = rows * stride + metadata + agreement;
            assert!(all <= most, "{what}: {step} moved {all} bytes, more than {rows} rows");
        }
    }
    Ok(())
}
