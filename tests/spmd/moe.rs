//! MoE all-to-all-v against a reference that every PE computes from every
//! PE's inputs (drawn from the shared seed): the three operations on
//! zero, single-target, skewed, random and maximal splits, `major_align`
//! 1, 8, 16 and 128; the `MoeAllToAll` layer's grouping, its exact round
//! trip and its weighted combine; and every refusal, on every PE, with
//! the poisoned outputs left as they were.

pub mod arrivals;
pub mod fp8;

use crate::util::{assert_bits_eq, deferred_mismatch, mix, needs_gpu, payload, poison, Env, TestElem, TestResult};
use crate::{assert_err, TestFn};
use shmem::{
    bf16, f16, BackendKind, Collectives, CombineElement, Error, MoeAllToAll, MoeConfig, MoeKernels, RoutingFault,
    SymmetricBuffer,
};

pub const TESTS: &[(&str, TestFn)] = &[
    ("moe::all_to_all_v", all_to_all_v),
    ("moe::all_to_all_v_2d", all_to_all_v_2d),
    ("moe::all_to_all_v_2d_offset", all_to_all_v_2d_offset),
    ("moe::dispatch_then_combine_ops", dispatch_then_combine_ops),
    ("moe::layer_grouping_and_round_trip", layer_round_trip),
    ("moe::layer_weighted_combine", layer_weighted_combine),
    ("moe::layer_on_device", layer_on_device),
    ("moe::layer_memory", layer_memory),
    ("moe::layer_net_bytes", layer_net_bytes),
    ("moe::errors::negative_split", err_negative_split),
    ("moe::errors::splits_exceed_input", err_splits_exceed_input),
    ("moe::errors::output_overflow", err_output_overflow),
    ("moe::errors::output_overflow_by_padding", err_output_overflow_by_padding),
    ("moe::errors::negative_offset", err_negative_offset),
    ("moe::errors::offsets_out_of_order", err_offsets_out_of_order),
    ("moe::errors::chunk_past_input", err_chunk_past_input),
    ("moe::errors::sizes", err_sizes),
    ("moe::errors::bad_on_one_pe", err_bad_on_one_pe),
    ("moe::errors::layer", err_layer),
    ("moe::errors::layer_on_device", err_layer_on_device),
    ("moe::device_error_fails_next_call", device_error_fails_next_call),
    ("moe::graph_replay_gpu_only", graph_replay),
    // The two-kernel form where the one-kernel form would run (the GPU
    // backend; SHMEM_FORCE_RMA=1 runs it everywhere).
    ("moe::plan_then_move::all_to_all_v", |e| with_form(e, MoeKernels::PlanThenMove, all_to_all_v)),
    ("moe::plan_then_move::all_to_all_v_2d", |e| with_form(e, MoeKernels::PlanThenMove, all_to_all_v_2d)),
    ("moe::plan_then_move::all_to_all_v_2d_offset", |e| with_form(e, MoeKernels::PlanThenMove, all_to_all_v_2d_offset)),
    ("moe::plan_then_move::errors::bad_on_one_pe", |e| with_form(e, MoeKernels::PlanThenMove, err_bad_on_one_pe)),
    ("moe::plan_then_move::graph_replay_gpu_only", |e| with_form(e, MoeKernels::PlanThenMove, graph_replay)),
    // The layer's exchange form where its decode form would run.
    ("moe::plan_then_move::layer_on_device", |e| with_form(e, MoeKernels::PlanThenMove, layer_on_device)),
    ("moe::plan_then_move::errors::layer_on_device", |e| with_form(e, MoeKernels::PlanThenMove, err_layer_on_device)),
    // The line kernel where it fits (the GPU backend's world team over
    // NVLink; elsewhere the default forms).
    ("moe::lines::all_to_all_v", |e| with_form(e, MoeKernels::Lines, all_to_all_v)),
    ("moe::lines::all_to_all_v_2d", |e| with_form(e, MoeKernels::Lines, all_to_all_v_2d)),
    ("moe::lines::all_to_all_v_2d_offset", |e| with_form(e, MoeKernels::Lines, all_to_all_v_2d_offset)),
    ("moe::lines::dispatch_then_combine_ops", |e| with_form(e, MoeKernels::Lines, dispatch_then_combine_ops)),
    ("moe::lines::layer_on_device", |e| with_form(e, MoeKernels::Lines, layer_on_device)),
    ("moe::lines::errors::negative_split", |e| with_form(e, MoeKernels::Lines, err_negative_split)),
    ("moe::lines::errors::splits_exceed_input", |e| with_form(e, MoeKernels::Lines, err_splits_exceed_input)),
    ("moe::lines::errors::output_overflow", |e| with_form(e, MoeKernels::Lines, err_output_overflow)),
    ("moe::lines::errors::output_overflow_by_padding", |e| {
        with_form(e, MoeKernels::Lines, err_output_overflow_by_padding)
    }),
    ("moe::lines::errors::negative_offset", |e| with_form(e, MoeKernels::Lines, err_negative_offset)),
    ("moe::lines::errors::offsets_out_of_order", |e| with_form(e, MoeKernels::Lines, err_offsets_out_of_order)),
    ("moe::lines::errors::chunk_past_input", |e| with_form(e, MoeKernels::Lines, err_chunk_past_input)),
    ("moe::lines::errors::bad_on_one_pe", |e| with_form(e, MoeKernels::Lines, err_bad_on_one_pe)),
    ("moe::lines::device_error_fails_next_call", |e| with_form(e, MoeKernels::Lines, device_error_fails_next_call)),
    ("moe::lines::graph_replay_gpu_only", |e| with_form(e, MoeKernels::Lines, graph_replay)),
    ("moe::lines::between_low_latency_collectives", |e| with_form(e, MoeKernels::Lines, between_collectives)),
    // Many working blocks on the tests' few rows (the GPU backend).
    ("moe::tuned::all_to_all_v_2d", |e| tuned(e, all_to_all_v_2d)),
    ("moe::tuned::all_to_all_v_2d_offset", |e| tuned(e, all_to_all_v_2d_offset)),
    // The automatic choice taking the line kernel, on many blocks.
    ("moe::tuned::lines::all_to_all_v_2d", |e| tuned_lines(e, all_to_all_v_2d)),
    ("moe::tuned::lines::all_to_all_v_2d_offset", |e| tuned_lines(e, all_to_all_v_2d_offset)),
    // The decode form's dispatch and combine by counted stores where they
    // would send their rows in lines (the GPU backend's world).
    ("moe::counted::layer_on_device", |e| counted(e, layer_on_device)),
    ("moe::counted::errors::layer_on_device", |e| counted(e, err_layer_on_device)),
    ("moe::layer_between_collectives", layer_between_collectives),
];

