//! shmem-bench's overlapped-matmul rows: `ag_matmul`
//! ([`Context::all_gather_matmul`]) and `matmul_rs`
//! ([`Context::matmul_reduce_scatter`]), as `sequential`, `overlap_sm`,
//! `overlap_ce` and `gemm_only`. The bench's doc says what the rows
//! measure.
//!
//! **Checks**, before timing: inputs in {-1, 0, 1}, so that every product
//! and partial sum of the GEMMs is an integer, exact in f32 whatever order
//! cuBLAS sums in (for k < 2²⁴), and each output element is one rounding of
//! an exact value: the results are deterministic bit for bit. The
//! sequential result is checked against the host (ag_matmul's a_out whole;
//! out at a sample of rows — each PE block's first and last, four more —
//! and columns), then every overlapped result bit for bit against it, and
//! gemm_only's at the same kind of sample. Outputs are poisoned (NaN)
//! before each run. A wrong result is reported and its row left out.
//!
//! **Timing** is on reals in (-1, 1) instead: {-1, 0, 1}, a third zeros,
//! would flatter the GEMM. Each row is timed as the bench's others (after
//! a poisoning), and then all it wrote must be finite (written), and the
//! overlapped rows' within ‖got − ref‖ / ‖ref‖ ≤ 2⁻¹⁰ (f16), 2⁻⁷ (bf16) or
//! 2⁻¹⁶ (f32) of the sequential result on the same reals: chunked GEMMs
//! may sum in another order and round a last bit differently.
//!
//! [`Context::all_gather_matmul`]: shmem::Context::all_gather_matmul
//! [`Context::matmul_reduce_scatter`]: shmem::Context::matmul_reduce_scatter

use crate::args::{Args, Dtype};
use crate::bench::Bench;
use crate::data::{mix, seed, Value};
use crate::harness::Case;
use crate::ops::{Imp, Op};
use crate::report::{cell, human, note, Row};
use crate::Res;
use rayon::prelude::*;
use shmem::overlap::reduce_scatter_workspace_len;
use shmem::{bf16, f16, Context, Overlap, OverlapComm, Stream, SymSlice, SymmetricBuffer, Team};

/// The overlapped matmuls (`--op overlap`).
pub(super) const OPS: [Op; 2] = [Op::AgMatmul, Op::MatmulRs];

/// A row's problem (from the command line; in its JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MatmulShape {
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    /// `None` for sequential and gemm_only, which do not chunk.
    pub(super) chunks: Option<usize>,
}

impl MatmulShape {
    /// Floating-point operations of one PE's GEMMs: `m × k` by `k × n`.
    pub(super) fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

impl std::fmt::Display for MatmulShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "m {} n {} k {}", self.m, self.n, self.k)?;
        match self.chunks {
            Some(c) => write!(f, ", {c} chunks"),
            None => Ok(()),
        }
    }
}

/// Elements of each PE's a, b, out and side buffers for `op` over `np`
/// PEs (see [`Matmul`]).
fn lens(op: Op, m: usize, n: usize, k: usize, np: usize) -> [usize; 4] {
    let rows = m.div_ceil(np);
    match op {
        Op::AgMatmul => [m * k, k * n, m * n, rows * k],
        _ => [m * k, k * n, rows * n, reduce_scatter_workspace_len(m, n)],
    }
}

/// The symmetric heap the selected overlapped matmuls take over `np` PEs,
/// in the widest dtype: the larger op's buffers (they run one after the
/// other).
pub(super) fn heap_bytes(args: &Args, np: usize) -> usize {
    let elem = if args.dtype.contains(&Dtype::F32) { size_of::<f32>() } else { size_of::<f16>() };
    let (m, n, k) = (args.m as usize, args.n as usize, args.k as usize);
    let ops = OPS.into_iter().filter(|op| op.selected_by(&args.op));
    ops.map(|op| lens(op, m, n, k, np).iter().sum::<usize>().saturating_mul(elem)).max().unwrap_or(0)
}

