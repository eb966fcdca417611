//! The suite's shared pieces: the per-PE environment, deterministic random
//! payloads and dtype iteration.

use cudarc::driver::CudaStream;
use shmem::{bf16, f16, Context, Element, ReduceOp, Stream, SymmetricBuffer, Team};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Why a test does not apply to this run: the backend or the world size it
/// needs. A test returns it, as its error, before anything collective; the
/// harness then reports the test as ignored, with this reason, once every
/// PE has said the same (see `run_one`).
#[derive(Debug)]
pub struct NotApplicable(pub String);

impl std::fmt::Display for NotApplicable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotApplicable {}

/// This PE's CUDA stream on the gpu backend; elsewhere the test does not
/// apply. Every PE runs one backend (`init` makes sure), so every PE
/// decides the same.
pub fn needs_gpu(env: &Env) -> Result<&Arc<CudaStream>, NotApplicable> {
    env.s.cuda_stream().ok_or_else(|| {
        let backend = format!("{:?}", env.ctx.backend()).to_lowercase();
        NotApplicable(format!("needs the gpu backend; this run is on the {backend} backend"))
    })
}

/// Where a test names a form of the gpu backend (`form`, a kernel or a
/// setting of its kernels) that the host backend, which takes one form
/// whatever the settings, does not have: there the test does not apply,
/// rather than pass without running what it names.
pub fn gpu_form(env: &Env, form: &str) -> Result<(), NotApplicable> {
    match env.s.cuda_stream() {
        Some(_) => Ok(()),
        None => {
            Err(NotApplicable(format!("names {form}, a form of the gpu backend; the host backend ignores the setting")))
        }
    }
}

/// Whether the world has at least `pes` PEs; if not, the test does not
/// apply.
pub fn needs_pes(env: &Env, pes: usize) -> Result<(), NotApplicable> {
    match env.n() {
        n if n >= pes => Ok(()),
        n => Err(NotApplicable(format!("needs {pes} PEs or more; this world has {n} PE(s)"))),
    }
}

/// The error of a PE whose MoE call on the device (an eager all-to-all-v,
/// `dispatch_on_device`, `combine_on_device`) another PE's call makes fail
/// (their calls differ, or the other PE's own arguments failed): on the
/// host backend, the call's own; on the gpu backend, whose kernels agree
/// on an eager call on the device and skip it, the call succeeds and the
/// stream's next synchronisation reports it (or the call itself, where
/// its kernel had run by the time it returned). Either way exactly that, a
/// [`shmem::Error::CollectiveMismatch`].
pub fn deferred_mismatch(env: &Env, r: shmem::Result<()>) -> shmem::Error {
    let e = match (env.ctx.backend(), r) {
        (shmem::BackendKind::Gpu, Ok(())) => match env.s.synchronize() {
            Err(e) => e,
            Ok(()) => panic!("expected a collective mismatch from the synchronisation after the call"),
        },
        (_, Err(e)) => e,
        (_, Ok(())) => panic!("expected a collective mismatch, but the call succeeded"),
    };
    assert!(matches!(e, shmem::Error::CollectiveMismatch(_)), "expected a collective mismatch, got the error: {e}");
    e
}

/// How long any single wait may take inside the suite before it fails
/// (a hang becomes a failure): `SHMEM_TEST_WAIT_TIMEOUT` seconds, default 120.
pub fn suite_wait_timeout() -> Result<Duration, String> {
    let Ok(v) = std::env::var("SHMEM_TEST_WAIT_TIMEOUT") else { return Ok(Duration::from_secs(120)) };
    v.trim()
        .parse()
        .ok()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| format!("SHMEM_TEST_WAIT_TIMEOUT={v:?}: expected a number of seconds"))
}

/// What every test gets: the context, a stream, and fresh random seeds
/// that all PEs agree on.
pub struct Env {
    pub ctx: Context,
    pub s: Stream,
    seed: u64,
    counter: Cell<u64>,
    harness: Team,
    flag: SymmetricBuffer<u32>,
    flags: SymmetricBuffer<u32>,
}