/// `test` with no MoE input sent in lines: the 2D ops' automatic choice
/// and the decode form's dispatch and combine take their other forms.
fn counted(env: &Env, test: TestFn) -> TestResult {
    with_settings(
        env,
        |c| {
            let tuning = shmem::Tuning { moe_lines_max_bytes: Some(0), moe_layer_lines_max_bytes: Some(0), ..c.tuning };
            Collectives { tuning, ..c }
        },
        test,
    )
}

/// The layer's dispatch and combine between all-reduces, over and over,
/// with every result checked: on the GPU backend's world the decode
/// form's dispatch and combine in lines and the low-latency collectives (in
/// 8-byte packets, then in lines) take turns in one buffer and one run of
/// epochs.
fn layer_between_collectives(env: &Env) -> TestResult {
    let len = 1000;
    let src = env.ctx.alloc::<u64>(len)?;
    let dst = env.ctx.alloc::<u64>(len)?;
    let before = env.ctx.collectives();
    let r = (|| -> TestResult {
        for round in 0..4 {
            let (_, sum, lines) = all_reduce_round(env, before, round, &src, &dst)?;
            on_device::<bf16>(env, MoeConfig::new(64, 6, 2, 3).major_align(4), Spread::Random)?;
            assert_eq!(dst.copy_to_host(&env.s)?, sum, "all_reduce of round {round} (lines: {lines:?})");
            on_device::<f32>(env, MoeConfig::new(40, 3, 1, 2), Spread::Random)?;
        }
        Ok(())
    })();
    env.ctx.set_collectives(before);
    r
}

/// Element `i` of PE `pe`'s `len` values in the round of `seed`.
fn round_value(seed: u64, pe: usize, len: usize, i: usize) -> u64 {
    mix(seed ^ (pe * len + i) as u64) >> 20
}

/// Round `round` of the tests between collectives: the low-latency
/// collectives in 8-byte packets (even rounds) or in lines (odd), the
/// other settings `before`'s; this PE's fresh values into `src` and their
/// all-reduce into the first `src.len()` elements of `dst`, left for the
/// caller to check after what it runs in between. The round's seed, the
/// sums, and the lines' threshold set.
fn all_reduce_round(
    env: &Env,
    before: Collectives,
    round: usize,
    src: &SymmetricBuffer<u64>,
    dst: &SymmetricBuffer<u64>,
) -> Result<(u64, Vec<u64>, Option<usize>), Error> {
    let (n, me, len) = (env.n(), env.me(), src.len());
    let lines = (round % 2 == 1).then_some(0);
    let tuning = shmem::Tuning { low_latency_lines_min_bytes: lines, ..before.tuning };
    env.ctx.set_collectives(Collectives { tuning, ..before });
    let seed = env.fresh_seed();
    src.copy_from_host(&(0..len).map(|i| round_value(seed, me, len, i)).collect::<Vec<_>>(), &env.s)?;
    env.ctx.all_reduce(dst.slice(..len), src, shmem::ReduceOp::Sum, &env.s)?;
    let sum = (0..len).map(|i| (0..n).map(|pe| round_value(seed, pe, len, i)).sum()).collect();
    Ok((seed, sum, lines))
}

/// `test` with the collective settings `change` makes of the current
/// ones, which are put back after it.
fn with_settings(env: &Env, change: impl FnOnce(Collectives) -> Collectives, test: TestFn) -> TestResult {
    let before = env.ctx.collectives();
    env.ctx.set_collectives(change(before));
    let r = test(env);
    env.ctx.set_collectives(before);
    r
}

/// `test` with the kernels retuned (`crate::kernels::TUNED`: 256 bytes of
/// rows per working MoE block).
fn tuned(env: &Env, test: TestFn) -> TestResult {
    with_settings(env, |c| Collectives { tuning: crate::kernels::TUNED, ..c }, test)
}

/// `test` with [`MoeKernels::Auto`] taking the line kernel for every input
/// that fits, 256 bytes of input a block.
fn tuned_lines(env: &Env, test: TestFn) -> TestResult {
    let tuning = shmem::Tuning { moe_lines_max_bytes: Some(usize::MAX), ..crate::kernels::TUNED };
    with_settings(env, |c| Collectives { moe: MoeKernels::Auto, tuning, ..c }, test)
}

