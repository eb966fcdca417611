//! MoE all-to-all-v against a reference that every PE computes from every
//! PE's inputs (drawn from the shared seed): the three operations on
//! zero, single-target, skewed, random and maximal splits, `major_align`
//! 1, 8, 16 and 128; the `MoeAllToAll` layer's grouping, its exact round
//! trip and its weighted combine; and every refusal, on every PE, with
//! the poisoned outputs left as they were.

pub mod arrivals;
pub mod fp8;
pub mod layer;

use layer::*;

use crate::util::{
    assert_bits_eq, deferred_mismatch, gpu_form, mix, needs_gpu, payload, poison, Env, TestElem, TestResult,
};
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
    gpu_form(env, "the MoE forms that send no rows in lines")?;
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
    gpu_form(env, "the MoE kernels' tuned grids")?;
    with_settings(env, |c| Collectives { tuning: crate::kernels::TUNED, ..c }, test)
}

/// `test` with [`MoeKernels::Auto`] taking the line kernel for every input
/// that fits, 256 bytes of input a block.
fn tuned_lines(env: &Env, test: TestFn) -> TestResult {
    gpu_form(env, "the MoE line kernel under the automatic choice")?;
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
    gpu_form(env, &format!("the MoE kernels' form {form:?}"))?;
    with_settings(env, |c| Collectives { moe: form, ..c }, test)
}

/// Rows of each PE's input in the operation tests.
const IN_ROWS: usize = 40;
/// The value out_splits_offsets is poisoned with.
const POISON_SO: i64 = -7;

/// A random stream from a seed.
pub(crate) struct Rng(u64);

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