/// Sequential's time over `row`'s (same op, dtype, m, n and k).
pub(super) fn vs_sequential(row: &Row, rows: &[Row]) -> Option<f64> {
    let m = row.matmul?;
    let same = |r: &&Row| {
        r.imp == Imp::Sequential
            && (r.op, r.dtype) == (row.op, row.dtype)
            && r.matmul.is_some_and(|s| (s.m, s.n, s.k) == (m.m, m.n, m.k))
    };
    Some(rows.iter().find(same)?.time_us / row.time_us)
}

/// One table per op, dtype and shape.
pub(super) fn print_tables(rows: &[Row], n: usize) {
    let whole = |m: MatmulShape| MatmulShape { chunks: None, ..m };
    let mut sections: Vec<(Op, Option<&str>, MatmulShape)> = Vec::new();
    for r in rows {
        if let Some(m) = r.matmul.map(whole) {
            if !sections.contains(&(r.op, r.dtype, m)) {
                sections.push((r.op, r.dtype, m));
            }
        }
    }
    for (op, dtype, shape) in sections {
        let mut section: Vec<(&Row, MatmulShape)> = rows
            .iter()
            .filter_map(|r| r.matmul.filter(|&m| (r.op, r.dtype, whole(m)) == (op, dtype, shape)).map(|m| (r, m)))
            .collect();
        section.sort_by_key(|(r, m)| (r.imp, m.chunks));
        println!("\n## {} {} eager ({shape}, over {n} PEs)", op.name(), dtype.unwrap_or("-"));
        println!("{:<13}{:>7}{:>7}{:>12}{:>10}{:>15}", "impl", "chunks", "size", "time_us", "TFLOP/s", "vs_sequential");
        for (r, m) in section {
            let chunks = m.chunks.map_or("-".into(), |c| c.to_string());
            let tflops = Some(m.flops() / (r.time_us * 1e6));
            let (imp, size, t) = (r.imp.name(), human(r.bytes), r.time_us);
            println!("{imp:<13}{chunks:>7}{size:>7}{t:>12.2}{}{}", cell(tflops, 10), cell(vs_sequential(r, rows), 15));
        }
    }
}

/// The element types of the overlapped matmuls.
pub(super) trait Real: Value {
    /// ‖got − sequential‖ / ‖sequential‖ allowed on real inputs.
    const TOL: f64;
    /// `x` rounded to this type (to nearest, ties to even).
    fn round(x: f32) -> Self;
    fn widen(self) -> f32;
}

impl Real for f32 {
    const TOL: f64 = 1.0 / (1 << 16) as f64;
    fn round(x: f32) -> f32 {
        x
    }
    fn widen(self) -> f32 {
        self
    }
}

impl Real for f16 {
    const TOL: f64 = 1.0 / (1 << 10) as f64;
    fn round(x: f32) -> f16 {
        f16::from_f32(x)
    }
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

impl Real for bf16 {
    const TOL: f64 = 1.0 / (1 << 7) as f64;
    fn round(x: f32) -> bf16 {
        bf16::from_f32(x)
    }
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// Element `i` of input matrix `which` (0: a or the shard, 1: b) of PE `pe`.
type Draw = fn(u64, u64, usize, usize) -> f32;

fn key(seed: u64, which: u64, pe: usize, i: usize) -> u64 {
    mix(seed ^ mix(which << 56 ^ (pe as u64) << 40 ^ i as u64))
}

/// -1, 0 or 1.
fn small(seed: u64, which: u64, pe: usize, i: usize) -> f32 {
    (key(seed, which, pe, i) % 3) as f32 - 1.0
}

/// A real in [-1, 1) with 24 random bits.
fn real(seed: u64, which: u64, pe: usize, i: usize) -> f32 {
    (key(seed, which, pe, i) >> 40) as f32 / (1 << 23) as f32 - 1.0
}

/// `got`'s first element that is not finite (unwritten: the poison is
/// NaN), or, against `reference`, a distance ‖got − ref‖ / ‖ref‖ over
/// `tol`, in words.
fn close<T: Real>(got: &[T], reference: Option<&[T]>, tol: f64) -> Option<String> {
    if let Some(i) = got.iter().position(|x| !x.widen().is_finite()) {
        return Some(format!("element {i} of {} is {:?}", got.len(), got[i]));
    }
    let want = reference?;
    if want.len() != got.len() {
        return Some(format!("{} elements where {} were expected", got.len(), want.len()));
    }
    let (mut diff, mut norm) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        let (g, w) = (f64::from(g.widen()), f64::from(w.widen()));
        diff += (g - w) * (g - w);
        norm += w * w;
    }
    let rel = if diff == 0.0 { 0.0 } else { (diff / norm).sqrt() };
    (rel > tol).then(|| format!("‖got − sequential‖ / ‖sequential‖ is {rel:.3e}, over {tol:.3e}"))
}

/// One op's problem on this PE, and what the host expects of it.
#[derive(Clone, Copy, Debug)]
struct Problem {
    op: Op,
    m: usize,
    n: usize,
    k: usize,
    np: usize,
    me: usize,
}

impl Problem {
    fn new(ctx: &Context, op: Op, args: &Args) -> Res<Problem> {
        let (np, me) = (ctx.n_pes(), ctx.my_pe());
        let (m, n, k) = (args.m as usize, args.n as usize, args.k as usize);
        match m % np {
            0 => Ok(Problem { op, m, n, k, np, me }),
            _ => Err(format!("--m {m} is not a multiple of the {np} PEs").into()),
        }
    }

