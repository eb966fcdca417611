//! Checks shmem's MoE dispatch, [`shmem::Context::all_to_all_v_2d`], against
//! PyTorch's `torch.ops.symm_mem.all_to_all_vdev_2d`, element for element.
//!
//! `ci/torch_a2av_2d.py --out DIR` (under `torchrun`, where torch and its
//! NVSHMEM backend are) runs torch's op on cases of its own and writes each
//! rank's splits, input and result into DIR, with `cases.json` describing
//! the cases. This example runs ours on each PE with the same input and
//! splits, and compares: `out_splits_offsets` exactly, and bit for bit every
//! output row that torch's `out_splits_offsets` names as data. Both outputs
//! start poisoned (all-ones bytes); torch leaves padding rows unwritten and
//! so must we.
//!
//! ```text
//! shmemrun -n 2 moe_torch_check DIR          # as many PEs as torch had ranks
//! ```
//!
//! (Started on its own it launches itself with that many PEs.) PE 0 prints
//! `case K: ok (…)` per case where every PE matches; a PE that differs
//! prints `case K: PE p: …` with the first difference. The exit status is
//! non-zero if any case differs.

use shmem::launch::Launch;
use shmem::{bf16, Context, Element, Error, ReduceOp, Stream};
use std::path::{Path, PathBuf};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: shmemrun -n N moe_torch_check DIR   (DIR written by ci/torch_a2av_2d.py --out DIR)");
        std::process::exit(2);
    };
    if !shmem::bootstrap::started_by_launcher() {
        let n = match Cases::read(&dir) {
            Ok(c) => c.n_pes,
            Err(e) => {
                eprintln!("moe_torch_check: {e}");
                std::process::exit(1);
            }
        };
        let exe = std::env::current_exe().expect("the example's own path");
        let outcome = Launch::new(n, exe).arg(&dir).kill_on_failure(true).run();
        std::process::exit(outcome.map_or(1, |o| o.exit_code()));
    }
    match run(&dir) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("moe_torch_check: {e}");
            std::process::exit(1);
        }
    }
}

/// Whether every case matched on every PE.
fn run(dir: &Path) -> Res<bool> {
    let cases = Cases::read(dir)?;
    let ctx = shmem::init()?;
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    if n != cases.n_pes {
        return Err(format!(
            "{} was written by {} ranks: run with shmemrun -n {}",
            cases.path, cases.n_pes, cases.n_pes
        )
        .into());
    }
    let s = ctx.stream();
    // One slot per PE: 1 where the case differs.
    let verdicts = ctx.alloc_zeroed::<i64>(n)?;
    let mut differ = 0;
    for case in &cases.cases {
        let found = match case.dtype.as_str() {
            "bf16" => check_case::<bf16>(&ctx, &s, dir, case)?,
            "f32" => check_case::<f32>(&ctx, &s, dir, case)?,
            other => return Err(format!("case {}: unknown dtype {other:?}", case.case).into()),
        };
        if let Some(what) = &found {
            println!("case {}: PE {me}: {what}", case.case);
        }
        let mut mine = vec![0i64; n];
        mine[me] = found.is_some() as i64;
        verdicts.copy_from_host(&mine, &s)?;
        ctx.all_reduce(&verdicts, &verdicts, ReduceOp::Sum, &s)?;
        let all = verdicts.copy_to_host(&s)?;
        if all.iter().any(|&v| v != 0) {
            differ += 1;
        } else if me == 0 {
            println!("case {}: ok ({})", case.case, case.summary());
        }
    }
    ctx.finalize()?;
    if me == 0 {
        let total = cases.cases.len();
        match differ {
            0 => println!("moe_torch_check: all {total} cases match torch {} bit for bit", cases.torch),
            d => println!("moe_torch_check: {d} of {total} cases differ from torch {}", cases.torch),
        }
    }
    Ok(differ == 0)
}