/// MoE operations between all-reduces and all-gathers, over and over, with
/// every result checked: on the GPU backend's world the line kernel (under
/// [`MoeKernels::Lines`]) and the low-latency collectives (in 8-byte
/// packets, then in lines) take turns in one buffer and one run of epochs.
fn between_collectives(env: &Env) -> TestResult {
    let n = env.n();
    let len = 1000;
    let src = env.ctx.alloc::<u64>(len)?;
    let dst = env.ctx.alloc::<u64>(n * len)?;
    // (The caller puts the settings back.)
    let before = env.ctx.collectives();
    for round in 0..6 {
        let (seed, sum, lines) = all_reduce_round(env, before, round, &src, &dst)?;
        one_2d::<bf16>(env, Case::Random, 3, 8, 64)?;
        let got = dst.slice(..len).copy_to_host(&env.s)?;
        assert_eq!(got, sum, "all_reduce of round {round} (lines: {lines:?})");
        env.ctx.all_gather(&dst, &src, &env.s)?;
        one_2d_offset::<f32>(env, Case::Skewed, 2, 7)?;
        let all: Vec<u64> = (0..n).flat_map(|pe| (0..len).map(move |i| round_value(seed, pe, len, i))).collect();
        assert_eq!(dst.copy_to_host(&env.s)?, all, "all_gather of round {round} (lines: {lines:?})");
        one_1d::<u64>(env, Case::Maximal, 5)?;
    }
    Ok(())
}

/// `test` with the MoE ops in `form`.
fn with_form(env: &Env, form: MoeKernels, test: TestFn) -> TestResult {
    with_settings(env, |c| Collectives { moe: form, ..c }, test)
}

/// Rows of each PE's input in the operation tests.
const IN_ROWS: usize = 40;
/// The value out_splits_offsets is poisoned with.
const POISON_SO: i64 = -7;

/// A random stream from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// How the splits are drawn.
#[derive(Clone, Copy, Debug)]
enum Case {
    Zeros,
    /// Every PE sends its whole input to one entry (one PE, one expert).
    OneTarget,
    /// Entry `i` gets about half of what entry `i - 1` gets.
    Skewed,
    Random,
    /// Every PE sends its whole input, spread at random.
    Maximal,
}

const CASES: [Case; 5] = [Case::Zeros, Case::OneTarget, Case::Skewed, Case::Random, Case::Maximal];

/// PE `pe`'s `m` splits, summing to at most `cap`.
fn draw_splits(case: Case, seed: u64, pe: usize, m: usize, cap: usize) -> Vec<i64> {
    let mut rng = Rng(seed ^ mix(pe as u64 + 1));
    let mut s = vec![0usize; m];
    match case {
        Case::Zeros => {}
        Case::OneTarget => s[(seed % m as u64) as usize] = cap,
        Case::Skewed => {
            let mut left = cap;
            for x in s.iter_mut() {
                *x = rng.below(left / 2 + 1) + left / 4;
                left -= *x;
            }
        }
        Case::Random => s.iter_mut().for_each(|x| *x = rng.below(cap / m + 1)),
        Case::Maximal => (0..cap).for_each(|_| s[rng.below(m)] += 1),
    }
    s.into_iter().map(|x| x as i64).collect()
}

/// PE `pe`'s input row `r` (`row_len` elements).
fn input_row<T: TestElem>(seed: u64, pe: usize, r: usize, row_len: usize) -> impl Iterator<Item = T> {
    (0..row_len).map(move |c| payload(seed, pe, r * row_len + c))
}

/// A buffer of `len` elements holding `data`.
fn buffer<T: TestElem>(env: &Env, data: &[T]) -> shmem::Result<SymmetricBuffer<T>> {
    let b = env.ctx.alloc::<T>(data.len())?;
    b.copy_from_host(data, &env.s)?;
    Ok(b)
}

/// What one operation should leave on this PE: the output (poison where
/// nothing lands) and out_splits_offsets.
struct Expected<T> {
    output: Vec<T>,
    splits: Vec<i64>,
    offsets: Vec<i64>,
}

impl<T: TestElem> Expected<T> {
    fn new(out_rows: usize, row_len: usize) -> Self {
        Expected { output: vec![poison(); out_rows * row_len], splits: Vec::new(), offsets: Vec::new() }
    }

    /// Chunk of `rows` rows from `src`'s row `from`, placed at output row `to`.
    fn place(&mut self, seed: u64, src: usize, from: usize, to: usize, rows: usize, row_len: usize) {
        for r in 0..rows {
            let at = (to + r) * row_len;
            for (o, v) in self.output[at..at + row_len].iter_mut().zip(input_row(seed, src, from + r, row_len)) {
                *o = v;
            }
        }
        self.splits.push(rows as i64);
        self.offsets.push(to as i64);
    }

    fn check(&self, env: &Env, output: &SymmetricBuffer<T>, so: &SymmetricBuffer<i64>, what: &str) -> TestResult {
        assert_bits_eq(&output.copy_to_host(&env.s)?, &self.output, &format!("{what}: output"));
        let so = so.copy_to_host(&env.s)?;
        let m = self.splits.len();
        assert_eq!(so[..m], self.splits[..], "{what}: out splits");
        assert_eq!(so[m..], self.offsets[..], "{what}: out offsets");
        Ok(())
    }
}

/// Row `i`'s start in a packed list of `splits`.
fn start_of(splits: &[i64], i: usize) -> usize {
    splits[..i].iter().sum::<i64>() as usize
}