    fn shape(&self, chunks: Option<usize>) -> MatmulShape {
        MatmulShape { m: self.m, n: self.n, k: self.k, chunks }
    }

    /// Rows and columns to check of `imp`'s output: each PE block's first
    /// and last row and four pseudo-random ones, each at the first, the
    /// last and a pseudo-random column.
    fn sample(&self, seed: u64, imp: Imp) -> Vec<(usize, usize)> {
        let (rows, blocks) = match (self.op, imp) {
            (Op::MatmulRs, i) if i != Imp::GemmOnly => (self.m / self.np, 1),
            _ => (self.m, self.np),
        };
        let per = rows / blocks;
        let pick = |salt: u64, len: usize| (mix(seed ^ salt) % len as u64) as usize;
        let mut at: Vec<usize> = (0..blocks).flat_map(|b| [b * per, (b + 1) * per - 1]).collect();
        at.extend((0..4).map(|i| pick(i, rows)));
        at.sort_unstable();
        at.dedup();
        at.into_iter().flat_map(|r| [(r, 0), (r, self.n - 1), (r, pick(!(r as u64), self.n))]).collect()
    }

    /// Element (r, kk) of the `m × k` that PE `pe` multiplies, on the exact
    /// inputs: ag_matmul's gathered a (row r is row r mod m / np of PE
    /// r / (m / np)'s shard), matmul_rs's a of PE `pe`.
    fn a_at(&self, seed: u64, pe: usize, r: usize, kk: usize) -> f32 {
        match self.op {
            Op::AgMatmul => {
                let rows = self.m / self.np;
                small(seed, 0, r / rows, (r % rows) * self.k + kk)
            }
            _ => small(seed, 0, pe, r * self.k + kk),
        }
    }

    /// Row r of PE `pe`'s a times column c of its b, in f32 (exact).
    fn dot(&self, seed: u64, pe: usize, r: usize, c: usize) -> f32 {
        (0..self.k).fold(0.0, |acc, kk| acc + self.a_at(seed, pe, r, kk) * small(seed, 1, pe, kk * self.n + c))
    }

    /// What `imp` must write at (r, c) of its output on the exact inputs:
    /// `a · b` for ag_matmul and gemm_only; for matmul_rs the PEs' `a · b`,
    /// each rounded, summed in f32 in PE order, rounded (as the device).
    fn want<T: Real>(&self, seed: u64, imp: Imp, r: usize, c: usize) -> T {
        if self.op == Op::AgMatmul || imp == Imp::GemmOnly {
            return T::round(self.dot(seed, self.me, r, c));
        }
        let row = self.me * (self.m / self.np) + r;
        T::round((0..self.np).fold(0.0, |acc, pe| acc + T::round(self.dot(seed, pe, row, c)).widen()))
    }