/// Runs ours on one case; `Some` with the first difference from torch.
///
/// Reads this PE's files before the first collective, so a missing file
/// ends this PE alone (and `shmemrun` the others) rather than a collective
/// half-way.
fn check_case<T: Raw>(ctx: &Context, s: &Stream, dir: &Path, case: &Case) -> Res<Option<String>> {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let m = n * case.experts_per_pe;
    let (row, rows) = (case.row_len, case.output_rows);
    let file = |suffix: &str| dir.join(format!("case{}.rank{me}.{suffix}", case.case));
    let in_splits = read_file::<i64>(&file("in_splits.i64"), m)?;
    let input = read_file::<T>(&file("input.bin"), case.input_rows * row)?;
    let torch_out = read_file::<T>(&file("out.bin"), rows * row)?;
    let torch_so = read_file::<i64>(&file("out_splits_offsets.i64"), 2 * m)?;

    let input_buf = ctx.alloc::<T>(input.len())?;
    input_buf.copy_from_host(&input, s)?;
    let splits_buf = ctx.alloc::<i64>(m)?;
    splits_buf.copy_from_host(&in_splits, s)?;
    let out_buf = ctx.alloc::<T>(rows * row)?;
    out_buf.fill(T::POISON, s)?;
    let so_buf = ctx.alloc::<i64>(2 * m)?;
    so_buf.fill(-1, s)?;
    match ctx.all_to_all_v_2d(&input_buf, &out_buf, &splits_buf, &so_buf, row, case.major_align, s) {
        Ok(()) => {}
        // No kernels on this backend: nothing to compare, in any case.
        Err(e @ Error::BackendUnavailable(_)) => return Err(e.into()),
        // Every PE has the same verdict (the op's checks are collective).
        Err(e) => return Ok(Some(format!("shmem's all_to_all_v_2d refused what torch ran: {e}"))),
    }
    let ours_so = so_buf.copy_to_host(s)?;
    let ours = out_buf.copy_to_host(s)?;
    Ok(first_difference(n, row, (&torch_so, &torch_out), (&ours_so, &ours)))
}

/// The first place where ours differs from torch: `out_splits_offsets`, then
/// the rows torch names as data, then padding rows, which must keep our
/// poison.
fn first_difference<T: Raw>(n: usize, row: usize, torch: (&[i64], &[T]), ours: (&[i64], &[T])) -> Option<String> {
    let ((torch_so, torch_out), (ours_so, ours_out)) = (torch, ours);
    let m = torch_so.len() / 2;
    // Entry k of either row is local expert k / n's chunk from PE k % n.
    let chunk = |k: usize| format!("local expert {}'s chunk from PE {}", k % m / n, k % m % n);
    let entry = |k: usize| format!("[{}][{}] ({})", k / m, k % m, chunk(k));
    if let Some(k) = (0..2 * m).find(|&k| torch_so[k] != ours_so[k]) {
        return Some(format!("out_splits_offsets{} is {}, torch has {}", entry(k), ours_so[k], torch_so[k]));
    }
    let rows = torch_out.len() / row;
    let mut data = vec![false; rows];
    for k in 0..m {
        let (len, at) = (torch_so[k], torch_so[m + k]);
        let start_len = usize::try_from(at).ok().zip(usize::try_from(len).ok());
        let Some(range) = start_len.and_then(|(a, l)| a.checked_add(l).map(|end| a..end)) else {
            return Some(format!("torch's out_splits_offsets puts {} ({len} rows) at row {at}", chunk(k)));
        };
        if range.end > rows {
            return Some(format!("torch's out_splits_offsets puts {} at rows {range:?}, past its {rows}", chunk(k)));
        }
        for r in range.clone() {
            data[r] = true;
            let cols = r * row..(r + 1) * row;
            let (want, got) = (&torch_out[cols.clone()], &ours_out[cols]);
            if let Some(c) = (0..row).find(|&c| want[c].bits() != got[c].bits()) {
                return Some(format!(
                    "output row {r} (row {} of {}), column {c}: ours {}, torch {}",
                    r - range.start,
                    chunk(k),
                    got[c].describe(),
                    want[c].describe()
                ));
            }
        }
    }
    let written = (0..rows * row).find(|&i| !data[i / row] && ours_out[i].bits() != T::POISON.bits());
    written.map(|i| {
        format!(
            "output row {} is padding (no chunk names it) but ours wrote it: column {} is {}",
            i / row,
            i % row,
            ours_out[i].describe()
        )
    })
}

/// `len` elements of a raw little-endian file, exactly.
fn read_file<T: FromLe>(path: &Path, len: usize) -> Res<Vec<T>> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() != len * T::SIZE {
        let want = len * T::SIZE;
        return Err(format!("{}: {} bytes, expected {want} ({len} × {})", path.display(), bytes.len(), T::SIZE).into());
    }
    Ok(bytes.chunks_exact(T::SIZE).map(T::from_le).collect())
}

/// What the files hold: little-endian values of `SIZE` bytes.
trait FromLe: Sized {
    const SIZE: usize;
    /// `bytes` has `SIZE` bytes.
    fn from_le(bytes: &[u8]) -> Self;
}