fn all_to_all_v(env: &Env) -> TestResult {
    for case in CASES {
        // Every element size (the operation copies rows, whatever they hold).
        one_1d::<f32>(env, case, 3)?;
        one_1d::<f64>(env, case, 3)?;
        one_1d::<f16>(env, case, 3)?;
        one_1d::<bf16>(env, case, 3)?;
        one_1d::<i32>(env, case, 3)?;
        one_1d::<u64>(env, case, 3)?;
    }
    one_1d::<f32>(env, Case::Random, 64)?;
    one_1d::<bf16>(env, Case::Skewed, 7168)
}

fn one_1d<T: TestElem>(env: &Env, case: Case, row_len: usize) -> TestResult {
    let (n, me, seed) = (env.n(), env.me(), env.fresh_seed());
    let splits: Vec<Vec<i64>> = (0..n).map(|pe| draw_splits(case, seed, pe, n, IN_ROWS)).collect();
    let out_rows = n * IN_ROWS + 5; // the worst case, and rows that must keep their poison
    let input: Vec<T> = (0..IN_ROWS).flat_map(|r| input_row(seed, me, r, row_len)).collect();
    let (input, in_splits) = (buffer(env, &input)?, buffer(env, &splits[me])?);
    let output = buffer(env, &vec![poison::<T>(); out_rows * row_len])?;
    let so = buffer(env, &vec![POISON_SO; 2 * n])?;
    env.ctx.all_to_all_v(&input, &output, &in_splits, &so, row_len, &env.s)?;

    let mut want = Expected::new(out_rows, row_len);
    let mut at = 0;
    for (s, sp) in splits.iter().enumerate() {
        want.place(seed, s, start_of(sp, me), at, sp[me] as usize, row_len);
        at += sp[me] as usize;
    }
    want.check(env, &output, &so, &format!("all_to_all_v {case:?} {}", T::DTYPE))?;
    assert_eq!(in_splits.copy_to_host(&env.s)?, splits[me], "in_splits must not change");
    Ok(())
}

fn all_to_all_v_2d(env: &Env) -> TestResult {
    // (3: an alignment that is not a power of 2, which the kernels divide by.)
    for align in [1, 3, 8, 16, 128] {
        for case in CASES {
            for ne in [1, 3] {
                one_2d::<f32>(env, case, ne, align, 5)?;
            }
        }
    }
    one_2d::<bf16>(env, Case::Random, 4, 16, 8)?;
    one_2d::<u64>(env, Case::Maximal, 2, 8, 1)?;
    // DeepSeek-sized rows: many data blocks, some of them idle.
    one_2d::<bf16>(env, Case::Random, 4, 1, 7168)?;
    one_2d::<bf16>(env, Case::Skewed, 2, 16, 7168)
}

/// Where the dispatch puts PE `me`'s received chunks, by `all_to_all_v_2d`'s
/// rule: per local expert, every source in order, each block padded to
/// `max(round_up(rows, align), align)`. Returns (source, source row,
/// output row, rows) per chunk, expert-major.
fn dispatch_layout(splits: &[Vec<i64>], me: usize, ne: usize, align: usize) -> Vec<[usize; 4]> {
    let mut chunks = Vec::new();
    let mut at = 0;
    for e in 0..ne {
        let block = at;
        for (s, sp) in splits.iter().enumerate() {
            let i = me * ne + e;
            chunks.push([s, start_of(sp, i), at, sp[i] as usize]);
            at += sp[i] as usize;
        }
        at = block + (at - block).div_ceil(align).max(1) * align;
    }
    chunks
}

fn one_2d<T: TestElem>(env: &Env, case: Case, ne: usize, align: usize, row_len: usize) -> TestResult {
    let (n, me, seed) = (env.n(), env.me(), env.fresh_seed());
    let m = n * ne;
    let splits: Vec<Vec<i64>> = (0..n).map(|pe| draw_splits(case, seed, pe, m, IN_ROWS)).collect();
    let out_rows = n * IN_ROWS + ne * align + 3;
    let input: Vec<T> = (0..IN_ROWS).flat_map(|r| input_row(seed, me, r, row_len)).collect();
    let (input, in_splits) = (buffer(env, &input)?, buffer(env, &splits[me])?);
    let output = buffer(env, &vec![poison::<T>(); out_rows * row_len])?;
    let so = buffer(env, &vec![POISON_SO; 2 * m])?;
    env.ctx.all_to_all_v_2d(&input, &output, &in_splits, &so, row_len, align, &env.s)?;

    let mut want = Expected::new(out_rows, row_len);
    for [s, from, to, rows] in dispatch_layout(&splits, me, ne, align) {
        want.place(seed, s, from, to, rows, row_len);
    }
    want.check(env, &output, &so, &format!("all_to_all_v_2d {case:?} ne {ne} align {align} {}", T::DTYPE))
}

fn all_to_all_v_2d_offset(env: &Env) -> TestResult {
    for case in CASES {
        for ne in [1, 3] {
            one_2d_offset::<f32>(env, case, ne, 7)?;
        }
    }
    one_2d_offset::<f16>(env, Case::Random, 2, 16)?;
    one_2d_offset::<bf16>(env, Case::Maximal, 2, 7168)
}