/// SplitMix64: a small, well-known mixer. Written here because the
/// project's dependency list has no random-number crate.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Env {
    pub fn new(ctx: Context) -> shmem::Result<Env> {
        let s = ctx.stream();
        let n = ctx.n_pes();
        // A team of its own for the harness's agreement step.
        let harness = ctx.world().split_strided(0, 1, n)?.expect("every PE is in the harness team");
        let flag = ctx.alloc_zeroed::<u32>(1)?;
        let flags = ctx.alloc_zeroed::<u32>(n)?;
        let seed_buf = ctx.alloc_zeroed::<u64>(1)?;
        if ctx.my_pe() == 0 {
            let seed = std::env::var("SHMEM_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
            });
            eprintln!("spmd suite on {n} PE(s): seed {seed} (SHMEM_TEST_SEED={seed} repeats it)");
            seed_buf.copy_from_host(&[seed], &s)?;
        }
        ctx.barrier_all(&s)?;
        let seed = ctx.g(&seed_buf, 0, 0, &s)?;
        ctx.barrier_all(&s)?;
        drop(seed_buf);
        Ok(Env { ctx, s, seed, counter: Cell::new(0), harness, flag, flags })
    }

    /// The run's seed (`SHMEM_TEST_SEED` repeats the run).
    pub fn suite_seed(&self) -> u64 {
        self.seed
    }

    /// A seed for one use, the same on every PE (tests run in the same order
    /// everywhere), different for every call.
    pub fn fresh_seed(&self) -> u64 {
        let c = self.counter.get();
        self.counter.set(c + 1);
        mix(self.seed ^ mix(c))
    }

    /// Host threads this PE may use: its share of the node's cores.
    pub fn threads(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        (cores / self.ctx.local_size().max(1)).max(1)
    }

    pub fn me(&self) -> usize {
        self.ctx.my_pe()
    }

    pub fn n(&self) -> usize {
        self.ctx.n_pes()
    }

    /// Every PE's `word` (the outcome of its test), by PE, as agreed by all.
    pub fn agree(&self, word: u32) -> shmem::Result<Vec<u32>> {
        self.flag.copy_from_host(&[word], &self.s)?;
        self.harness.all_gather(&self.flags, &self.flag, &self.s)?;
        self.flags.copy_to_host(&self.s)
    }

    /// Frees the harness's buffers and finalizes.
    pub fn finish(self) -> shmem::Result<()> {
        let Env { ctx, flag, flags, harness, .. } = self;
        drop((flag, flags, harness));
        ctx.finalize()
    }
}

/// Element types with what the tests need: raw bits (to compare exactly,
/// NaNs included), random payloads, and random inputs for reductions.
pub trait TestElem: Element {
    const OPS: &'static [ReduceOp];
    fn from_bits(bits: u64) -> Self;
    fn bits(self) -> u64;
    /// A reduction input drawn from the random bits `r`. Integers: all bits
    /// random (sums and products wrap). Floats: random sign and mantissa,
    /// exponent in ±6 (±2 for products), so four PEs' results stay finite
    /// and normal, and never zero (the sign of a zero minimum is unspecified).
    fn random(r: u64, op: ReduceOp) -> Self;
    /// Floats: the unit roundoff (half the distance from 1 to the next
    /// value); integers, whose arithmetic is exact: 0.
    const ROUNDOFF: f64 = 0.0;
    /// The value as f64 (floats; integers are never asked).
    fn real(self) -> f64 {
        0.0
    }
    /// The float nearest `x` (floats; integers are never asked).
    fn from_real(_x: f64) -> Self {
        unreachable!("integers are never asked for a float value")
    }
}

const FLOAT_OPS: &[ReduceOp] = &[ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Prod];
const INT_OPS: &[ReduceOp] = &ReduceOp::ALL;

fn random_float(r: u64, op: ReduceOp) -> f64 {
    // Built from bits: a random sign and mantissa, a biased exponent.
    let span = if op == ReduceOp::Prod { 2 } else { 6 };
    let exponent = 1023 - span + (r & 0xff) % (2 * span + 1);
    f64::from_bits((r >> 8 & 1) << 63 | exponent << 52 | r >> 12)
}

macro_rules! float_elem {
    ($t:ty, $bits:ty, $from:expr, $to:expr, $roundoff:expr) => {
        impl TestElem for $t {
            const OPS: &'static [ReduceOp] = FLOAT_OPS;
            const ROUNDOFF: f64 = $roundoff;
            fn real(self) -> f64 {
                <$t as Real>::to_f64(self)
            }
            fn from_real(x: f64) -> Self {
                <$t as Real>::from_f64(x)
            }
            fn from_bits(bits: u64) -> Self {
                $from(bits as $bits)
            }
            fn bits(self) -> u64 {
                $to(self) as u64
            }
            fn random(r: u64, op: ReduceOp) -> Self {
                <$t as Real>::from_f64(random_float(r, op))
            }
        }
    };
}

/// The float element types as and from f64 (exact where the value is).
pub trait Real: TestElem {
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
}
impl Real for f32 {
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}
impl Real for f64 {
    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
}
impl Real for f16 {
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
}
impl Real for bf16 {
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
}

float_elem!(f32, u32, f32::from_bits, f32::to_bits, f32::EPSILON as f64 / 2.0);
float_elem!(f64, u64, f64::from_bits, f64::to_bits, f64::EPSILON / 2.0);
float_elem!(f16, u16, f16::from_bits, f16::to_bits, f16::EPSILON.to_f64_const() / 2.0);
float_elem!(bf16, u16, bf16::from_bits, bf16::to_bits, bf16::EPSILON.to_f64_const() / 2.0);

macro_rules! int_elem {
    ($t:ty) => {
        impl TestElem for $t {
            const OPS: &'static [ReduceOp] = INT_OPS;
            fn from_bits(bits: u64) -> Self {
                bits as $t
            }
            fn bits(self) -> u64 {
                self as u64
            }
            fn random(r: u64, _op: ReduceOp) -> Self {
                r as $t
            }
        }
    };
}
int_elem!(i32);
int_elem!(i64);
int_elem!(u32);
int_elem!(u64);