impl FromLe for i64 {
    const SIZE: usize = 8;
    fn from_le(bytes: &[u8]) -> Self {
        i64::from_le_bytes(bytes.try_into().expect("8 bytes"))
    }
}

impl FromLe for bf16 {
    const SIZE: usize = 2;
    fn from_le(bytes: &[u8]) -> Self {
        bf16::from_bits(u16::from_le_bytes(bytes.try_into().expect("2 bytes")))
    }
}

impl FromLe for f32 {
    const SIZE: usize = 4;
    fn from_le(bytes: &[u8]) -> Self {
        f32::from_bits(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }
}

/// The element types the script writes; compared by their bits.
trait Raw: Element + FromLe {
    /// All-ones bytes (a NaN), which no encoded input is.
    const POISON: Self;
    fn bits(self) -> u32;
    /// The bits, and what the script's encoding says they name.
    fn describe(self) -> String;
}

impl Raw for bf16 {
    const POISON: Self = bf16::from_bits(u16::MAX);
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
    fn describe(self) -> String {
        match self.to_bits() {
            u16::MAX => "0xffff (the poison: never written)".into(),
            // bits = (rank & 1) << 15 | (1 + row % 254) << 7 | col % 128
            b => format!(
                "{b:#06x} (rank {} mod 2, row {} mod 254, column {} mod 128)",
                b >> 15,
                ((b >> 7) & 0xff).wrapping_sub(1),
                b & 0x7f
            ),
        }
    }
}

impl Raw for f32 {
    const POISON: Self = f32::from_bits(u32::MAX);
    fn bits(self) -> u32 {
        self.to_bits()
    }
    fn describe(self) -> String {
        if self.to_bits() == u32::MAX {
            return "0xffffffff (the poison: never written)".into();
        }
        // value = rank · 2^19 + row · 2^6 + col % 64
        let v = self as u32;
        format!("{self} (rank {}, row {}, column {} mod 64)", v >> 19, (v >> 6) & 0x1fff, v & 63)
    }
}

/// `cases.json`: what the script ran.
struct Cases {
    path: String,
    n_pes: usize,
    torch: String,
    cases: Vec<Case>,
}

/// One case, as the script describes it.
struct Case {
    case: usize,
    dtype: String,
    row_len: usize,
    experts_per_pe: usize,
    major_align: usize,
    input_rows: usize,
    output_rows: usize,
    routing: String,
    seed: usize,
    /// Whether torch's output matched the script's own reference.
    torch_matches_reference: bool,
}

impl Cases {
    fn read(dir: &Path) -> Res<Cases> {
        let path = dir.join("cases.json");
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{shown}: {e}"))?;
        let parse = || -> Result<Cases, String> {
            let doc = Json::parse(&text)?;
            if doc.get("format")?.usize()? != 1 {
                return Err("format is not 1: this example reads version 1".into());
            }
            let case = |c: &Json| -> Result<Case, String> {
                Ok(Case {
                    case: c.get("case")?.usize()?,
                    dtype: c.get("dtype")?.str()?.to_owned(),
                    row_len: c.get("row_len")?.usize()?,
                    experts_per_pe: c.get("experts_per_pe")?.usize()?,
                    major_align: c.get("major_align")?.usize()?,
                    input_rows: c.get("input_rows")?.usize()?,
                    output_rows: c.get("output_rows")?.usize()?,
                    routing: c.get("routing")?.str()?.to_owned(),
                    seed: c.get("seed")?.usize()?,
                    torch_matches_reference: c.get("torch_matches_reference")?.bool()?,
                })
            };
            Ok(Cases {
                path: shown.clone(),
                n_pes: doc.get("n_pes")?.usize()?,
                torch: doc.get("torch")?.str()?.to_owned(),
                cases: doc.get("cases")?.array()?.iter().map(case).collect::<Result<_, _>>()?,
            })
        };
        Ok(parse().map_err(|e| format!("{shown}: {e}"))?)
    }
}

impl Case {
    fn summary(&self) -> String {
        let mut s = format!(
            "{}, row_len {}, experts per PE {}, major_align {}, {} routing, seed {}; {} input / {} output rows",
            self.dtype,
            self.row_len,
            self.experts_per_pe,
            self.major_align,
            self.routing,
            self.seed,
            self.input_rows,
            self.output_rows
        );
        if !self.torch_matches_reference {
            s += "; torch itself differs from the script's reference";
        }
        s
    }
}

/// The JSON that `cases.json` uses. A small hand parser rather than a
/// dependency: the workspace has no JSON crate, and this reads one file
/// that our own script writes.
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn parse(text: &str) -> Result<Json, String> {
        let mut p = JsonParser { s: text.as_bytes(), at: 0 };
        let v = p.value()?;
        p.space();
        if p.at != p.s.len() {
            return Err(p.error("text after the value"));
        }
        Ok(v)
    }

