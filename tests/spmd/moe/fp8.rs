//! The FP8 dispatch of `MoeAllToAll`: on fresh random bf16 tokens whose
//! quantization groups are zeros, tiny (down to subnormal scales), large,
//! mixed signs or one outlier, the received e4m3 codes and scales equal
//! `shmem::quant` of the sent token bit for bit; the bf16 view equals
//! their dequantization exactly; identity experts and the combine return
//! each token as the exact reference computes it from the dequantized
//! token, within FP8 rounding of the original; pre-quantized tokens
//! travel as given; missing scales fail on every PE and write nothing.

use super::{combine_group, exact_weight, expected_blocks, routable, routing, Routing, Spread};
use crate::util::{deferred_mismatch, mix, poison, Env, TestResult};
use crate::{assert_err, TestFn};
use shmem::quant::{dequantize_vec, quantize_vec, scales_len, GROUP};
use shmem::{
    bf16, fp8_e4m3, Error, Fp8DeviceTokens, Fp8Out, Fp8Tokens, Fp8View, Layout, MoeAllToAll, MoeConfig, MoeKernels,
};

pub const TESTS: &[(&str, TestFn)] = &[
    ("moe::fp8::quantized_bit_exact", quantized_bit_exact),
    ("moe::fp8::round_trip", round_trip),
    ("moe::fp8::pre_quantized", pre_quantized),
    ("moe::fp8::on_device", on_device),
    ("moe::fp8::errors::missing_scales", missing_scales),
    ("moe::fp8::errors::not_fp8", not_fp8),
    // The layer's exchange form where its decode form would run (its
    // gathers quantize, copy and place in their own code).
    ("moe::lines::fp8::quantized_bit_exact", |e| super::with_form(e, MoeKernels::Lines, quantized_bit_exact)),
    ("moe::lines::fp8::pre_quantized", |e| super::with_form(e, MoeKernels::Lines, pre_quantized)),
    ("moe::lines::fp8::on_device", |e| super::with_form(e, MoeKernels::Lines, on_device)),
    ("moe::lines::fp8::errors::missing_scales", |e| super::with_form(e, MoeKernels::Lines, missing_scales)),
];

/// The configurations: hidden a multiple of the group and not (a short
/// last group), one group, top-1 to top-4.
fn configs(n: usize) -> Vec<(MoeConfig, Spread)> {
    vec![
        (MoeConfig::new(256, 6, 2, 2).major_align(4).fp8(), Spread::Random),
        (MoeConfig::new(300, 5, 3, 3).fp8(), Spread::Random),
        (MoeConfig::new(128, 4, 1, 1).fp8(), Spread::Random),
        (MoeConfig::new(200, 4, 2, n.min(4)).fp8(), Spread::EveryPe),
        (MoeConfig::new(130, 5, 4, 2).major_align(8).fp8(), Spread::OnePe),
        // Codes of two 8 KiB pieces, the last group short.
        (MoeConfig::new(8300, 3, 2, 2).fp8(), Spread::Random),
    ]
}

/// Element `i` of PE `pe`'s token `t` (rows of `h`): each group of
/// [`GROUP`] elements is, by a draw, all zeros (with negative zeros), tiny
/// (about 2⁻¹⁰⁰), at the bottom of the range (scales below f32's normals),
/// large (about 2¹⁰⁰), mixed signs over 16 binades, or small values with
/// one outlier.
fn element(seed: u64, pe: usize, h: usize, t: usize, i: usize) -> bf16 {
    let group = mix(seed ^ mix((pe as u64) << 32 ^ (t * h / GROUP + i / GROUP) as u64 ^ 0xf8));
    let r = mix(seed ^ mix((pe as u64) << 48 ^ (t * h + i) as u64));
    let sign = if r & 1 == 0 { 1.0 } else { -1.0 };
    let mantissa = 1.0 + (r >> 8 & 0xff) as f32 / 256.0;
    let binade = |lo: i32, span: u64| 2f32.powi(lo + ((r >> 20) % span) as i32);
    let x = match group % 6 {
        0 => 0.0 * sign,
        1 => sign * mantissa * binade(-104, 8),
        2 => sign * mantissa * binade(-126, 4),
        3 => sign * mantissa * binade(96, 8),
        4 => sign * mantissa * binade(-8, 16),
        _ if i % GROUP == (group >> 8) as usize % GROUP.min(h - i / GROUP * GROUP) => sign * 3.0e4,
        _ => sign * mantissa * binade(-4, 4),
    };
    bf16::from_f32(x)
}