    /// What [`Matmul::checked`] must read on the exact inputs.
    fn expected<T: Real>(&self, seed: u64, imp: Imp, at: &[(usize, usize)]) -> Vec<T> {
        let p = *self;
        let mut want: Vec<T> = match p.op == Op::AgMatmul && imp != Imp::GemmOnly {
            true => (0..p.m * p.k).into_par_iter().map(|i| T::round(p.a_at(seed, 0, i / p.k, i % p.k))).collect(),
            false => Vec::new(),
        };
        want.extend(at.iter().map(|&(r, c)| p.want::<T>(seed, imp, r, c)));
        want
    }
}

/// One op's symmetric buffers.
struct Matmul<'a, T: Real> {
    ctx: &'a Context,
    p: Problem,
    /// ag_matmul: a_out, the gathered `m × k`; matmul_rs: a, `m × k`.
    a: SymmetricBuffer<T>,
    /// `k × n`.
    b: SymmetricBuffer<T>,
    /// ag_matmul: `m × n`; matmul_rs: `m / np × n`.
    out: SymmetricBuffer<T>,
    /// ag_matmul: this PE's shard, `m / np × k`; matmul_rs: the workspace.
    side: SymmetricBuffer<T>,
}

impl<'a, T: Real> Matmul<'a, T> {
    /// # Collective
    fn new(ctx: &'a Context, p: Problem) -> Res<Self> {
        let lens = lens(p.op, p.m, p.n, p.k, p.np);
        let need = lens.iter().sum::<usize>() * size_of::<T>();
        let heap = |e| format!("{e}; these rows need {} per PE", human(need));
        let [a, b, out, side] = lens.map(|len| ctx.alloc::<T>(len).map_err(heap));
        Ok(Matmul { ctx, p, a: a?, b: b?, out: out?, side: side? })
    }

    /// The rows' `bytes`: one PE's shard (ag_matmul) or output (matmul_rs).
    fn block_bytes(&self) -> usize {
        let p = &self.p;
        let cols = if p.op == Op::AgMatmul { p.k } else { p.n };
        p.m / p.np * cols * size_of::<T>()
    }

    /// This PE's inputs: the shard (ag_matmul) or a, and b, from `draw`.
    fn write_inputs(&self, seed: u64, draw: Draw, s: &Stream) -> Res {
        let a = if self.p.op == Op::AgMatmul { &self.side } else { &self.a };
        let me = self.p.me;
        let fill = |which: u64, len: usize| -> Vec<T> {
            (0..len).into_par_iter().map(|i| T::round(draw(seed, which, me, i))).collect()
        };
        a.copy_from_host(&fill(0, a.len()), s)?;
        self.b.copy_from_host(&fill(1, self.b.len()), s)?;
        Ok(())
    }

    /// One run of `imp` (`chunks`: the overlapped ones'); gemm_only runs
    /// on `alone`, a team of this PE only.
    fn run(&self, imp: Imp, chunks: Option<usize>, alone: Option<&Team>, s: &Stream) -> Res {
        let comm = match imp {
            Imp::OverlapSm => OverlapComm::Sm,
            Imp::OverlapCe => OverlapComm::CopyEngine,
            Imp::GemmOnly => return self.gemm_only(alone.ok_or("gemm_only needs a team of one PE")?, s),
            _ => OverlapComm::Sequential,
        };
        let (how, k) = (Overlap { comm, chunks: chunks.unwrap_or(1) }, self.p.k);
        match self.p.op {
            Op::AgMatmul => self.ctx.all_gather_matmul(&self.a, &self.out, &self.side, &self.b, k, how, s)?,
            _ => self.ctx.matmul_reduce_scatter(&self.out, &self.a, &self.b, &self.side, k, how, s)?,
        }
        Ok(())
    }

    /// The op's GEMM alone, `a · b` into [`Matmul::gemm_out`]:
    /// all_gather_matmul on `alone` with a as this PE's own shard, in
    /// place, so nothing moves. In ag_matmul, a is the a_out that the run
    /// before gathered.
    fn gemm_only(&self, alone: &Team, s: &Stream) -> Res {
        let how = Overlap::new(OverlapComm::Sequential);
        alone.all_gather_matmul(&self.a, self.gemm_out(), &self.a, &self.b, self.p.k, how, s)?;
        Ok(())
    }