/// Moved only: no reduction takes 8-bit types (`bytes.rs` checks that
/// each is refused).
impl TestElem for u8 {
    const OPS: &'static [ReduceOp] = &[];
    fn from_bits(bits: u64) -> Self {
        bits as u8
    }
    fn bits(self) -> u64 {
        self as u64
    }
    fn random(r: u64, _op: ReduceOp) -> Self {
        r as u8
    }
}

/// The payload element `i` of PE `pe` for a given seed: random bits that
/// differ by sender and index, so a wrong source or offset shows.
pub fn payload<T: TestElem>(seed: u64, pe: usize, i: usize) -> T {
    T::from_bits(mix(seed ^ mix((pe as u64) << 40 ^ i as u64)))
}

/// `len` payload elements of PE `pe`.
pub fn payloads<T: TestElem>(seed: u64, pe: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| payload(seed, pe, i)).collect()
}

/// A value no test writes on purpose: what outputs are poisoned with.
pub fn poison<T: TestElem>() -> T {
    T::from_bits(0x5a5a_5a5a_5a5a_5a5a)
}

/// Asserts bitwise equality, naming the first differing index.
pub fn assert_bits_eq<T: TestElem>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].bits() != want[i].bits()) {
        panic!("{what}: element {i} of {} is {:?}, expected {:?}", got.len(), got[i], want[i]);
    }
}

/// Runs a generic test body for every element type (the arguments are
/// evaluated once per type).
#[macro_export]
macro_rules! each_dtype {
    ($f:ident, $($arg:expr),+) => {{
        $crate::each_dtype!(@one $f, f32, $($arg),+);
        $crate::each_dtype!(@one $f, f64, $($arg),+);
        $crate::each_dtype!(@one $f, shmem::f16, $($arg),+);
        $crate::each_dtype!(@one $f, shmem::bf16, $($arg),+);
        $crate::each_dtype!(@one $f, i32, $($arg),+);
        $crate::each_dtype!(@one $f, i64, $($arg),+);
        $crate::each_dtype!(@one $f, u32, $($arg),+);
        $crate::each_dtype!(@one $f, u64, $($arg),+);
        $crate::util::TestResult::Ok(())
    }};
    (@one $f:ident, $t:ty, $($arg:expr),+) => {
        if $crate::util::dtype_selected(<$t as shmem::Element>::DTYPE) {
            $f::<$t>($($arg),+)?;
        }
    };
}

/// `SHMEM_TEST_DTYPES` (comma-separated names, such as `f32,bf16,i64`):
/// the element types the per-dtype tests run; unset, every one. For runs
/// that cannot afford the whole matrix (the sanitizers on the box, where
/// one of each element size covers every access pattern of the kernels).
pub fn dtype_selected(d: shmem::DType) -> bool {
    static ON: std::sync::OnceLock<Option<Vec<String>>> = std::sync::OnceLock::new();
    let names = ON.get_or_init(|| {
        let v = std::env::var("SHMEM_TEST_DTYPES").ok().filter(|v| !v.is_empty())?;
        let names: Vec<String> = v.split(',').map(|n| n.trim().to_ascii_lowercase()).collect();
        let known = shmem::DType::ALL.map(shmem::DType::name);
        for n in &names {
            assert!(known.contains(&n.as_str()), "SHMEM_TEST_DTYPES={v}: {n:?} is not one of {known:?}");
        }
        Some(names)
    });
    names.as_ref().is_none_or(|names| names.iter().any(|n| n == d.name()))
}

/// `out[i] = f(i)`, on up to `threads` threads when `out` is long (the
/// references of the big cases).
pub fn par_fill<T: Send>(out: &mut [T], threads: usize, f: impl Fn(usize) -> T + Sync) {
    let chunk = out.len().div_ceil(threads.max(1)).max(1 << 16);
    let fill = |c: usize, part: &mut [T]| part.iter_mut().enumerate().for_each(|(i, o)| *o = f(c * chunk + i));
    let fill = &fill;
    let mut parts = out.chunks_mut(chunk).enumerate();
    let first = parts.next();
    std::thread::scope(|scope| {
        for (c, part) in parts {
            scope.spawn(move || fill(c, part));
        }
        if let Some((c, part)) = first {
            fill(c, part);
        }
    });
}

/// Asserts that `r` failed with an error matching `pat`.
#[macro_export]
macro_rules! assert_err {
    ($r:expr, $pat:pat) => {{
        match $r {
            Err(e @ $pat) => e,
            Err(e) => panic!("expected {}, got the error: {e}", stringify!($pat)),
            Ok(_) => panic!("expected {}, but the call succeeded", stringify!($pat)),
        }
    }};
}

/// Points stdout at /dev/null (PEs other than 0 keep the report quiet).
pub fn silence_stdout() {
    use std::os::fd::AsRawFd;
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: both descriptors are valid; dup2 replaces fd 1 atomically.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}