/// Every PE's routing (exact weights) with FP8 test tokens.
fn all_routings(env: &Env, c: &MoeConfig, spread: Spread) -> Vec<Routing<bf16>> {
    let (n, seed) = (env.n(), env.fresh_seed());
    (0..n)
        .map(|pe| {
            let mut r = routing::<bf16>(seed, pe, n, c, spread, &exact_weight(c.top_k));
            let h = c.hidden;
            r.tokens.iter_mut().enumerate().for_each(|(k, x)| *x = element(seed, pe, h, k / h, k % h));
            r
        })
        .collect()
}

/// Token `t` of PE `src`, quantized by the reference.
fn reference(all: &[Routing<bf16>], h: usize, src: usize, t: usize) -> (Vec<fp8_e4m3>, Vec<f32>) {
    quantize_vec(&all[src].tokens[t * h..(t + 1) * h])
}

fn code_bits(q: &[fp8_e4m3]) -> Vec<u8> {
    q.iter().map(|c| c.to_bits()).collect()
}

fn float_bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|s| s.to_bits()).collect()
}

fn bf16_bits(x: &[bf16]) -> Vec<u16> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Checks the FP8 view's blocks against the reference quantization of
/// every token routed here: codes and scales bit for bit, and the bf16
/// view (where there is one) their dequantization exactly.
fn check_view(
    env: &Env,
    c: &MoeConfig,
    all: &[Routing<bf16>],
    view: &Fp8View,
    layout: &Layout,
    what: &str,
) -> TestResult {
    let (me, s) = (env.me(), &env.s);
    let (h, g) = (c.hidden, scales_len(c.hidden));
    let codes = view.rows.copy_to_host(s)?;
    let scales = view.scales.copy_to_host(s)?;
    let values = view.bf16.map(|v| v.copy_to_host(s)).transpose()?;
    for (e, rows) in expected_blocks(all, c, me).iter().enumerate() {
        let block = layout.expert_rows(e);
        assert_eq!(block.len(), rows.len(), "{what}: expert {e}'s rows");
        for (r, &(src, t, _)) in block.zip(rows) {
            let (q, sc) = reference(all, h, src, t);
            let at = format!("{what}: expert {e} view row {r} (token {t} of PE {src})");
            assert_eq!(code_bits(&codes[r * h..(r + 1) * h]), code_bits(&q), "{at}: codes");
            assert_eq!(float_bits(&scales[r * g..(r + 1) * g]), float_bits(&sc), "{at}: scales");
            if let Some(v) = &values {
                let want: Vec<bf16> = dequantize_vec(&q, &sc)?;
                assert_eq!(bf16_bits(&v[r * h..(r + 1) * h]), bf16_bits(&want), "{at}: dequantized");
            }
        }
    }
    Ok(())
}

/// The combine of identity experts as `MoeAllToAll` defines it, on the
/// dequantized tokens: per destination PE the weighted sum of its slots
/// in f32, rounded to bf16; those summed by groups of `group` PEs (the
/// nodes in the node-aware form) in PE order, rounded; those sums in
/// group order, rounded.
fn identity_combine(r: &Routing<bf16>, c: &MoeConfig, n: usize, group: usize) -> Vec<bf16> {
    let (h, k, ne) = (c.hidden, c.top_k, c.experts_per_pe);
    let mut out = Vec::with_capacity(r.tokens.len());
    for t in 0..r.ids.len() / k {
        let (q, sc) = quantize_vec(&r.tokens[t * h..(t + 1) * h]);
        let x: Vec<bf16> = dequantize_vec(&q, &sc).expect("lengths");
        for &xi in &x {
            let mut acc = 0f32;
            for node in 0..n / group {
                let mut node_acc = None;
                for d in node * group..(node + 1) * group {
                    let slots: Vec<usize> = (0..k).filter(|&j| r.ids[t * k + j] as usize / ne == d).collect();
                    if !slots.is_empty() {
                        let partial = slots.iter().fold(0f32, |a, &j| a + r.weights[t * k + j] * xi.to_f32());
                        node_acc = Some(node_acc.unwrap_or(0f32) + bf16::from_f32(partial).to_f32());
                    }
                }
                if let Some(sum) = node_acc {
                    acc += bf16::from_f32(sum).to_f32();
                }
            }
            out.push(bf16::from_f32(acc));
        }
    }
    out
}