    /// gemm_only's `m × n` output: out (ag_matmul) or the workspace's start.
    fn gemm_out(&self) -> SymSlice<'_, T> {
        match self.p.op {
            Op::AgMatmul => self.out.slice(..),
            _ => self.side.slice(..self.p.m * self.p.n),
        }
    }

    /// Poisons what `imp` writes.
    fn poison(&self, bench: &Bench<'_>, imp: Imp) -> Res {
        match (self.p.op, imp) {
            (Op::AgMatmul, Imp::GemmOnly) => bench.poison(&self.out, self.out.len()),
            (Op::AgMatmul, _) => {
                bench.poison(&self.a, self.a.len())?;
                bench.poison(&self.out, self.out.len())
            }
            (_, Imp::GemmOnly) => bench.poison(&self.side, self.p.m * self.p.n),
            _ => bench.poison(&self.out, self.out.len()),
        }
    }

    /// All that `imp` writes: a_out then out (ag_matmul), or out; gemm_only's output.
    fn outputs(&self, imp: Imp, s: &Stream) -> Res<Vec<T>> {
        if imp == Imp::GemmOnly {
            return Ok(self.gemm_out().copy_to_host(s)?);
        }
        let mut all = if self.p.op == Op::AgMatmul { self.a.copy_to_host(s)? } else { Vec::new() };
        all.extend(self.out.copy_to_host(s)?);
        Ok(all)
    }

    /// What the host checks of `imp`'s output: ag_matmul's a_out whole
    /// (but for gemm_only), then the elements at `at`.
    fn checked(&self, imp: Imp, at: &[(usize, usize)], s: &Stream) -> Res<Vec<T>> {
        let gathered = self.p.op == Op::AgMatmul && imp != Imp::GemmOnly;
        let mut got = if gathered { self.a.copy_to_host(s)? } else { Vec::new() };
        let out = match imp {
            Imp::GemmOnly => self.gemm_out().copy_to_host(s)?,
            _ => self.out.copy_to_host(s)?,
        };
        got.extend(at.iter().map(|&(r, c)| out[r * self.p.n + c]));
        Ok(got)
    }
}