fn one_2d_offset<T: TestElem>(env: &Env, case: Case, ne: usize, row_len: usize) -> TestResult {
    let (n, me, seed) = (env.n(), env.me(), env.fresh_seed());
    let m = n * ne;
    // Expert-major chunks with up to 2 rows of padding before each.
    let in_rows = IN_ROWS + 2 * m;
    let splits: Vec<Vec<i64>> = (0..n).map(|pe| draw_splits(case, seed, pe, m, IN_ROWS)).collect();
    let offsets: Vec<Vec<i64>> = (0..n)
        .map(|pe| {
            let mut rng = Rng(seed ^ mix(pe as u64 + 77));
            let mut at = 0;
            splits[pe]
                .iter()
                .map(|&s| {
                    at += rng.below(3);
                    let o = at;
                    at += s as usize;
                    o as i64
                })
                .collect()
        })
        .collect();
    let out_rows = n * IN_ROWS + 2;
    let input: Vec<T> = (0..in_rows).flat_map(|r| input_row(seed, me, r, row_len)).collect();
    let (input, in_so) = (buffer(env, &input)?, buffer(env, &[&splits[me][..], &offsets[me][..]].concat())?);
    let output = buffer(env, &vec![poison::<T>(); out_rows * row_len])?;
    let so = buffer(env, &vec![POISON_SO; 2 * m])?;
    env.ctx.all_to_all_v_2d_offset(&input, &output, &in_so, &so, row_len, &env.s)?;

    let mut want = Expected::new(out_rows, row_len);
    let mut at = 0;
    for s in 0..n {
        for e in 0..ne {
            let i = e * n + me;
            let rows = splits[s][i] as usize;
            want.place(seed, s, offsets[s][i] as usize, at, rows, row_len);
            at += rows;
        }
    }
    want.check(env, &output, &so, &format!("all_to_all_v_2d_offset {case:?} ne {ne} {}", T::DTYPE))
}

/// `all_to_all_v_2d`, then `all_to_all_v_2d_offset` on its output with its
/// out_splits_offsets, returns every PE's input rows exactly.
fn dispatch_then_combine_ops(env: &Env) -> TestResult {
    let (n, me, seed, row_len, ne, align) = (env.n(), env.me(), env.fresh_seed(), 6, 3, 16);
    let m = n * ne;
    let splits = draw_splits(Case::Random, seed, me, m, IN_ROWS);
    let sent = splits.iter().sum::<i64>() as usize;
    let input: Vec<u32> = (0..IN_ROWS).flat_map(|r| input_row(seed, me, r, row_len)).collect();
    let (input, in_splits) = (buffer(env, &input)?, buffer(env, &splits)?);
    let mid = env.ctx.alloc::<u32>((n * IN_ROWS + ne * align) * row_len)?;
    let back = buffer(env, &vec![poison::<u32>(); IN_ROWS * row_len])?;
    let (so_mid, so_back) = (env.ctx.alloc::<i64>(2 * m)?, env.ctx.alloc::<i64>(2 * m)?);
    env.ctx.all_to_all_v_2d(&input, &mid, &in_splits, &so_mid, row_len, align, &env.s)?;
    env.ctx.all_to_all_v_2d_offset(&mid, &back, &so_mid, &so_back, row_len, &env.s)?;
    let mut want: Vec<u32> = input.copy_to_host(&env.s)?;
    want[sent * row_len..].fill(poison());
    assert_bits_eq(&back.copy_to_host(&env.s)?, &want, "round trip");
    let so = so_back.copy_to_host(&env.s)?;
    assert_eq!(so[..m], splits[..], "round trip: splits back");
    assert_eq!(so[m..], (0..m).map(|i| start_of(&splits, i) as i64).collect::<Vec<_>>()[..], "round trip: offsets");
    Ok(())
}

// ---- refusals ----

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    V,
    V2d { ne: usize, align: usize },
    V2dOffset { ne: usize },
}

/// Runs `op` with this PE's `splits` (and offsets, for the offset variant)
/// on poisoned outputs of `out_rows` rows: every PE must fail with an error
/// whose message contains `needle`, and leave outputs and splits alone.
fn refused(env: &Env, op: Op, out_rows: usize, splits: &[i64], needle: &str) -> TestResult {
    let (n, seed, row_len) = (env.n(), env.fresh_seed(), 4);
    let m = match op {
        Op::V => n,
        Op::V2d { ne, .. } | Op::V2dOffset { ne } => n * ne,
    };
    let input: Vec<f32> = (0..IN_ROWS).flat_map(|r| input_row(seed, env.me(), r, row_len)).collect();
    let (input, in_splits) = (buffer(env, &input)?, buffer(env, splits)?);
    let output = buffer(env, &vec![poison::<f32>(); out_rows * row_len])?;
    let so = buffer(env, &vec![POISON_SO; 2 * m])?;
    let (ctx, s) = (&env.ctx, &env.s);
    let r = match op {
        Op::V => ctx.all_to_all_v(&input, &output, &in_splits, &so, row_len, s),
        Op::V2d { align, .. } => ctx.all_to_all_v_2d(&input, &output, &in_splits, &so, row_len, align, s),
        Op::V2dOffset { .. } => ctx.all_to_all_v_2d_offset(&input, &output, &in_splits, &so, row_len, s),
    };
    // The GPU backend checks the splits on the device: the call is
    // enqueued, and the failure reported once it has run.
    let r = match r {
        Ok(()) if env.ctx.backend() == BackendKind::Gpu => s.synchronize().and_then(|()| ctx.check_device()),
        r => r,
    };
    let e = assert_err!(r, Error::Invalid(_) | Error::LengthMismatch(_));
    assert!(e.to_string().contains(needle), "{op:?}: the error should say {needle:?}: {e}");
    assert_bits_eq(&output.copy_to_host(s)?, &vec![poison::<f32>(); out_rows * row_len], "poisoned output");
    assert_eq!(so.copy_to_host(s)?, vec![POISON_SO; 2 * m], "poisoned out_splits_offsets");
    assert_eq!(in_splits.copy_to_host(s)?, splits, "in_splits");
    still_usable(env)
}