/// The combined tokens: the reference bit for bit, and within FP8's
/// rounding of the originals — `|x' − x| ≤ |x|·2⁻⁴ + scale·2⁻¹⁰` for the
/// quantization, plus a bf16 rounding of the dequantized value and of
/// each of the three sums (`4 × 2⁻⁸ |x|` with room) — where the group's
/// scale is a normal f32 (a subnormal scale has fewer bits). `group` as
/// [`identity_combine`] takes it.
fn check_combined(got: &[bf16], r: &Routing<bf16>, c: &MoeConfig, (n, group): (usize, usize), what: &str) {
    assert_eq!(bf16_bits(got), bf16_bits(&identity_combine(r, c, n, group)), "{what}: combined");
    let h = c.hidden;
    for (t, (row, x)) in got.chunks(h).zip(r.tokens.chunks(h)).enumerate() {
        let (_, sc) = quantize_vec(x);
        for (i, (&o, &x)) in row.iter().zip(x).enumerate() {
            let (o, x, s) = (o.to_f32(), x.to_f32(), sc[i / GROUP]);
            if s < f32::MIN_POSITIVE {
                continue;
            }
            let bound = x.abs() * (2f32.powi(-4) + 4.0 * 2f32.powi(-8)) * 1.1 + s * 2f32.powi(-10) * 1.1;
            assert!((o - x).abs() <= bound, "{what}: token {t} element {i}: {x} came back as {o} (scale {s})");
        }
    }
}

/// bf16 tokens quantized on the sender: codes and scales as the
/// reference, with and without the bf16 view; `dispatch` (the bf16 view)
/// gives the same values.
fn quantized_bit_exact(env: &Env) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    for (c, spread) in configs(n) {
        if !routable(&c, n, spread) {
            continue;
        }
        let moe = MoeAllToAll::<bf16>::new(&env.ctx, c)?;
        for out in [Fp8Out::E4m3, Fp8Out::Bf16] {
            let all = all_routings(env, &c, spread);
            let mine = &all[me];
            let what = format!("{c:?} {spread:?} {out:?} on PE {me}");
            let (view, layout) = moe.dispatch_fp8(Fp8Tokens::Bf16(&mine.tokens), &mine.ids, &mine.weights, out, s)?;
            assert_eq!(view.bf16.is_some(), out == Fp8Out::Bf16, "{what}: the bf16 view");
            check_view(env, &c, &all, &view, &layout, &what)?;
            let (rows, layout) = moe.dispatch(&mine.tokens, &mine.ids, &mine.weights, s)?;
            // The codes and scales it left, with its bf16 view.
            let bf16_view = Fp8View { bf16: Some(rows), ..moe.fp8_received().expect("an FP8 exchange") };
            check_view(env, &c, &all, &bf16_view, &layout, &format!("{what}: dispatch"))?;
        }
    }
    Ok(())
}