impl Bench<'_> {
    /// The overlapped matmuls' rows of `ops`, in every dtype.
    pub(super) fn overlap(&self, ops: &[Op]) -> Res<Vec<Row>> {
        let mut rows = Vec::new();
        for &op in ops {
            for dtype in self.dtypes(op) {
                rows.extend(match dtype {
                    Dtype::F32 => self.matmul_rows::<f32>(op)?,
                    Dtype::F16 => self.matmul_rows::<f16>(op)?,
                    Dtype::Bf16 => self.matmul_rows::<bf16>(op)?,
                });
            }
        }
        Ok(rows)
    }

    /// A team of this PE alone, for gemm_only: `None` (noted) where none
    /// can be made.
    ///
    /// # Collective
    fn alone(&self) -> Option<Team> {
        let world = self.ctx.world();
        let mut mine = None;
        for pe in 0..self.ctx.n_pes() {
            match world.split_strided(pe, 1, 1) {
                Ok(team) => mine = mine.or(team),
                Err(e) => {
                    if self.ctx.my_pe() == 0 {
                        note(format_args!("gemm_only rows skipped: no team of one PE: {e}"));
                    }
                    return None;
                }
            }
        }
        mine
    }

    fn matmul_rows<T: Real>(&self, op: Op) -> Res<Vec<Row>> {
        let (me, s) = (self.ctx.my_pe(), &self.s);
        let mut rows = Vec::new();
        if ![Imp::Sequential, Imp::OverlapSm, Imp::OverlapCe, Imp::GemmOnly].iter().any(|&i| self.runs(i, op, 0)) {
            return Ok(rows);
        }
        let p = Problem::new(self.ctx, op, self.args)?;
        // Every PE fails alike (the same allocator): skip them all.
        let mm = match Matmul::<T>::new(self.ctx, p) {
            Ok(mm) => mm,
            Err(e) => {
                if me == 0 {
                    note(format_args!("{} {} rows skipped: {e}", op.name(), T::NAME));
                }
                return Ok(rows);
            }
        };
        let alone = if self.runs(Imp::GemmOnly, op, 0) { self.alone() } else { None };
        // In timing order; gemm_only last (in ag_matmul it multiplies the
        // a_out the run before it gathered).
        let mut cases: Vec<(Imp, Option<usize>)> = Vec::new();
        if self.runs(Imp::Sequential, op, 0) {
            cases.push((Imp::Sequential, None));
        }
        let mut chunks: Vec<usize> = Vec::new();
        for c in self.args.chunks.iter().map(|&c| c as usize) {
            if !chunks.contains(&c) {
                chunks.push(c);
            }
        }
        for &c in &chunks {
            for imp in [Imp::OverlapSm, Imp::OverlapCe].into_iter().filter(|&i| self.runs(i, op, 0)) {
                cases.push((imp, Some(c)));
            }
        }
        if alone.is_some() {
            cases.push((Imp::GemmOnly, None));
        }
        let alone = alone.as_ref();
        let bytes = mm.block_bytes();
        let base = Case::<T> {
            op,
            imp: Imp::Sequential,
            dtype: Some(T::NAME),
            bytes,
            run: &|| mm.run(Imp::Sequential, None, None, s),
            poison: &|| mm.poison(self, Imp::Sequential),
            read: &|| mm.outputs(Imp::Sequential, s),
            want: &[],
            moe: None,
            splits: None,
            matmul: Some(mm.p.shape(None)),
            layer: None,
        };

        // The exact inputs: sequential against the host, the others against it.
        let exact = seed(op, T::NAME, mix(mix(mix(p.m as u64) ^ p.n as u64) ^ p.k as u64) as usize);
        mm.write_inputs(exact, small, s)?;
        let at = p.sample(exact, Imp::Sequential);
        let want = p.expected::<T>(exact, Imp::Sequential, &at);
        let reference = Case { read: &|| mm.checked(Imp::Sequential, &at, s), want: &want, ..base };
        if !self.check_once(&reference)? {
            if me == 0 {
                note(format_args!("{}: sequential, the reference, is wrong: no rows", op.name()));
            }
            return Ok(rows);
        }
        let sequential = mm.outputs(Imp::Sequential, s)?;
        let mut passed = Vec::with_capacity(cases.len());
        for &(imp, chunks) in &cases {
            let ok = match imp {
                Imp::Sequential => true,
                Imp::GemmOnly => {
                    let at = p.sample(exact, imp);
                    let want = p.expected::<T>(exact, imp, &at);
                    self.check_once(&Case {
                        imp,
                        run: &|| mm.run(imp, chunks, alone, s),
                        poison: &|| mm.poison(self, imp),
                        read: &|| mm.checked(imp, &at, s),
                        want: &want,
                        ..base
                    })?
                }
                _ => self.check_once(&Case {
                    imp,
                    run: &|| mm.run(imp, chunks, alone, s),
                    poison: &|| mm.poison(self, imp),
                    want: &sequential,
                    matmul: Some(mm.p.shape(chunks)),
                    ..base
                })?,
            };
            passed.push(ok);
        }

        // Timed on reals; the sequential result on them is the reference.
        mm.write_inputs(mix(exact ^ 0x7265_616c), real, s)?;
        let on_reals = (|| {
            (base.poison)()?;
            self.ctx.barrier_all(s)?;
            (base.run)()?;
            (base.read)()
        })();
        let (sequential, found) = match on_reals {
            Ok(out) => {
                let found = close(&out, None, T::TOL);
                (out, Ok(found))
            }
            Err(e) => (Vec::new(), Err(e)),
        };
        if !self.settle(&base, false, found)? {
            return Ok(rows);
        }
        for (&(imp, chunks), _) in cases.iter().zip(&passed).filter(|(_, &ok)| ok) {
            let c = Case {
                imp,
                run: &|| mm.run(imp, chunks, alone, s),
                poison: &|| mm.poison(self, imp),
                matmul: Some(mm.p.shape(chunks)),
                ..base
            };
            let timed = (c.poison)().and_then(|()| self.time(bytes, || Ok(self.ctx.barrier_all(s)?), c.run));
            let reference = (imp != Imp::GemmOnly).then_some(&sequential[..]);
            let after = timed
                .as_ref()
                .map_err(|e| e.to_string().into())
                .and_then(|_| Ok(close(&mm.outputs(imp, s)?, reference, T::TOL)));
            if self.settle(&c, false, after)? {
                if let Ok(t) = timed {
                    self.keep(&mut rows, c.row(false, t))?;
                }
            }
        }
        Ok(rows)
    }
}