    fn get(&self, key: &str) -> Result<&Json, String> {
        match self {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
        .ok_or_else(|| format!("no field {key:?}"))
    }

    fn usize(&self) -> Result<usize, String> {
        match *self {
            Json::Num(x) if x >= 0.0 && x.fract() == 0.0 && x < 2f64.powi(53) => Ok(x as usize),
            _ => Err("expected a non-negative integer".into()),
        }
    }

    fn str(&self) -> Result<&str, String> {
        match self {
            Json::Str(s) => Ok(s),
            _ => Err("expected a string".into()),
        }
    }

    fn bool(&self) -> Result<bool, String> {
        match *self {
            Json::Bool(b) => Ok(b),
            _ => Err("expected true or false".into()),
        }
    }

    fn array(&self) -> Result<&[Json], String> {
        match self {
            Json::Arr(v) => Ok(v),
            _ => Err("expected an array".into()),
        }
    }
}

struct JsonParser<'a> {
    s: &'a [u8],
    at: usize,
}

impl JsonParser<'_> {
    fn error(&self, what: &str) -> String {
        format!("{what} at byte {}", self.at)
    }

    fn space(&mut self) {
        while self.s.get(self.at).is_some_and(|c| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    /// Skips `word` if it comes next.
    fn eat(&mut self, word: &str) -> bool {
        let found = self.s[self.at..].starts_with(word.as_bytes());
        if found {
            self.at += word.len();
        }
        found
    }

    fn value(&mut self) -> Result<Json, String> {
        self.space();
        match self.s.get(self.at) {
            Some(b'{') => {
                self.at += 1;
                let mut fields = Vec::new();
                self.space();
                if !self.eat("}") {
                    loop {
                        self.space();
                        let key = self.string()?;
                        self.space();
                        if !self.eat(":") {
                            return Err(self.error("expected ':'"));
                        }
                        fields.push((key, self.value()?));
                        self.space();
                        if self.eat("}") {
                            break;
                        }
                        if !self.eat(",") {
                            return Err(self.error("expected ',' or '}'"));
                        }
                    }
                }
                Ok(Json::Obj(fields))
            }
            Some(b'[') => {
                self.at += 1;
                let mut items = Vec::new();
                self.space();
                if !self.eat("]") {
                    loop {
                        items.push(self.value()?);
                        self.space();
                        if self.eat("]") {
                            break;
                        }
                        if !self.eat(",") {
                            return Err(self.error("expected ',' or ']'"));
                        }
                    }
                }
                Ok(Json::Arr(items))
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            _ if self.eat("true") => Ok(Json::Bool(true)),
            _ if self.eat("false") => Ok(Json::Bool(false)),
            _ if self.eat("null") => Ok(Json::Null),
            _ => {
                let start = self.at;
                while self.s.get(self.at).is_some_and(|c| c.is_ascii_digit() || b"+-.eE".contains(c)) {
                    self.at += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.at]).expect("ASCII");
                text.parse().map(Json::Num).map_err(|_| self.error("expected a value"))
            }
        }
    }

    fn string(&mut self) -> Result<String, String> {
        if !self.eat("\"") {
            return Err(self.error("expected a string"));
        }
        let mut out = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.at) else { return Err(self.error("unterminated string")) };
            self.at += 1;
            match c {
                b'"' => return String::from_utf8(out).map_err(|_| self.error("invalid UTF-8")),
                b'\\' => {
                    let Some(&e) = self.s.get(self.at) else { return Err(self.error("unterminated string")) };
                    self.at += 1;
                    let ch = match e {
                        b'"' | b'\\' | b'/' => e as char,
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hex = self.s.get(self.at..self.at + 4).and_then(|h| std::str::from_utf8(h).ok());
                            let code = hex.and_then(|h| u32::from_str_radix(h, 16).ok());
                            self.at += 4;
                            // Our file is ASCII; a lone surrogate becomes U+FFFD.
                            code.map(|c| char::from_u32(c).unwrap_or('\u{fffd}'))
                                .ok_or_else(|| self.error("bad \\u escape"))?
                        }
                        _ => return Err(self.error("bad escape")),
                    };
                    out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                }
                _ => out.push(c),
            }
        }
    }
}