/// Dispatch (bf16 view), identity experts, combine; then the same from
/// the e4m3 view, dequantized by the experts into a buffer of their own.
fn round_trip(env: &Env) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    for (c, spread) in configs(n) {
        if !routable(&c, n, spread) {
            continue;
        }
        let moe = MoeAllToAll::<bf16>::new(&env.ctx, c)?;
        let view_len = moe.fp8_received().and_then(|v| v.bf16).expect("an FP8 exchange").len();
        let outputs = env.ctx.alloc::<bf16>(view_len)?;
        for round in 0..2 {
            let all = all_routings(env, &c, spread);
            let mine = &all[me];
            let what = format!("{c:?} {spread:?} round {round} on PE {me}");
            let (rows, layout) = moe.dispatch(&mine.tokens, &mine.ids, &mine.weights, s)?;
            let got = moe.combine(rows, &layout, s)?;
            check_combined(&got, mine, &c, (n, combine_group(env, &moe)), &format!("{what}: bf16 view"));
            let (view, layout) =
                moe.dispatch_fp8(Fp8Tokens::Bf16(&mine.tokens), &mine.ids, &mine.weights, Fp8Out::E4m3, s)?;
            let (h, g) = (c.hidden, scales_len(c.hidden));
            let (codes, scales) = (view.rows.copy_to_host(s)?, view.scales.copy_to_host(s)?);
            let mut x = vec![bf16::ZERO; layout.rows() * h];
            for r in 0..layout.rows() {
                let row: Vec<bf16> = dequantize_vec(&codes[r * h..(r + 1) * h], &scales[r * g..(r + 1) * g])?;
                x[r * h..(r + 1) * h].copy_from_slice(&row);
            }
            outputs.slice(0..x.len()).copy_from_host(&x, s)?;
            let got = moe.combine(&outputs, &layout, s)?;
            check_combined(&got, mine, &c, (n, combine_group(env, &moe)), &format!("{what}: e4m3 view"));
        }
    }
    Ok(())
}

/// Tokens quantized by the caller travel as they are (here the reference's
/// codes and scales, so the view is checked as before), into either view.
fn pre_quantized(env: &Env) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    for (c, spread) in configs(n) {
        if !routable(&c, n, spread) {
            continue;
        }
        let moe = MoeAllToAll::<bf16>::new(&env.ctx, c)?;
        for out in [Fp8Out::E4m3, Fp8Out::Bf16] {
            let all = all_routings(env, &c, spread);
            let mine = &all[me];
            let (codes, scales) = quantize_rows(&mine.tokens, c.hidden);
            let what = format!("pre-quantized {c:?} {spread:?} {out:?} on PE {me}");
            let tokens = Fp8Tokens::Quantized { codes: &codes, scales: &scales };
            let (view, layout) = moe.dispatch_fp8(tokens, &mine.ids, &mine.weights, out, s)?;
            check_view(env, &c, &all, &view, &layout, &what)?;
            if let Some(rows) = view.bf16 {
                let got = moe.combine(rows, &layout, s)?;
                check_combined(&got, mine, &c, (n, combine_group(env, &moe)), &what);
            }
        }
    }
    Ok(())
}

/// The reference's codes and scales of each row of `h`.
fn quantize_rows(x: &[bf16], h: usize) -> (Vec<fp8_e4m3>, Vec<f32>) {
    let (mut codes, mut scales) = (Vec::new(), Vec::new());
    for row in x.chunks(h) {
        let (q, s) = quantize_vec(row);
        codes.extend(q);
        scales.extend(s);
    }
    (codes, scales)
}