/// After a refusal: a correct all_to_all_v works.
fn still_usable(env: &Env) -> TestResult {
    one_1d::<u32>(env, Case::Random, 2)
}

fn err_negative_split(env: &Env) -> TestResult {
    let n = env.n();
    let mut splits = vec![1i64; n];
    if env.me() == n - 1 {
        splits[n / 2] = -1;
    }
    refused(env, Op::V, n * IN_ROWS, &splits, "negative")?;
    let mut splits = vec![0i64; 2 * n];
    if env.me() == 0 {
        splits[1] = -3;
    }
    refused(env, Op::V2d { ne: 2, align: 8 }, n * IN_ROWS + 16, &splits, "negative")
}

fn err_splits_exceed_input(env: &Env) -> TestResult {
    let n = env.n();
    let mut splits = vec![0i64; n];
    splits[0] = if env.me() == 0 { IN_ROWS as i64 + 1 } else { 1 };
    refused(env, Op::V, (n + 1) * IN_ROWS, &splits, "runs past its input")?;
    // Splits so large that their sum overflows.
    let mut splits = vec![i64::MAX / 2 + 1; 3 * n];
    splits[0] = 0;
    refused(env, Op::V2d { ne: 3, align: 1 }, n * IN_ROWS + 3, &splits, "runs past its input")
}

fn err_output_overflow(env: &Env) -> TestResult {
    let n = env.n();
    // Everyone sends everything to PE 0, whose output is one row short.
    let mut splits = vec![0i64; n];
    splits[0] = IN_ROWS as i64;
    refused(env, Op::V, n * IN_ROWS - 1, &splits, "PE 0 would receive")
}

fn err_output_overflow_by_padding(env: &Env) -> TestResult {
    let n = env.n();
    // PE 0's two experts get n rows and none: 8 + 8 padded rows, 15 fit.
    let mut splits = vec![0i64; 2 * n];
    splits[0] = 1;
    refused(env, Op::V2d { ne: 2, align: 8 }, 15, &splits, "with major_align padding")
}

/// Splits and offsets of a valid packed offset-variant call with `ne` experts.
fn packed(n: usize, ne: usize) -> Vec<i64> {
    let m = n * ne;
    [vec![1i64; m], (0..m as i64).collect()].concat()
}

fn err_negative_offset(env: &Env) -> TestResult {
    let n = env.n();
    let mut so = packed(n, 2);
    if env.me() == 0 {
        so[2 * n] = -1;
    }
    refused(env, Op::V2dOffset { ne: 2 }, n * IN_ROWS, &so, "negative")
}

fn err_offsets_out_of_order(env: &Env) -> TestResult {
    let n = env.n();
    let m = 2 * n;
    let mut so = packed(n, 2);
    if env.me() == n - 1 {
        so[0] = 2; // chunk 0 covers rows 1 and 2, chunk 1 starts at row 1
        so[m] = 1;
    }
    refused(env, Op::V2dOffset { ne: 2 }, n * IN_ROWS, &so, "ascending")
}

fn err_chunk_past_input(env: &Env) -> TestResult {
    let n = env.n();
    let m = 2 * n;
    let mut so = packed(n, 2);
    if env.me() == 0 {
        so[2 * m - 1] = IN_ROWS as i64; // the last chunk starts at the end
    }
    refused(env, Op::V2dOffset { ne: 2 }, n * IN_ROWS, &so, "runs past its input")
}

/// Local size errors, the same on every PE: each PE refuses its own call.
fn err_sizes(env: &Env) -> TestResult {
    let (n, s) = (env.n(), &env.s);
    let input = buffer(env, &[1.0f32; 8 * 4])?;
    let output = buffer(env, &vec![poison::<f32>(); n * 8 * 4 + 4])?;
    let splits = buffer(env, &vec![0i64; n + 1])?;
    let so = buffer(env, &vec![POISON_SO; 2 * n + 2])?;
    let ctx = &env.ctx;
    let bad: Vec<(shmem::Result<()>, &str)> = vec![
        (ctx.all_to_all_v(&input, &output, &splits, so.slice(..2 * n), 4, s), "in_splits has"),
        (ctx.all_to_all_v(&input, &output, splits.slice(..n), &so, 4, s), "out_splits_offsets has"),
        (ctx.all_to_all_v(input.slice(..5), &output, splits.slice(..n), so.slice(..2 * n), 4, s), "whole rows"),
        (ctx.all_to_all_v(&input, &output, splits.slice(..n), so.slice(..2 * n), 0, s), "row_len"),
        (ctx.all_to_all_v_2d(&input, &output, splits.slice(..n), so.slice(..2 * n), 4, 0, s), "major_align"),
        (ctx.all_to_all_v_2d(&input, &output, splits.slice(..0), so.slice(..0), 4, 1, s), "in_splits has"),
        (ctx.all_to_all_v_2d_offset(&input, &output, splits.slice(..n), so.slice(..n), 4, s), "in_splits_offsets"),
        (ctx.all_to_all_v(output.slice(..8 * 4), &output, splits.slice(..n), so.slice(..2 * n), 4, s), "overlap"),
        (ctx.all_to_all_v(&input, &input, splits.slice(..n), so.slice(..2 * n), 4, s), "overlap"),
    ];
    for (i, (r, needle)) in bad.into_iter().enumerate() {
        let e = assert_err!(r, Error::Invalid(_) | Error::LengthMismatch(_));
        assert!(e.to_string().contains(needle), "case {i}: expected {needle:?} in: {e}");
    }
    assert_bits_eq(&output.copy_to_host(s)?, &vec![poison::<f32>(); n * 8 * 4 + 4], "poisoned output");
    assert_eq!(so.copy_to_host(s)?, vec![POISON_SO; 2 * n + 2], "poisoned out_splits_offsets");
    still_usable(env)
}