/// `dispatch_fp8_on_device` (bf16 tokens quantized in the dispatch, and
/// pre-quantized ones) and `combine_on_device`: the same view and sums as
/// the reference; twice, fewer tokens the second time.
fn on_device(env: &Env) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    for (c, spread) in configs(n) {
        if !routable(&c, n, spread) {
            continue;
        }
        let (h, g) = (c.hidden, scales_len(c.hidden));
        let moe = MoeAllToAll::<bf16>::new(&env.ctx, c)?;
        let tokens = env.ctx.alloc::<bf16>(c.max_tokens * h)?;
        let codes = env.ctx.alloc::<fp8_e4m3>(c.max_tokens * h)?;
        let scales = env.ctx.alloc::<f32>(c.max_tokens * g)?;
        let ids = env.ctx.alloc::<i64>(c.max_tokens * c.top_k)?;
        let weights = env.ctx.alloc::<f32>(c.max_tokens * c.top_k)?;
        let count = env.ctx.alloc::<i64>(1)?;
        let out = env.ctx.alloc::<bf16>(c.max_tokens * h)?;
        for round in 0..2 {
            let mut all = all_routings(env, &c, spread);
            if round == 1 {
                for r in &mut all {
                    let keep = r.ids.len() / c.top_k / 2;
                    r.ids.truncate(keep * c.top_k);
                    r.weights.truncate(keep * c.top_k);
                    r.tokens.truncate(keep * h);
                }
            }
            let mine = &all[me];
            let nt = mine.ids.len() / c.top_k;
            let (q, sc) = quantize_rows(&mine.tokens, h);
            tokens.slice(..mine.tokens.len()).copy_from_host(&mine.tokens, s)?;
            codes.slice(..q.len()).copy_from_host(&q, s)?;
            scales.slice(..sc.len()).copy_from_host(&sc, s)?;
            ids.slice(..mine.ids.len()).copy_from_host(&mine.ids, s)?;
            weights.slice(..mine.weights.len()).copy_from_host(&mine.weights, s)?;
            count.copy_from_host(&[nt as i64], s)?;
            let (_, layout) = moe.dispatch(&mine.tokens, &mine.ids, &mine.weights, s)?;
            let inputs = [
                ("quantized in the dispatch", Fp8DeviceTokens::Bf16((&tokens).into())),
                ("pre-quantized", Fp8DeviceTokens::Quantized { codes: (&codes).into(), scales: (&scales).into() }),
            ];
            for (how, input) in inputs {
                let what = format!("on device, {how}, {c:?} {spread:?} round {round} on PE {me}");
                out.fill(poison(), s)?;
                let view = moe.dispatch_fp8_on_device(input, &ids, &weights, &count, Fp8Out::Bf16, s)?;
                let so = moe.device_layout().copy_to_host(s)?;
                let m = n * c.experts_per_pe;
                assert_eq!(so[..m], layout.splits()[..], "{what}: splits");
                assert_eq!(so[m..], layout.offsets()[..], "{what}: offsets");
                check_view(env, &c, &all, &view, &layout, &what)?;
                moe.combine_on_device(view.bf16.expect("asked for"), &out, s)?;
                let got = out.copy_to_host(s)?;
                check_combined(&got[..nt * h], mine, &c, (n, combine_group(env, &moe)), &what);
                let poisoned = vec![poison::<bf16>(); (c.max_tokens - nt) * h];
                assert_eq!(bf16_bits(&got[nt * h..]), bf16_bits(&poisoned), "{what}: rows past the tokens");
            }
        }
    }
    env.ctx.check_device()?;
    Ok(())
}

/// Pre-quantized tokens without (enough) scales on one PE: a length error
/// naming the scales there, a collective mismatch naming that PE on the
/// others (on the gpu backend, from the device call, once it has run),
/// and every view as the last good dispatch left it; the host call and
/// the device call.
fn missing_scales(env: &Env) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    let c = MoeConfig::new(200, 4, 2, 2).fp8();
    let (h, g) = (c.hidden, scales_len(c.hidden));
    let moe = MoeAllToAll::<bf16>::new(&env.ctx, c)?;
    let all = all_routings(env, &c, Spread::Random);
    let mine = &all[me];
    let (codes, scales) = quantize_rows(&mine.tokens, h);
    moe.dispatch_fp8(Fp8Tokens::Bf16(&mine.tokens), &mine.ids, &mine.weights, Fp8Out::Bf16, s)?;
    let whole = moe.fp8_received().expect("an FP8 exchange");
    let snapshot = || -> shmem::Result<_> {
        Ok((
            code_bits(&whole.rows.copy_to_host(s)?),
            float_bits(&whole.scales.copy_to_host(s)?),
            bf16_bits(&whole.bf16.expect("the receive buffer").copy_to_host(s)?),
            moe.device_layout().copy_to_host(s)?,
        ))
    };
    let before = snapshot()?;
    let bad = n - 1;
    let nt = mine.ids.len() / c.top_k;
    let check = |r: shmem::Result<()>, how: &str| match r {
        Err(Error::LengthMismatch(m)) if me == bad => assert!(m.contains("scales"), "{how}: PE {me}: {m}"),
        Err(Error::CollectiveMismatch(m)) if me != bad => {
            assert!(m.contains(&format!("PE {bad}")), "{how}: PE {me}: {m}")
        }
        Err(e) => panic!("{how}: unexpected error on PE {me}: {e}"),
        Ok(()) => panic!("{how}: a dispatch without scales succeeded on PE {me}"),
    };
    // None, and one short; one too many where the bad PE has no tokens
    // (which want none). As many cases on every PE.
    let wrong = if all[bad].ids.is_empty() {
        vec![vec![1.0]]
    } else {
        vec![vec![], vec![1.0; all[bad].tokens.len() / h * g - 1]]
    };
    for given in wrong {
        let given = if me == bad { given } else { scales.clone() };
        let tokens = Fp8Tokens::Quantized { codes: &codes, scales: &given };
        for out in [Fp8Out::E4m3, Fp8Out::Bf16] {
            let how = format!("host, {} scales on PE {bad}, {out:?}", given.len());
            let r = moe.dispatch_fp8(tokens, &mine.ids, &mine.weights, out, s).map(|_| ());
            check(r, &how);
            assert_eq!(snapshot()?, before, "{how}: PE {me}'s views after the refusal");
        }
    }
    // On the device: a scales buffer shorter than max_tokens × scales_per_token.
    let d_codes = env.ctx.alloc::<fp8_e4m3>(c.max_tokens * h)?;
    let d_scales = env.ctx.alloc::<f32>(c.max_tokens * g)?;
    let ids = env.ctx.alloc::<i64>(c.max_tokens * c.top_k)?;
    let weights = env.ctx.alloc::<f32>(c.max_tokens * c.top_k)?;
    let count = env.ctx.alloc::<i64>(1)?;
    d_codes.slice(..codes.len()).copy_from_host(&codes, s)?;
    d_scales.slice(..scales.len()).copy_from_host(&scales, s)?;
    ids.slice(..mine.ids.len()).copy_from_host(&mine.ids, s)?;
    weights.slice(..mine.weights.len()).copy_from_host(&mine.weights, s)?;
    count.copy_from_host(&[nt as i64], s)?;
    let given = if me == bad { d_scales.slice(0..c.max_tokens * g - 1) } else { (&d_scales).into() };
    let tokens = Fp8DeviceTokens::Quantized { codes: (&d_codes).into(), scales: given };
    let r = moe.dispatch_fp8_on_device(tokens, &ids, &weights, &count, Fp8Out::Bf16, s).map(|_| ());
    // The other PEs' calls fail on the gpu backend once they have run.
    let r = if me == bad { r } else { Err(deferred_mismatch(env, r)) };
    check(r, "device");
    assert_eq!(snapshot()?, before, "device: PE {me}'s views after the refusal");
    // The exchange still works.
    let tokens = Fp8Tokens::Quantized { codes: &codes, scales: &scales };
    let (view, layout) = moe.dispatch_fp8(tokens, &mine.ids, &mine.weights, Fp8Out::Bf16, s)?;
    check_view(env, &c, &all, &view, &layout, "after the refusals")?;
    env.ctx.check_device()?;
    Ok(())
}

/// FP8 calls on an exchange built without the FP8 format, and the FP8
/// format for another element type, are refused.
fn not_fp8(env: &Env) -> TestResult {
    let s = &env.s;
    let c = MoeConfig::new(128, 2, 1, 1);
    let moe = MoeAllToAll::<bf16>::new(&env.ctx, c)?;
    let r = moe.dispatch_fp8(Fp8Tokens::Bf16(&[]), &[], &[], Fp8Out::E4m3, s);
    assert_err!(r, Error::Invalid(_));
    assert!(moe.fp8_received().is_none());
    assert_err!(MoeAllToAll::<f32>::new(&env.ctx, c.fp8()), Error::Invalid(_) | Error::CollectiveMismatch(_));
    Ok(())
}