/// One PE's bad arguments: it says why, the others that it refused (on
/// the gpu backend once the call has run).
fn err_bad_on_one_pe(env: &Env) -> TestResult {
    let (n, me, s) = (env.n(), env.me(), &env.s);
    let input = buffer(env, &[1.0f32; 8 * 4])?;
    let output = buffer(env, &vec![poison::<f32>(); n * 8 * 4])?;
    let splits = buffer(env, &vec![1i64; n])?;
    let so = buffer(env, &vec![POISON_SO; 2 * n])?;
    let row_len = if me == n - 1 { 0 } else { 4 };
    let r = env.ctx.all_to_all_v(&input, &output, &splits, &so, row_len, s);
    if me == n - 1 {
        assert_err!(r, Error::Invalid(_));
    } else {
        // (on the gpu backend from the synchronisation after the call)
        let e = deferred_mismatch(env, r);
        assert!(e.to_string().contains("all_to_all_v") && e.to_string().contains("rejected"), "{e}");
    }
    // Another output slice on PE 0: the PEs disagree on the call.
    let out = if me == 0 { output.slice(4..) } else { output.slice(..n * 8 * 4 - 4) };
    let r = env.ctx.all_to_all_v(&input, out, &splits, &so, 4, s);
    if n > 1 {
        deferred_mismatch(env, r);
        assert_bits_eq(&output.copy_to_host(s)?, &vec![poison::<f32>(); n * 8 * 4], "poisoned output");
        assert_eq!(so.copy_to_host(s)?, vec![POISON_SO; 2 * n], "poisoned out_splits_offsets");
    } else {
        r?;
    }
    still_usable(env)
}

/// GPU only: a bad split enqueues fine and writes nothing; once it has run
/// (waited for through CUDA itself, which shmem does not see), the next
/// MoE call on every PE reports it, having made its own exchange; then all
/// is well.
fn device_error_fails_next_call(env: &Env) -> TestResult {
    // The host backend checks the splits before the call returns.
    let stream = needs_gpu(env)?;
    let (n, me, s, ctx) = (env.n(), env.me(), &env.s, &env.ctx);
    let row_len = 3;
    let input = buffer(env, &vec![1u32; IN_ROWS * row_len])?;
    let output = buffer(env, &vec![poison::<u32>(); n * IN_ROWS * row_len])?;
    let so = buffer(env, &vec![POISON_SO; 2 * n])?;
    let mut splits = vec![1i64; n];
    if me == n - 1 {
        splits[0] = -5;
    }
    let bad = buffer(env, &splits)?;
    ctx.all_to_all_v(&input, &output, &bad, &so, row_len, s)?;
    stream.synchronize()?;
    let good = buffer(env, &vec![1i64; n])?;
    let e = assert_err!(ctx.all_to_all_v(&input, &output, &good, &so, row_len, s), Error::Invalid(_));
    let msg = e.to_string();
    assert!(
        msg.contains("checked on the device") && msg.contains(&format!("PE {}'s split 0 is negative (-5)", n - 1)),
        "{msg}"
    );
    // The call that reported it made its exchange: a row from every PE.
    let mut want = vec![poison::<u32>(); n * IN_ROWS * row_len];
    want[..n * row_len].fill(1);
    assert_bits_eq(&output.copy_to_host(s)?, &want, "the reporting call's output");
    assert_eq!(so.copy_to_host(s)?[..n], vec![1i64; n][..], "the reporting call's out splits");
    ctx.check_device()?;
    still_usable(env)
}

/// GPU only: a dispatch and the combine that sends its output back,
/// captured once into a CUDA graph and replayed 1000 times with new splits
/// and inputs written between replays; every dispatch and round trip exact.
fn graph_replay(env: &Env) -> TestResult {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let stream = needs_gpu(env)?;
    let (n, me, s, ctx) = (env.n(), env.me(), &env.s, &env.ctx);
    let (row_len, ne, align) = (5, 3, 8);
    let m = n * ne;
    let out_rows = n * IN_ROWS + ne * align;
    let input = ctx.alloc::<u32>(IN_ROWS * row_len)?;
    let in_splits = ctx.alloc::<i64>(m)?;
    let mid = ctx.alloc::<u32>(out_rows * row_len)?;
    let back = ctx.alloc::<u32>(IN_ROWS * row_len)?;
    let (so_mid, so_back) = (ctx.alloc::<i64>(2 * m)?, ctx.alloc::<i64>(2 * m)?);
    ctx.barrier_all(s)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = ctx
        .all_to_all_v_2d(&input, &mid, &in_splits, &so_mid, row_len, align, s)
        .and_then(|()| ctx.all_to_all_v_2d_offset(&mid, &back, &so_mid, &so_back, row_len, s));
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("capture gave no graph")?;
    for replay in 0..1000 {
        let (case, seed) = (CASES[replay % CASES.len()], env.fresh_seed());
        let splits: Vec<Vec<i64>> = (0..n).map(|pe| draw_splits(case, seed, pe, m, IN_ROWS)).collect();
        let rows: Vec<u32> = (0..IN_ROWS).flat_map(|r| input_row(seed, me, r, row_len)).collect();
        input.copy_from_host(&rows, s)?;
        in_splits.copy_from_host(&splits[me], s)?;
        mid.fill(poison(), s)?;
        back.fill(poison(), s)?;
        graph.launch()?;
        let what = format!("replay {replay} ({case:?}, seed {seed:#x})");
        let mut want = Expected::new(out_rows, row_len);
        for [src, from, to, r] in dispatch_layout(&splits, me, ne, align) {
            want.place(seed, src, from, to, r, row_len);
        }
        want.check(env, &mid, &so_mid, &format!("{what}: dispatch"))?;
        let sent = splits[me].iter().sum::<i64>() as usize;
        let mut want = rows;
        want[sent * row_len..].fill(poison());
        assert_bits_eq(&back.copy_to_host(s)?, &want, &format!("{what}: round trip"));
        let so = so_back.copy_to_host(s)?;
        assert_eq!(so[..m], splits[me][..], "{what}: splits back");
    }
    ctx.check_device()?;
    Ok(())
}

// ---- the MoeAllToAll layer ----

/// One PE's tokens and routing in the layer tests.
struct Routing<T> {
    tokens: Vec<T>,
    ids: Vec<i64>,
    weights: Vec<f32>,
}

/// Where the layer tests route tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Spread {
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
fn routing<T: Float>(
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
fn routable(c: &MoeConfig, n: usize, spread: Spread) -> bool {
    let reach = if spread == Spread::OnePe { c.experts_per_pe } else { n * c.experts_per_pe };
    c.top_k <= reach && (spread != Spread::Late || c.top_k.min(32) <= c.experts_per_pe)
}

/// What expert `g` does to a row: scales it by `g + 1`.
fn expert<T: Float>(g: usize, x: T) -> T {
    T::from_f32(x.to_f32() * (g + 1) as f32)
}

/// What the dispatch must give PE `me`, from every PE's routing: each
/// local expert's rows, from every source in PE order, each in token order
/// (as (source, token, slot) triples); and what each PE sends to each PE.
fn expected_blocks<T>(all: &[Routing<T>], c: &MoeConfig, me: usize) -> Vec<Vec<(usize, usize, usize)>> {
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
fn expected_sent<T>(r: &Routing<T>, c: &MoeConfig, n: usize) -> Vec<i64> {
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
fn expected_combine<T: Float>(r: &Routing<T>, c: &MoeConfig, n: usize, group: usize) -> Vec<T> {
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
fn dispatch_and_combine<T: Float>(
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
fn exact_weight(k: usize) -> impl Fn(&mut Rng, usize) -> f32 {
    let c = k.next_power_of_two() as f32;
    move |_, j| if j == 0 { 1.0 - (k - 1) as f32 / c } else { 1.0 / c }
}

/// Random weights, some negative.
fn random_weight(rng: &mut Rng, _: usize) -> f32 {
    [0.5f32, 0.25, 1.0, 2.0, -1.5, 0.3, -0.7][rng.below(7)]
}

fn layer_round_trip(env: &Env) -> TestResult {
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
fn coarse<T: Float>(seed: u64, pe: usize, i: usize) -> T {
    let m = (mix(seed ^ mix((pe as u64) << 40 ^ i as u64 ^ 0xc0a5e)) % 31) as f32 - 15.0;
    T::from_f32(m * [0.125f32, 1.0, 8.0][i % 3])
}

/// Dispatch, identity experts, combine with weights summing to 1: the
/// tokens come back exactly; twice on one exchange.
fn round_trip<T: Float>(env: &Env, c: MoeConfig, spread: Spread) -> TestResult {
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
trait Float: TestElem + CombineElement {
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
fn layer_weighted_combine(env: &Env) -> TestResult {
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
fn small<T: Float>(seed: u64, pe: usize, i: usize) -> T {
    T::from_f32(((mix(seed ^ mix((pe as u64) << 40 ^ i as u64)) % 2001) as f32 - 1000.0) / 64.0)
}

fn weighted<T: Float>(env: &Env, c: MoeConfig, spread: Spread) -> TestResult {
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
fn layer_memory(env: &Env) -> TestResult {
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
fn err_layer(env: &Env) -> TestResult {
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
fn err_layer_on_device(env: &Env) -> TestResult {
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
fn layer_on_device(env: &Env) -> TestResult {
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

fn on_device<T: Float>(env: &Env, c: MoeConfig, spread: Spread) -> TestResult {
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
fn wire_stride(hidden: usize, elem: usize, top_k: usize) -> usize {
    ((hidden * elem).next_multiple_of(8) + 8 + 8 * top_k).next_multiple_of(16)
}

/// Distinct (token, node other than `pe`'s) pairs of `r`: the rows the
/// node-aware layer sends across the network for PE `pe`, with `per_node`
/// PEs a node; and of those, the ones bound for `node`.
fn remote_pairs<T>(r: &Routing<T>, c: &MoeConfig, pe: usize, per_node: usize, node: Option<usize>) -> usize {
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
fn layer_net_bytes(env: &Env) -> TestResult {
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

fn net_bytes<T: Float>(env: &Env, c: MoeConfig, spread: Spread) -> TestResult {
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
